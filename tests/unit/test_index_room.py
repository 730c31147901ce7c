"""A durable index writes its log ahead with zeros, so that an append overwrites them in place
(no change of the file's size or blocks, so no journal commit in its sync). The zeros are
room, not records: a log cut short by a crash reads back whole, a clean close cuts them off,
and a record torn inside them is counted as damaged."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.storage_node.index_log import Entry
from kvpool.storage_node.object_index import ROOM, DurableIndex, live_entries
from kvpool.storage_node.private_files import make_private_directory

HEADER = {"segment_id": "n1/nvme-0001", "size": 1 << 30, "tier": "nvme"}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return make_private_directory(tmp_path / "segment") / "segment.index"


def entries(count: int, start: int = 0) -> list[Entry]:
    return [Entry(f"key-{i}", 4096 * i, 4096, i, 7) for i in range(start, start + count)]


def test_appends_fill_the_room_without_growing_the_file(path):
    index = DurableIndex(path, HEADER)
    size = path.stat().st_size
    for i in range(50):
        index.put(entries(1, i))
    assert path.stat().st_size == size, "records overwrite the zeros written ahead"
    index.close()
    assert path.stat().st_size < size - ROOM // 2, "a clean close cuts the zeros off"
    assert sorted(live_entries(path)) == sorted(e.key for e in entries(50))


def test_a_log_left_with_its_zeros_by_a_crash_reads_back_whole(path):
    index = DurableIndex(path, HEADER)
    index.put(entries(3))
    index.delete(entries(1))
    crashed = path.read_bytes()  # as a killed node leaves it: zeros after the last record
    assert crashed.endswith(bytes(1024))
    index.close()
    path.write_bytes(crashed)

    reopened = DurableIndex(path, {"segment_id": "other", "size": 1, "tier": "dram"})
    assert sorted(e.key for e in reopened.entries()) == ["key-1", "key-2"]
    assert (reopened.damaged_records, reopened.undecodable_records) == (0, 0)
    reopened.put(entries(1, 7))
    reopened.close()
    assert sorted(live_entries(path)) == ["key-1", "key-2", "key-7"]


def test_a_record_torn_inside_the_room_is_counted_and_the_rest_kept(path):
    index = DurableIndex(path, HEADER)
    index.put(entries(2))
    data = bytearray(path.read_bytes())
    index.close()
    end = len(bytes(data).rstrip(b"\0"))
    data[end - 5 : end] = bytes(5)  # the last record's end never reached the disk
    path.write_bytes(bytes(data))

    reopened = DurableIndex(path, HEADER)
    assert [e.key for e in reopened.entries()] == ["key-0"]
    assert reopened.damaged_records == 1
    reopened.close()


def test_a_log_that_outgrows_its_room_takes_more(path):
    index = DurableIndex(path, HEADER)
    size = path.stat().st_size
    many = entries(ROOM // 40 + 100)  # more records than the room holds
    for start in range(0, len(many), 1000):
        index.put(many[start : start + 1000])
    assert path.stat().st_size > size
    index.close()
    assert len(live_entries(path)) == len(many)
