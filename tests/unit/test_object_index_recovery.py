"""A durable index read back from a damaged or hostile disk: it recovers what can be
recovered, adopts nothing it did not write, never crashes, and never writes through a link.

The logs here are crafted byte by byte: written by ``DurableIndex`` and then damaged, or
written in format 1 (one header, no salt: what kvpool wrote before format 2).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from kvpool.storage_node.index_log import (
    ENTRY,
    FRAME,
    HEADER_SLOT,
    OP_HEADER,
    OP_PUT,
    UNCONFIRMED_ABOVE,
    Entry,
    LogDamaged,
    _decode,
    encode,
    frame,
)
from kvpool.storage_node.object_index import DurableIndex, live_entries
from kvpool.storage_node.private_files import (
    SegmentInUse,
    UnsafeLocation,
    make_private_directory,
)
from kvpool.storage_node.segment_layout import segment_base

HEADER = {"segment_id": "n1/nvme-0001", "size": 1 << 20, "tier": "nvme"}


@pytest.fixture
def segment_dir(tmp_path: Path) -> Path:
    return make_private_directory(tmp_path / "segment")


def written(directory: Path, entries: list[Entry]) -> Path:
    """A log as DurableIndex writes it, closed."""
    path = directory / "segment.index"
    index = DurableIndex(path, HEADER)
    index.put(entries)
    index.close()
    return path


def format_1(path: Path, records: list[bytes]) -> Path:
    """A log as kvpool wrote it before format 2: one header, CRCs without a salt."""
    header = frame(bytes([OP_HEADER]) + json.dumps(HEADER).encode(), b"")
    path.write_bytes(header + b"".join(records))
    return path


def put_record(key: str, offset: int = 0, generation: int = 1) -> bytes:
    return frame(encode(OP_PUT, Entry(key, offset, 100, generation, 7)), b"")


def reopened(path: Path) -> DurableIndex:
    index = DurableIndex(path, {"segment_id": "someone-else", "size": 1, "tier": "dram"})
    index.close()
    return index


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- the header


@pytest.mark.parametrize("copy", [0, 1], ids=["first copy", "second copy"])
def test_one_flipped_byte_in_the_header_is_recovered_from_its_other_copy(segment_dir, copy):
    path = written(segment_dir, [Entry("a", 0, 100, 1, 7)])
    flip(path, copy * HEADER_SLOT + FRAME.size + 20)  # inside the header's JSON

    index = reopened(path)
    assert index.header == HEADER, "the segment keeps its identity"
    assert [e.key for e in index.entries()] == ["a"]
    assert index.damaged_records == 1
    assert reopened(path).damaged_records == 0, "the open rewrote both copies"


def test_a_log_whose_header_copies_are_both_lost_is_refused_and_left_as_it_is(segment_dir):
    path = written(segment_dir, [Entry("a", 0, 100, 1, 7)])
    flip(path, FRAME.size + 20)
    flip(path, HEADER_SLOT + FRAME.size + 20)
    before = path.read_bytes()

    with pytest.raises(LogDamaged, match="neither copy of its header"):
        DurableIndex(path, HEADER)
    assert path.read_bytes() == before, "nothing rewritten: not as empty, not at all"
    with pytest.raises(LogDamaged):
        DurableIndex(path, HEADER)  # and the refusal did not keep the segment locked


def test_a_log_of_a_later_format_is_refused_with_what_to_do(segment_dir):
    path = written(segment_dir, [])
    slot = frame(
        (bytes([OP_HEADER]) + json.dumps({**HEADER, "format": 4}).encode()).ljust(
            HEADER_SLOT - FRAME.size, b" "
        ),
        b"",
    )
    path.write_bytes(slot * 2)
    with pytest.raises(LogDamaged, match="format 4, written by a later kvpool"):
        DurableIndex(path, HEADER)


def test_a_format_1_log_is_read_and_rewritten_in_the_current_format(segment_dir):
    path = format_1(segment_dir / "segment.index", [put_record("a"), put_record("b", 100)])

    index = reopened(path)
    assert index.header == HEADER
    assert sorted(e.key for e in index.entries()) == ["a", "b"]
    data = path.read_bytes()
    assert data[:HEADER_SLOT] == data[HEADER_SLOT : 2 * HEADER_SLOT], "two header copies"
    assert b'"format": 3' in data[:HEADER_SLOT]
    assert sorted(live_entries(path)) == ["a", "b"]


# ---------------------------------------------------------------- damaged records


def test_after_a_damaged_record_the_scan_resumes_after_its_span(segment_dir):
    entries = [Entry(f"key-{i}", 100 * i, 100, i, 7) for i in range(5)]
    path = written(segment_dir, entries)
    data = path.read_bytes()
    flip(path, data.index(b"key-2") + 4)  # its CRC no longer holds; its length still does

    index = reopened(path)
    assert sorted(e.key for e in index.entries()) == ["key-0", "key-1", "key-3", "key-4"]
    assert index.damaged_records == 1
    assert index.unconfirmed == {"key-0", "key-1"}, "key-2's record may have removed them"


def test_a_record_hidden_in_a_damaged_records_key_is_not_adopted(segment_dir):
    """Keys come from clients: one may spell out a whole record. When the record that holds
    such a key is damaged, the scan goes on after that record's span, not inside it."""
    key = _key_holding_a_record()
    path = format_1(
        segment_dir / "segment.index",
        [put_record("before"), put_record(key), put_record("after", offset=200)],
    )
    flip(path, path.read_bytes().index(key.encode()))  # in the key, ahead of the hidden record

    index = reopened(path)
    assert sorted(e.key for e in index.entries()) == ["after", "before"]
    assert index.damaged_records == 1


def test_a_record_spelled_in_a_key_is_not_adopted_when_the_scan_resynchronises(segment_dir):
    """A damaged length sends the scan looking for the next magic number, which may lie in a
    key; the record there does not carry the log's salt, so its CRC is wrong."""
    hidden_text = _key_holding_a_record()
    path = written(
        segment_dir,
        [Entry("before", 0, 100, 1, 7), Entry(hidden_text, 100, 100, 2, 7)],
    )
    index = DurableIndex(path, HEADER)
    index.put([Entry("after", 200, 100, 3, 7)])
    index.close()
    data = bytearray(path.read_bytes())
    carrier = data.index(hidden_text.encode()) - ENTRY.size - FRAME.size
    struct.pack_into("<I", data, carrier + 4, 1 << 30)  # an implausible length
    path.write_bytes(bytes(data))

    index = reopened(path)
    assert sorted(e.key for e in index.entries()) == ["after", "before"]
    assert "stolen" not in live_entries(path)


@pytest.mark.parametrize(
    "body",
    [
        bytes([OP_PUT]) + b"\x00" * 5,  # shorter than an entry
        ENTRY.pack(OP_PUT, 0, 100, 1, 7, 1),  # no key
        ENTRY.pack(OP_PUT, 0, 100, 1, 7, 1) + b"\xff\xfe",  # a key that is not UTF-8
        ENTRY.pack(9, 0, 100, 1, 7, 1) + b"k",  # an operation that does not exist
        ENTRY.pack(OP_PUT, 0, 100, 1, 7, 2) + b"k",  # a flag that is neither 0 nor 1
        bytes([OP_HEADER]) + b"{}",  # a header among the entries
    ],
    ids=["short", "no key", "not UTF-8", "unknown op", "bad flag", "header"],
)
def test_a_record_whose_crc_holds_but_whose_body_does_not_decode_is_skipped_and_counted(
    segment_dir, body
):
    path = format_1(
        segment_dir / "segment.index",
        [put_record("before"), frame(body, b""), put_record("after", offset=100)],
    )
    index = reopened(path)  # no struct.error, no UnicodeDecodeError
    assert sorted(e.key for e in index.entries()) == ["after", "before"]
    assert index.undecodable_records == 1
    assert index.damaged_records == 0
    assert index.unconfirmed == {"before"}


def test_a_torn_last_record_is_counted_and_what_came_before_is_kept(segment_dir):
    path = written(segment_dir, [Entry("a", 0, 100, 1, 7), Entry("b", 100, 100, 2, 7)])
    path.write_bytes(path.read_bytes()[:-3])
    index = reopened(path)
    assert [e.key for e in index.entries()] == ["a"]
    assert index.damaged_records == 1
    assert index.unconfirmed == set(), "a torn end was never acknowledged: no doubt on the rest"


# ---------------------------------------------------------------- entries in doubt


def damaged_removal(directory: Path) -> Path:
    """A log of "a" and "b" put, then "a" removed, whose removal record is damaged, followed
    by "c" put: the log a node with a rotting disk may read at its restart."""
    path = directory / "segment.index"
    index = DurableIndex(path, HEADER)
    a = Entry("a", 0, 100, 1, 7)
    index.put([a, Entry("b", 100, 100, 2, 7)])
    index.delete([a])
    index.put([Entry("c", 200, 100, 3, 7)])
    index.close()
    record = FRAME.size + ENTRY.size + 1  # (each record here: one key of one character)
    removal = 2 * HEADER_SLOT + 2 * record
    assert path.read_bytes()[removal + record - 1 : removal + record] == b"a"
    flip(path, removal + record - 1)  # the removal's key: its CRC no longer holds
    return path


def test_entries_recorded_before_a_damaged_record_are_reported_unconfirmed(segment_dir):
    """The damaged record may have been their removal (it was, for "a"): the node reports
    them marked, and a master adopts them only as objects it still knows."""
    index = DurableIndex(damaged_removal(segment_dir), HEADER)
    assert sorted(e.key for e in index.entries()) == ["a", "b", "c"]
    assert index.unconfirmed == {"a", "b"}
    index.close()


def test_the_doubt_outlives_the_rewrite_on_open_until_a_master_confirms(segment_dir):
    path = damaged_removal(segment_dir)
    reopened(path)  # rewritten without the damage...
    index = DurableIndex(path, HEADER)
    assert index.damaged_records == 0
    assert index.unconfirmed == {"a", "b"}, "...but the entries stay in doubt"
    index.confirm()  # (the master adopted what it knew, the node forgot the rest)
    index.close()
    index = DurableIndex(path, HEADER)
    assert index.unconfirmed == set()
    assert sorted(e.key for e in index.entries()) == ["a", "b", "c"]
    index.close()


def test_an_entry_in_doubt_recorded_again_is_sure_and_stays_sure(segment_dir):
    path = damaged_removal(segment_dir)
    index = DurableIndex(path, HEADER)
    index.put([Entry("b", 300, 100, 9, 7)])  # a new put of the key: its record is whole
    index.delete([Entry("a", 0, 100, 1, 7)])
    assert index.unconfirmed == set()
    index.close()
    assert reopened(path).unconfirmed == set()


def test_the_mark_keeps_the_logs_format_and_what_it_lists(segment_dir):
    """The mark is a record of its own, which a kvpool that predates it counts as
    undecodable and skips (as it skipped every damaged record): no new format is needed."""
    path = damaged_removal(segment_dir)
    reopened(path)
    assert b'"format": 3' in path.read_bytes()[:HEADER_SLOT]
    assert sorted(live_entries(path)) == ["a", "b", "c"]
    assert _decode(UNCONFIRMED_ABOVE) is None  # (what the reader before the mark made of it)


# ---------------------------------------------------------------- the files themselves


def test_a_symbolic_link_planted_as_the_compactions_temporary_file_is_not_written_through(
    segment_dir, tmp_path
):
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone else's file")
    path = written(segment_dir, [Entry("a", 0, 100, 1, 7)])
    (segment_dir / "segment.index.tmp").symlink_to(victim)

    index = reopened(path)
    assert [e.key for e in index.entries()] == ["a"]
    assert victim.read_bytes() == b"someone else's file"


def test_an_index_that_is_a_symbolic_link_is_refused(segment_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere.index"
    elsewhere.write_bytes(b"not ours")
    (segment_dir / "segment.index").symlink_to(elsewhere)
    with pytest.raises(UnsafeLocation, match="symbolic link"):
        DurableIndex(segment_dir / "segment.index", HEADER)
    assert elsewhere.read_bytes() == b"not ours"


def test_a_segment_directory_that_others_may_write_or_that_is_a_link_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeLocation, match="writable by other users"):
        DurableIndex(shared / "segment.index", HEADER)
    with pytest.raises(UnsafeLocation, match="writable by other users"):
        segment_base(shared)
    link = tmp_path / "link"
    link.symlink_to(make_private_directory(tmp_path / "real"))
    with pytest.raises(UnsafeLocation, match="symbolic link"):
        DurableIndex(link / "segment.index", HEADER)


def test_a_segment_directory_writable_by_a_group_of_the_nodes_own_is_accepted(tmp_path):
    """As Kubernetes leaves a volume's directories for the pod's fsGroup."""
    directory = tmp_path / "fs-group"
    directory.mkdir()
    directory.chmod(0o2770)
    assert directory.stat().st_gid in {os.getegid(), *os.getgroups()}
    DurableIndex(directory / "segment.index", HEADER).close()


def test_a_segment_directory_is_created_for_the_node_alone(tmp_path):
    base = segment_base(tmp_path / "nvme" / "kvpool-nvme")
    assert base == tmp_path / "nvme" / "kvpool-nvme" / "segment"
    assert (tmp_path / "nvme" / "kvpool-nvme").stat().st_mode & 0o777 == 0o700


def test_files_of_the_earlier_layout_beside_the_directory_are_moved_in(tmp_path):
    """Before format 2, a segment's files lay beside its directory's place: a node that
    starts finds them again."""
    legacy = format_1(tmp_path / "kvpool-nvme.index", [put_record("kept")])
    (tmp_path / "kvpool-nvme.data").write_bytes(b"\x00" * 4096)

    base = segment_base(tmp_path / "kvpool-nvme")
    assert not legacy.exists() and not (tmp_path / "kvpool-nvme.data").exists()
    assert (base.parent / "segment.data").stat().st_size == 4096
    assert list(live_entries(base.parent / "segment.index")) == ["kept"]


def test_one_process_at_a_time_holds_a_segment(segment_dir):
    first = DurableIndex(segment_dir / "segment.index", HEADER)
    with pytest.raises(SegmentInUse, match=f"in use by another process \\(pid {os.getpid()}\\)"):
        DurableIndex(segment_dir / "segment.index", HEADER)
    first.close()
    DurableIndex(segment_dir / "segment.index", HEADER).close()


def _key_holding_a_record() -> str:
    """A key that holds a whole put record of "stolen" after its first character: a record
    of ASCII bytes only (keys are UTF-8), its generation tried until its CRC's bytes are."""
    for generation in range(1, 1 << 16):
        record = frame(encode(OP_PUT, Entry("stolen", 0, 100, generation, 7)), b"")
        if all(b < 0x80 for b in record):
            return "x" + record.decode("ascii")
    raise AssertionError("no ASCII record found")
