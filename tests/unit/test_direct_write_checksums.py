"""An object written to NVMe in parts past the page cache is recorded with the checksum of
its bytes, combined from its parts' checksums, and only when the parts are known to tile it:
anything else (a part cut short, a part written twice, a gap) reads the bytes instead."""

from __future__ import annotations

import itertools
import os
import random

import google_crc32c
import pytest

from kvpool.common.crc32c_combine import crc32c_combine
from kvpool.storage_node.direct_writes import (
    MAX_PARTS,
    DirectReadRefused,
    DirectWriter,
    WrittenParts,
    read_pieces,
)
from kvpool.transport.direct_io import BouncePool


def crc(data: bytes) -> int:
    return google_crc32c.value(data)


@pytest.mark.parametrize("cut", [0, 1, 63, 4096, 65_537, 1 << 20])
def test_the_crc_of_two_strings_end_to_end_comes_from_theirs(cut):
    data = os.urandom((1 << 20) + 12_345)
    first, second = data[:cut], data[cut:]
    assert crc32c_combine(crc(first), crc(second), len(second)) == crc(data)


def test_a_negative_length_is_refused():
    with pytest.raises(ValueError, match="negative"):
        crc32c_combine(0, 0, -1)


def write_parts(parts: WrittenParts, grant: tuple[int, int], data: bytes, cuts: list[int]):
    offset = grant[0]
    bounds = [0, *cuts, len(data)]
    pieces = list(itertools.pairwise(bounds))
    random.Random(len(cuts)).shuffle(pieces)  # (lanes finish in any order)
    for start, end in pieces:
        parts.begin(grant, offset + start, end - start).crc = crc(data[start:end])


def test_parts_that_tile_the_object_give_its_crc_in_any_order():
    data = os.urandom(5 << 20)
    parts = WrittenParts()
    for cuts in ([], [4096], [1 << 20, 2 << 20, 4 << 20], [7, 8, 9]):
        write_parts(parts, (8192, 3), data, cuts)
        assert parts.take((8192, 3), len(data)) == crc(data)
        assert parts.take((8192, 3), len(data)) is None, "taken once: forgotten then"


def test_a_part_not_finished_a_gap_or_an_overlap_falls_back_to_the_bytes():
    parts = WrittenParts()
    data = os.urandom(1 << 16)
    parts.begin((0, 1), 0, 4096).crc = crc(data[:4096])
    parts.begin((0, 1), 4096, len(data) - 4096)  # (cut short: no crc)
    assert parts.take((0, 1), len(data)) is None
    parts.begin((0, 1), 0, 4096).crc = crc(data[:4096])
    assert parts.take((0, 1), len(data)) is None, "a gap at the end"
    write_parts(parts, (0, 1), data, [4096])
    parts.begin((0, 1), 0, 4096).crc = crc(data[:4096])  # (written twice: which landed last?)
    assert parts.take((0, 1), len(data)) is None
    write_parts(parts, (0, 1), data, [])
    assert parts.take((0, 2), len(data)) is None, "another generation at the same offset"
    assert parts.take((0, 1), len(data) + 1) is None, "an object larger than its parts"


def test_the_table_is_bounded_in_grants_and_in_parts_per_grant():
    parts = WrittenParts(max_grants=4)
    for generation in range(10):
        parts.begin((0, generation), 0, 1).crc = 0
    assert all(parts.take((0, g), 1) is None for g in range(6)), "the oldest went first"
    assert all(parts.take((0, g), 1) == 0 for g in range(6, 10))
    for start in range(MAX_PARTS + 5):
        parts.begin((0, 99), start, 1).crc = crc(b"x")
    assert parts.take((0, 99), MAX_PARTS + 5) is None, "too many parts: read back instead"


def test_bounce_buffers_are_page_aligned_reused_and_bounded():
    pool = BouncePool(count=2, size=1 << 20)
    first, second = pool.take(), pool.take()
    assert first is not None and second is not None and pool.take() is None
    assert first.address % 4096 == 0 and len(first.memory) == 1 << 20
    pool.give(first)
    assert pool.take() is first


def test_a_file_system_that_turns_a_direct_write_down_is_written_another_way(tmp_path):
    """EINVAL from a direct write (here: memory off the block alignment) is no failure: the
    writer says so, and every later write goes through the mapping instead."""
    path = tmp_path / "segment.data"
    path.write_bytes(bytes(1 << 20))
    writer = DirectWriter.open(path)
    assert writer is not None
    try:
        unaligned = memoryview(bytearray(8192 + 1))[1:]
        assert writer.write(unaligned[:4096], 0) is False
        assert writer.usable is False
        assert writer.write(unaligned[:4096], 0) is False, "not tried again"
        assert path.read_bytes() == bytes(1 << 20), "nothing written"
    finally:
        writer.close()


@pytest.mark.parametrize(("offset", "length"), [(0, 4096), (100, 70_000), (4095, 300_001)])
def test_direct_reads_return_exactly_the_bytes_asked_for_piece_by_piece(tmp_path, offset, length):
    data = os.urandom(1 << 20)
    path = tmp_path / "segment.data"
    path.write_bytes(data)
    reader = DirectWriter.open(path)
    assert reader is not None
    bounce = BouncePool(count=1, size=64 << 10).take()  # (small: several pieces)
    assert bounce is not None
    try:
        got = b"".join(bytes(piece) for piece in read_pieces(reader, bounce, offset, length))
        assert got == data[offset : offset + length]
        reader.usable = False  # (as after the file system turned a direct write down)
        with pytest.raises(DirectReadRefused):
            next(read_pieces(reader, bounce, offset, length))
    finally:
        reader.close()
