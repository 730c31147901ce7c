"""What the tests of an NVMe segment's durable index share: a header, entries, a log in a
private directory, and a file (or directory) no write reaches."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvpool.storage_node.index_log import Entry
from kvpool.storage_node.private_files import make_private_directory

HEADER = {"segment_id": "n1/nvme-0001", "size": 1 << 30, "tier": "nvme"}


def log_path(parent: Path) -> Path:
    """Where a segment's log lies: in a private directory of its own under ``parent``."""
    return make_private_directory(parent / "segment") / "segment.index"


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``chattr +i`` on ``path``: no write reaches a file so marked, root's included, and no
    file can be made in a directory so marked (the suite runs as root, on a file system that
    has the attribute)."""
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"chattr +i is needed (root, ext4 or XFS): {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def entry(key: str, generation: int, offset: int = 0) -> Entry:
    return Entry(key, offset, 4096, generation, 7)
