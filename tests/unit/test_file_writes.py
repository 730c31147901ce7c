"""Writes cut short by the file system raise, instead of leaving a torn file behind in
silence (common/file_writes.py).

A file-size limit (RLIMIT_FSIZE) is a file system that fills at a known byte: a write
across it takes the bytes below and reports a short count; the next one fails (EFBIG). Each
case runs in a child process, which sets the limit for itself alone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

LIMIT = 100_000

PRELUDE = f"""
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (EFBIG instead of the signal's exit)
resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, resource.RLIM_INFINITY))
path = sys.argv[1]
"""


def run(body: str, path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_bare_pwrite_past_the_limit_is_short_and_says_nothing(tmp_path):
    """What the helper guards against: no error, only a count."""
    out = run(
        """
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        print(os.pwrite(fd, bytes(2 * 100_000), 0))
        """,
        tmp_path / "file",
    )
    assert out == str(LIMIT)


def test_write_all_raises_where_the_file_system_stops_taking_bytes(tmp_path):
    out = run(
        """
        from kvpool.common.file_writes import write_all
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        try:
            write_all(fd, bytes(2 * 100_000), 0)
        except OSError as error:
            print(error.strerror)
        """,
        tmp_path / "file",
    )
    assert out == "File too large"


def test_an_index_append_the_disk_cuts_short_fails_rather_than_counting_as_durable(tmp_path):
    """A Persist answered ok must have its record whole on the disk."""
    out = run(
        """
        from pathlib import Path
        from kvpool.storage_node.object_index import DurableIndex, Entry
        from kvpool.storage_node.private_files import make_private_directory
        directory = make_private_directory(Path(path))
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)  # (to open)
        index = DurableIndex(directory / "segment.index", {"segment_id": "n1/nvme-1"})
        limit = index.log_bytes + 100  # (the disk fills just past the room written ahead)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        entries = [Entry(f"key-{i:05d}-" + "k" * 200, i * 4096, 4096, i + 1) for i in range(9000)]
        try:
            index.put(entries)
            print("recorded")
        except OSError as error:
            print(error.strerror)
        """,
        tmp_path / "segment",
    )
    assert out == "File too large"
