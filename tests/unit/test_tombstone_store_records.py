"""How a segment's durable tombstone record is kept in etcd (master/tombstone_store.py):
what one leader writes, the next reads back whole; what no master wrote is refused."""

from __future__ import annotations

import json

import pytest

from kvpool.master.tombstone_store import decode, encode
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
