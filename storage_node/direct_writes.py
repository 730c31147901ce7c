"""Reads and writes of an NVMe segment past the page cache, and the checksums of writes.

**Why.** Bytes written into a memory-mapped file land in the page cache first: every page
of a fresh range is allocated, faulted in and dirtied, later written back, then synced. On
the virtual machines kvpool runs on, a first touch of a page is a fault into the host as
well, and that path ran at a fraction of the disk's speed (docs/benchmarks.md, "NVMe").
A write with ``O_DIRECT`` from a buffer already resident goes from that buffer to the
disk, and the page cache keeps no copy of it (the kernel drops any stale one).

**How.** A large write into an NVMe segment on the checked stream
(storage_node/checked_connection.py) is received in pieces into a bounce buffer (page
aligned, resident: ``BouncePool``), checksummed there as it passes, and written with
``pwrite`` on the segment's ``O_DIRECT`` descriptor: the whole pages of its range;
the partial pages at either end (shared with neighbours) are copied through the segment's
mapping, as before. Durability is unchanged: the record of an object still syncs its
range (which syncs the file's metadata too) before its index record is written.

**Reads** of bytes not in the page cache (``resident``: ``mincore``), on the checked stream
and in a copy to another tier (a promotion), are read the same way into a bounce buffer a
piece at a time (``read_pieces``): a read through the mapping would fault in a fresh page
per 4 KiB. Cached bytes are read through the mapping, which is faster still. A direct read
sees every write: the kernel writes dirty cached pages of its range back first.

**Checksums without reading the disk.** Recording an object needs its CRC-32C; reading it
back from the mapping would now read the disk. Each part a connection wrote is noted with
its CRC (``WrittenParts``); when the parts of one grant tile the object exactly, its CRC is
combined from theirs (common/crc32c_combine.py). Anything else (a part that failed midway,
two writes of the same bytes, a part not written here) falls back to reading the bytes.
The table is bounded (a peer chooses how many parts it sends): the oldest notes go first,
and their objects fall back too.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Generator, Iterator
from pathlib import Path

from kvpool.common.crc32c_combine import crc32c_combine
from kvpool.common.libc import LIBC
from kvpool.common.logging import get_logger
from kvpool.transport.direct_io import Bounce, BouncePool, DirectFile

log = get_logger("kvpool.node.direct")

#: Direct I/O moves whole blocks at block-aligned offsets from block-aligned memory; a page
#: is a multiple of every block size in use.
BLOCK = 4096
#: Bytes a bounce buffer holds: one receive and one disk write each.
BOUNCE_SIZE = 4 << 20
#: Bounce buffers a node keeps at most (their memory stays resident); a write that finds
#: none free goes through the mapping instead.
BOUNCE_COUNT = 8
#: Grants whose written parts are noted at most, per segment.
MAX_GRANTS = 4096
#: Parts noted per grant at most (a client cuts a transfer in a few).
MAX_PARTS = 64


class Part:
    """A part written under a grant: ``crc`` is None until all of its bytes are in."""

    __slots__ = ("crc", "length", "start")

    def __init__(self, start: int, length: int) -> None:
        self.start = start
        self.length = length
        self.crc: int | None = None


class WrittenParts:
    """The parts written under each grant ((object offset, generation)), with their CRCs."""

    def __init__(self, max_grants: int = MAX_GRANTS) -> None:
        self._max_grants = max_grants
        self._grants: OrderedDict[tuple[int, int], list[Part]] = OrderedDict()
        self._lock = threading.Lock()

    def begin(self, grant: tuple[int, int], start: int, length: int) -> Part:
        """Notes a part about to be written; its ``crc`` is set once it is all in."""
        part = Part(start, length)
        with self._lock:
            parts = self._grants.get(grant)
            if parts is None:
                if len(self._grants) >= self._max_grants:
                    self._grants.popitem(last=False)
                parts = self._grants[grant] = []
            if len(parts) >= MAX_PARTS:  # (keeps one that never tiles: the object falls back)
                del parts[1:]
                parts[0] = Part(-1, 0)
            else:
                parts.append(part)
        return part

    def take(self, grant: tuple[int, int], size: int) -> int | None:
        """The CRC of the ``size`` bytes of the grant's object (at the grant's offset) if its
        parts tile them exactly, each finished; None otherwise. Forgets the grant."""
        with self._lock:
            parts = self._grants.pop(grant, None)
        if not parts:
            return None
        offset = grant[0]
        crc, at = 0, offset
        for part in sorted(parts, key=lambda p: (p.start, p.length)):
            if part.crc is None or part.start != at:
                return None
            crc = crc32c_combine(crc, part.crc, part.length) if at > offset else part.crc
            at += part.length
        return crc if at == offset + size else None

    def drop(self, grant: tuple[int, int]) -> None:
        with self._lock:
            self._grants.pop(grant, None)


class DirectWriter(DirectFile):
    """An NVMe segment's file opened for direct I/O (writes, and reads of uncached bytes),
    and the parts written through it."""

    def __init__(self, fd: int) -> None:
        super().__init__(fd, fallback="through the mapping")
        self.parts = WrittenParts()

    @classmethod
    def open(cls, path: Path) -> DirectWriter | None:
        """None where the file system takes no direct I/O (tmpfs, for one)."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        try:
            fd = os.open(path, os.O_RDWR | flag | os.O_CLOEXEC)
        except OSError:
            return None
        return cls(fd)


#: The node's bounce buffers, shared by its connections.
BOUNCES = BouncePool(BOUNCE_COUNT, BOUNCE_SIZE)


def read_pieces(
    direct: DirectWriter, bounce: Bounce, offset: int, length: int
) -> Generator[memoryview, None, None]:
    """The bytes at ``offset`` .. ``offset + length`` of the file, read with direct I/O into
    ``bounce`` a piece at a time (each piece valid until the next is asked for). Raises
    ``DirectReadRefused`` before the first piece where the file system turns direct reads
    down, ``OSError`` on a later refusal or a short file."""
    view = memoryview(bounce.memory)
    end = offset + length
    at = offset
    try:
        while at < end:
            start = at - at % BLOCK
            stop = min(start + len(view), end + (-end) % BLOCK)
            got = direct.read(view[: stop - start], start)
            if got is None:
                if at == offset:
                    raise DirectReadRefused
                raise OSError(errno.EIO, "a direct read was turned down midway")
            upto = min(end, start + got)
            if upto <= at:
                raise OSError(errno.EIO, f"the segment's file ends before {end}")
            piece = view[at - start : upto - start]
            yield piece
            piece.release()
            at = upto
    finally:
        view.release()


def read_error(direct: DirectWriter, offset: int, length: int) -> OSError | None:
    """What the disk says to a read of the ``length`` bytes at ``offset`` past the page
    cache: its error, or None when they read (or the file system takes no direct reads).
    For an error path (a send from the mapping failed): a buffer of its own, no bounce."""
    start = offset - offset % BLOCK
    stop = offset + length + (-(offset + length)) % BLOCK
    bounce = Bounce(stop - start)
    try:
        for _ in read_pieces(direct, bounce, offset, length):
            pass
    except DirectReadRefused:
        return None
    except OSError as error:
        # (without its traceback: held by the caller, it would keep this frame, and the
        # caller's views of a segment's memory, in a cycle)
        return error.with_traceback(None)
    finally:
        bounce.memory.close()
    return None


class DirectReadRefused(Exception):
    """The file system takes no direct reads: read another way (nothing was read)."""


@contextlib.contextmanager
def uncached_pieces(
    direct: DirectWriter | None, mapped_at: int, offset: int, length: int
) -> Iterator[Generator[memoryview, None, None] | None]:
    """``read_pieces`` of the bytes at ``offset`` of a segment mapped at ``mapped_at`` when
    they are worth reading past the page cache (a direct file, not turned down, the bytes
    not all cached, a bounce buffer free); None otherwise: read them through the mapping.
    The buffer goes back to the pool on leaving."""
    if direct is None or not direct.usable or resident(mapped_at + offset, length):
        yield None
        return
    bounce = BOUNCES.take()
    if bounce is None:
        yield None
        return
    pieces = read_pieces(direct, bounce, offset, length)
    try:
        yield pieces
    finally:
        pieces.close()  # (its view of the buffer released before another takes it)
        BOUNCES.give(bounce)


_mincore = LIBC.mincore
_mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident(address: int, length: int) -> bool:
    """Whether every page of the mapped file range at ``address`` is in the page cache
    (``mincore``: it asks the page cache, mapped into this process or not); False when the
    kernel cannot say."""
    start = address - address % mmap.PAGESIZE
    size = address + length - start
    pages = -(-size // mmap.PAGESIZE)
    vector = ctypes.create_string_buffer(pages)
    if _mincore(start, size, vector) != 0:
        return False
    return 0 not in vector.raw.translate(_RESIDENT_BIT)


#: Each byte of ``mincore``'s vector to its lowest bit (the page is resident); the other
#: bits are reserved.
_RESIDENT_BIT = bytes(b & 1 for b in range(256))
