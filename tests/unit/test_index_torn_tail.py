"""A node killed in the middle of an append leaves the log's last record torn: that record
never returned, so it is no loss, and a log whose only damage it is can be appended to as it
is, after its last intact record, when it cannot be rewritten (a full disk). The open zeroes
the torn bytes first: left there, they would lie between intact records once later appends
passed them, and the next open would take them for damage in the middle of the log (and put
every entry before them in doubt). Damage anywhere before the last intact record still needs
the rewrite (the log is never read around a record that fails its check).

Here the rewrite is made impossible by ``chattr +i`` on the segment's directory (no new file
can be made there), as a full disk makes it (tests/integration/test_nvme_index_full_disk.py);
every byte at which the last append could have stopped is tried."""

from __future__ import annotations

from pathlib import Path

import pytest
from index_helpers import HEADER, immutable, log_path

from kvpool.storage_node.index_log import FRAME, OP_PUT, Entry, encode
from kvpool.storage_node.object_index import DurableIndex, live_entries

ENTRIES = [Entry(f"key-{n}", 4096 * n, 4096, n + 1, 7) for n in range(4)]
LATER = Entry("later", 1 << 20, 4096, 9, 7)


@pytest.fixture(scope="module")
def crashed_log(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A log as a node killed after its appends leaves it: its records, then the zeros
    written ahead of them."""
    path = log_path(tmp_path_factory.mktemp("log"))
    index = DurableIndex(path, HEADER)
    index.put(ENTRIES)
    data = path.read_bytes()
    index.close()
    return data


def _last_record(data: bytes) -> tuple[int, int]:
    end = len(data.rstrip(b"\0"))
    return end - (FRAME.size + len(encode(OP_PUT, ENTRIES[-1]))), end


@pytest.fixture
def path(tmp_path: Path) -> Path:
    path = log_path(tmp_path)
    DurableIndex(path, HEADER).close()  # (its lock file made ahead)
    return path


def test_a_torn_last_append_is_cut_off_where_the_log_cannot_be_rewritten(path, crashed_log):
    start, end = _last_record(crashed_log)
    record = crashed_log[start:end]
    for torn in range(1, len(record)):  # every byte the append could have stopped after
        # (a second append of the record, torn: over the zeros after the last one)
        path.write_bytes(crashed_log[:end] + record[:torn] + crashed_log[end + torn :])
        with immutable(path.parent):
            index = DurableIndex(path, HEADER)
            assert [e.key for e in index.entries()] == [e.key for e in ENTRIES], torn
            assert index.damaged_records == 1 and index.unconfirmed == set(), torn
            index.put([LATER])  # (where the torn bytes were)
            index.close()
        again = DurableIndex(path, HEADER)
        assert (again.damaged_records, again.undecodable_records) == (0, 0), torn
        assert again.unconfirmed == set(), torn
        assert sorted(e.key for e in again.entries()) == sorted(e.key for e in [*ENTRIES, LATER])
        again.close()


def test_damage_before_the_last_intact_record_still_needs_the_rewrite(path, crashed_log):
    start, _ = _last_record(crashed_log)
    for at in range(start - 30, start):  # inside the record before the last one
        damaged = bytearray(crashed_log)
        damaged[at] ^= 0x5A
        path.write_bytes(bytes(damaged))
        with immutable(path.parent), pytest.raises(OSError, match="damaged"):
            DurableIndex(path, HEADER)
        assert path.read_bytes() == bytes(damaged), "left as it was"
    assert sorted(live_entries(path)) == [e.key for e in ENTRIES if e.key != "key-2"]
