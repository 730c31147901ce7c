"""A client's writes into a node's NVMe file (transport/shared_file.py), on a real file of
this machine's disk: whole blocks with direct I/O, the partial blocks at either end through
the page cache, so that the neighbours sharing those blocks keep their bytes."""

from __future__ import annotations

import ctypes
import mmap
import os
import time

import pytest

from kvpool.transport import shared_file
from kvpool.transport.shared_file import BLOCK, SharedFile

SIZE = 16 << 20
BASE = 0x7000_0000_0000  # (where the node has the segment: addresses translate by offset)


@pytest.fixture
def file(tmp_path):
    path = tmp_path / "segment.data"
    with open(path, "wb") as out:
        out.write(b"\xee" * SIZE)  # the neighbours' bytes
    try:
        direct = os.open(path, os.O_RDWR | os.O_DIRECT)
    except OSError as error:
        pytest.fail(f"{tmp_path} takes no direct I/O ({error}): run the tests on a disk")
    shared = SharedFile(direct, os.open(path, os.O_RDWR), SIZE, BASE, os.pidfd_open(os.getpid()))
    yield shared, path
    shared.close()


def _source(data: bytes, misalign: int) -> tuple[int, mmap.mmap]:
    memory = mmap.mmap(-1, len(data) + BLOCK)
    memory[misalign : misalign + len(data)] = data
    return ctypes.addressof(ctypes.c_char.from_buffer(memory)) + misalign, memory


@pytest.mark.parametrize(
    ("offset", "length", "misalign"),
    [
        (100, 50, 3),  # inside one block
        (1000, 3 * BLOCK + 500, 0),  # partial, whole, partial; aligned source
        (8192, 2 * BLOCK, 0),  # whole blocks, straight from the caller's aligned memory
        (4096, 8 << 20, 64),  # whole blocks only, more than one piece, through a bounce
        (4095, (5 << 20) + 2, 1),  # one byte before a block, one byte after
    ],
)
def test_a_write_lands_byte_for_byte_and_its_neighbours_keep_theirs(file, offset, length, misalign):
    shared, path = file
    data = os.urandom(length)
    address, memory = _source(data, misalign)
    assert shared.write(offset, address, length, time.monotonic() + 30)
    on_disk = path.read_bytes()
    assert on_disk[offset : offset + length] == data
    assert on_disk[:offset] == b"\xee" * offset
    assert on_disk[offset + length :] == b"\xee" * (SIZE - offset - length)
    memory.close()


def test_with_no_bounce_buffer_free_the_blocks_go_through_the_page_cache(file, monkeypatch):
    shared, path = file
    monkeypatch.setattr(shared_file, "BOUNCES", shared_file.BouncePool(0, shared_file.PIECE))
    data = os.urandom(3 * BLOCK)
    address, memory = _source(data, 7)
    assert shared.write(BLOCK, address, len(data), time.monotonic() + 30)
    assert path.read_bytes()[BLOCK : 4 * BLOCK] == data
    memory.close()


def test_a_write_whose_deadline_passed_writes_nothing(file):
    shared, path = file
    address, memory = _source(b"x" * 10_000, 0)
    assert not shared.write(100, address, 10_000, time.monotonic() - 1)
    assert path.read_bytes() == b"\xee" * SIZE
    memory.close()


def test_a_range_outside_the_segment_is_refused(file):
    shared, _ = file
    assert shared.offset_of(BASE + 10, 20) == 10
    for address, length in [(BASE - 1, 10), (BASE + SIZE - 5, 6), (BASE, -1)]:
        with pytest.raises(ValueError, match="outside the segment"):
            shared.offset_of(address, length)
