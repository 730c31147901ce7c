"""A durable index writes the removal of an object only where its log holds the object's put
(the same key, place and generation), or may hold it: the removal of anything else changes
nothing a restart would read, so it is made with no write at all. A master forgets the
space of a put that failed (its record never reached the log, a full disk say) and repeats
Forgets; those must succeed on a log that cannot take a record, else the master sets the
space aside until the node remounts.

An append that failed and could not even be undone (zeros written over what it wrote) may
have left its records in the log: their removals are written, as for recorded puts.
(tests/integration/test_nvme_index_full_disk.py: the same on a disk that is really full.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from index_helpers import HEADER, entry, immutable, log_path

from kvpool.storage_node.object_index import DurableIndex, live_entries


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return log_path(tmp_path)


def test_removals_of_puts_the_log_never_took_succeed_on_a_log_that_takes_nothing(path):
    index = DurableIndex(path, HEADER)
    index.put([entry("a", 1), entry("b", 2, 4096)])
    before = path.read_bytes()
    with immutable(path):
        index.delete([entry("never-put", 3, 8192)])  # (its put failed before any write)
        index.delete([entry("a", 0)])  # an older generation than the one recorded
        index.delete([entry("b", 2, 8192)])  # another place than the one recorded
        assert index.delete_now_or_later([entry("never-put", 3, 8192)]) is True
        with pytest.raises(PermissionError):
            index.delete([entry("a", 1)])  # (a recorded one needs its record: fails loudly)
    assert path.read_bytes() == before, "nothing written"
    assert sorted(e.key for e in index.entries()) == ["a", "b"]
    index.close()
    assert sorted(live_entries(path)) == ["a", "b"]


def test_a_removal_of_a_recorded_put_is_durable_and_written_once(path):
    index = DurableIndex(path, HEADER)
    index.put([entry("a", 1), entry("a", 2, 4096)])  # (the second replaces the first)
    index.delete([entry("a", 2, 4096)])
    written = path.read_bytes()
    index.delete([entry("a", 2, 4096)])  # a Forget delivered twice
    index.delete([entry("a", 1)])  # the put it replaced: removed with it already
    assert path.read_bytes() == written
    index.close()
    assert live_entries(path) == {}
    assert DurableIndex(path, HEADER).entries() == []


def test_the_removal_of_a_put_whose_failed_append_could_not_be_undone_is_written(path):
    index = DurableIndex(path, HEADER)
    index.put([entry("a", 1)])
    with immutable(path), pytest.raises(PermissionError):
        index.put([entry("b", 2, 4096)])  # (neither written nor undone)
    assert [e.key for e in index.entries()] == ["a"], "not recorded"
    before = path.read_bytes()
    index.delete([entry("b", 2, 4096)])  # the log may hold it: its removal is recorded
    assert path.read_bytes() != before
    index.delete([entry("b", 2, 4096)])
    index.close()
    assert sorted(live_entries(path)) == ["a"]
