"""How a segment's durable tombstone record is kept in etcd (master/tombstone_format.py):
what one leader writes, the next reads back whole; what no master wrote is refused; a record
lies in pieces by buckets of its keys, and one change touches one piece."""

from __future__ import annotations

import json

import pytest

from kvpool.master.tombstone_format import (
    BUCKETS,
    bucket_of,
    decode,
    encode,
    is_marker,
    marker,
    merge,
    piece_key,
    segment_of_piece,
    split,
)
from kvpool.master.tombstones import DurableRecord


def test_a_record_reads_back_as_written():
    record = DurableRecord(False, {"tenant/k": 7, "tenant/other": 2**64 - 2})
    at, read = decode(encode(record, now=1234.5))
    assert (at, read) == (1234.5, record)
    assert decode(encode(DurableRecord(True, {}), now=1.0))[1] == DurableRecord(True, {})
    late = DurableRecord(False, {"tenant/k": 7}, frozenset({("tenant/k", 9), ("tenant/j", 3)}))
    assert decode(encode(late, now=2.0))[1] == late


def test_a_record_without_late_writes_is_read_as_an_older_master_wrote_it():
    written = json.dumps({"at": 1.0, "distrusted": False, "keys": {"k": 2}}).encode()
    assert decode(written)[1] == DurableRecord(False, {"k": 2})
    assert b"exact" not in encode(DurableRecord(False, {"k": 2}), now=1.0)


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not json",
        json.dumps({"at": 1.0, "distrusted": False}).encode(),  # no keys
        json.dumps({"at": "soon", "distrusted": False, "keys": {}}).encode(),
        json.dumps({"at": 1.0, "distrusted": False, "keys": {"k": "seven"}}).encode(),
        json.dumps({"at": 1.0, "distrusted": False, "keys": ["k"]}).encode(),
        json.dumps([1, 2]).encode(),
        json.dumps({"at": 1.0, "distrusted": False, "keys": {}, "exact": [["k"]]}).encode(),
        json.dumps({"at": 1.0, "distrusted": False, "keys": {}, "exact": [["k", "x"]]}).encode(),
    ],
)
def test_a_value_no_master_wrote_is_refused(value: bytes):
    with pytest.raises(ValueError, match="not a tombstone record"):
        decode(value)


# ---- pieces (what a write puts: only the buckets that changed)


def record_of(count: int, exact: int = 0) -> DurableRecord:
    return DurableRecord(
        False,
        {f"team/prompt-{i:05d}": i + 1 for i in range(count)},
        frozenset((f"team/late-{i}", i) for i in range(exact)),
    )


def test_a_record_split_into_pieces_merges_back_whole():
    for record in (record_of(1), record_of(4096, exact=50), DurableRecord(True, {})):
        pieces = split(record)
        assert merge(pieces.values()) == record
        assert all(0 <= bucket < BUCKETS for bucket in pieces)
    assert split(None) == {}
    assert merge([]) == DurableRecord(False, {})


def test_one_more_key_changes_one_piece_of_a_large_record():
    before = record_of(4096)
    after = DurableRecord(False, {**before.keys, "team/removed-now": 3})
    old, new = split(before), split(after)
    changed = [bucket for bucket in new if old.get(bucket) != new[bucket]]
    assert changed == [bucket_of("team/removed-now")]
    whole = len(encode(after, now=1.0))
    assert len(encode(new[changed[0]], now=1.0)) < whole / 16


def test_a_distrusted_piece_makes_the_whole_record_distrusted():
    assert merge([record_of(3), DurableRecord(True, {}), record_of(2)]) == DurableRecord(True, {})
    assert split(DurableRecord(True, {"ignored": 1})) == {0: DurableRecord(True, {})}


def test_pieces_of_the_same_key_merge_to_its_newest_generation():
    older = DurableRecord(False, {"k": 2}, frozenset({("j", 1)}))
    newer = DurableRecord(False, {"k": 5}, frozenset({("j", 4)}))
    assert merge([newer, older]) == DurableRecord(False, {"k": 5}, frozenset({("j", 1), ("j", 4)}))


@pytest.mark.parametrize("segment_id", ["node0/dram-1", "a/b/c", "x", "seg with spaces/ü"])
def test_a_piece_key_names_its_segment_whatever_the_id_holds(segment_id: str):
    for bucket in (0, BUCKETS - 1):
        assert segment_of_piece(b"kv", piece_key(b"kv", bucket, segment_id)) == segment_id


@pytest.mark.parametrize(
    "key", [b"kv/tombstone-pieces/", b"kv/tombstone-pieces/zz/seg", b"kv/tombstone-pieces/0f-seg"]
)
def test_a_key_no_master_wrote_names_no_segment(key: bytes):
    assert segment_of_piece(b"kv", key) is None
    assert segment_of_piece(b"kv", b"kv/tombstone-pieces/%02x/seg" % BUCKETS) is None


def test_the_marker_reads_as_distrusted_to_a_master_before_the_pieces():
    at, record = decode(marker(now=5.0))  # (decode reads as those masters did)
    assert (at, record) == (5.0, DurableRecord(True, {}))
    assert is_marker(marker(now=5.0))
    assert not is_marker(encode(DurableRecord(True, {}), now=5.0))
    assert not is_marker(b"not json") and not is_marker(b"[1]")
