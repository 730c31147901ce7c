"""Removals a master orders when a segment mounts cannot be refused, so an index log that
cannot be written at that moment (its files made immutable, a failing disk) must not stop the
node: the objects leave memory at once, and their records wait, to be written ahead of the
next records the log takes (or when the node tries again), in order. Found by the chaos suite
(seed 43): the node exited on EPERM while remounting after a leader change."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvpool.storage_node.index_log import Entry
from kvpool.storage_node.object_index import DurableIndex, live_entries
from kvpool.storage_node.private_files import make_private_directory

HEADER = {"segment_id": "n1/nvme-0001", "size": 1 << 30, "tier": "nvme"}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return make_private_directory(tmp_path / "segment") / "segment.index"


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``chattr +i`` on the log: no write reaches it, root's included (the suite runs as
    root, on a file system that has the attribute)."""
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"chattr +i is needed (root, ext4 or XFS): {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def entry(key: str, generation: int, offset: int = 0) -> Entry:
    return Entry(key, offset, 4096, generation, 7)


def test_removals_an_unwritable_log_did_not_take_leave_memory_and_are_written_later(path):
    index = DurableIndex(path, HEADER)
    index.put([entry("a", 1), entry("b", 2, 4096), entry("c", 3, 8192)])
    with immutable(path):
        assert index.delete_now_or_later([entry("a", 1), entry("b", 2, 4096)]) is False
        assert [e.key for e in index.entries()] == ["c"], "gone from memory at once"
        assert index.write_pending() is False, "still unwritable"
        with pytest.raises(PermissionError):
            index.delete([entry("c", 3, 8192)])  # (an ordinary removal still fails loudly)
    assert sorted(live_entries(path)) == ["a", "b", "c"], "not on the disk yet"
    assert index.write_pending() is True
    assert sorted(live_entries(path)) == ["c"]
    index.close()
    assert sorted(e.key for e in DurableIndex(path, HEADER).entries()) == ["c"]


def test_waiting_removals_go_ahead_of_the_next_records_written(path):
    index = DurableIndex(path, HEADER)
    index.put([entry("k", 1)])
    with immutable(path):
        assert index.delete_now_or_later([entry("k", 1)]) is False
    index.put([entry("k", 5, 4096)])  # (the key put again, later: its record comes after)
    index.close()
    assert live_entries(path)["k"] == entry("k", 5, 4096)


def test_a_removal_that_could_be_written_is_written_at_once(path):
    index = DurableIndex(path, HEADER)
    index.put([entry("k", 1)])
    assert index.delete_now_or_later([entry("k", 1)]) is True
    assert live_entries(path) == {}
    index.close()
