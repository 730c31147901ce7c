"""Removals a master orders when a segment mounts cannot be refused, so an index log that
cannot be written at that moment (its files made immutable, a failing disk) must not stop the
node: the objects leave memory at once, and their records wait, to be written ahead of the
next records the log takes (or when the node tries again), in order. Found by the chaos suite
(seed 43): the node exited on EPERM while remounting after a leader change."""

from __future__ import annotations

from pathlib import Path

import pytest
from index_helpers import HEADER, entry, immutable, log_path

from kvpool.storage_node.object_index import DurableIndex, live_entries


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return log_path(tmp_path)


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
