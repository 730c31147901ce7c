"""A durable index keeps each object's replica count (``storage_node/index_log.py``, format 3),
and still reads the logs kvpool wrote before it kept one.

- an entry put with a count is read back with it, by the index reopened and by
  ``live_entries`` alike; one put with none reads back as 0 (unknown);
- a log of format 2 (no counts: written byte by byte here, as kvpool wrote it) opens with
  every object, counts 0, and is rewritten in format 3 that opens again to the same;
- a counted record whose count is cut short is skipped and counted as undecodable.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import google_crc32c
import pytest

from kvpool.storage_node.index_log import (
    COUNT,
    ENTRY,
    FORMAT,
    HEADER_SLOT,
    OP_PUT_COUNTED,
    Entry,
    frame,
)
from kvpool.storage_node.object_index import DurableIndex, live_entries
from kvpool.storage_node.private_files import make_private_directory

HEADER = {"segment_id": "n1/nvme-0001", "size": 1 << 20, "tier": "nvme"}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return make_private_directory(tmp_path / "segment") / "segment.index"


def format_2_log(entries: list[tuple[str, int, int, int, int | None]]) -> bytes:
    """A log as kvpool wrote it in format 2, spelled out here rather than with the current
    encoder: two header slots, then records framed as magic, length, CRC-32C of the salt and
    the body; a body is op, offset, size, generation, crc32c, has_crc, then the key."""
    salt = bytes(range(8))
    text = json.dumps({**HEADER, "format": 2, "salt": salt.hex()}).encode()
    body = (b"\x00" + text).ljust(HEADER_SLOT - 12, b" ")
    slot = struct.pack("<III", 0x4B56504C, len(body), google_crc32c.value(body)) + body
    records = []
    for key, offset, size, generation, crc in entries:
        entry = struct.pack("<BQQQIB", 1, offset, size, generation, crc or 0, crc is not None)
        entry += key.encode()
        check = google_crc32c.extend(google_crc32c.value(salt), entry)
        records.append(struct.pack("<III", 0x4B56504C, len(entry), check) + entry)
    return slot * 2 + b"".join(records)


def test_counts_are_kept_across_a_reopen(path):
    index = DurableIndex(path, HEADER)
    index.put([Entry("two", 0, 100, 1, 7, 2), Entry("none", 128, 100, 2, 7)])
    index.put([Entry("three", 256, 100, 3, None, 3)])
    index.close()
    expected = {"two": 2, "none": 0, "three": 3}
    assert {k: e.replicas for k, e in live_entries(path).items()} == expected
    reopened = DurableIndex(path, HEADER)  # (compacts: the counts survive the rewrite too)
    assert {e.key: e.replicas for e in reopened.entries()} == expected
    reopened.close()
    assert {e.key: e.replicas for e in DurableIndex(path, HEADER).entries()} == expected


def test_a_format_2_log_opens_with_every_object_and_is_rewritten_in_format_3(path):
    assert FORMAT == 3
    path.write_bytes(format_2_log([("a", 0, 100, 1, 7), ("b", 128, 50, 2, None)]))
    path.chmod(0o600)
    assert live_entries(path) == {
        "a": Entry("a", 0, 100, 1, 7, 0),
        "b": Entry("b", 128, 50, 2, None, 0),
    }
    index = DurableIndex(path, HEADER)
    assert index.header == HEADER
    assert (index.damaged_records, index.undecodable_records) == (0, 0)
    assert sorted(index.entries()) == [Entry("a", 0, 100, 1, 7), Entry("b", 128, 50, 2)]
    index.put([Entry("c", 256, 10, 3, 9, 2)])
    index.close()
    assert b'"format": 3' in path.read_bytes()[:HEADER_SLOT]
    again = DurableIndex(path, HEADER)
    assert {e.key: e.replicas for e in again.entries()} == {"a": 0, "b": 0, "c": 2}
    again.close()


def test_a_counted_record_cut_short_is_undecodable(path):
    index = DurableIndex(path, HEADER)
    index.put([Entry("kept", 0, 100, 1, 7, 2)])
    index.close()
    data = path.read_bytes()
    log_salt = bytes.fromhex(json.loads(data[13:HEADER_SLOT].decode().strip())["salt"])
    short = ENTRY.pack(OP_PUT_COUNTED, 128, 100, 2, 7, 1) + COUNT.pack(2)[:3]  # no key either
    path.write_bytes(data + frame(short, log_salt))
    reopened = DurableIndex(path, HEADER)
    assert reopened.undecodable_records == 1
    assert [e.key for e in reopened.entries()] == ["kept"]
    reopened.close()
