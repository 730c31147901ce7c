"""Same-host writes into a storage node's NVMe segment: the client writes the segment's file
itself, with direct I/O, instead of streaming the bytes to the node over loopback TCP.

An NVMe segment is a file on a disk. Over the checked stream every byte of a put is copied
into the kernel by the client, out of it by the node, and written by the node: on a machine
of few cores that CPU, not the disk, bounds the puts. A client on the node's host that may
map the node's DRAM (security/mapping_grants.py: the same grant, the same rules) gets the
NVMe segment's file instead (``SharedMemory.direct_io``): two descriptors the node hands over
at its mapping socket, one opened with ``O_DIRECT`` for the whole blocks of a write and one
plain for the partial blocks at either end (blocks there may be shared with the neighbouring
objects, which direct I/O would overwrite whole). The whole blocks go to the disk from a
bounded pool of aligned bounce buffers (transport/direct_io.py; straight from the
caller's memory when it is aligned), so a put costs the client one memory copy and the
node nothing until it records the object.

What stays the node's: durability (its Persist syncs the range and writes the index record
before the object is published) and the record's checksum, which for a file written here is
the writer's end-to-end CRC-32C (the client always sends one with such a put; a writer
allowed this far could write any bytes there anyway). Reads keep the checked stream or UCX.

Lifetime, as for mappings (transport/shared_memory.py): the file is held with a pidfd of the
node process, checked before every use; the client's reaper lets go of it when the node
exits. A write's pieces each start before the transfer's deadline.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from kvpool.common.helper_threads import Helpers
from kvpool.transport import ucp, writer_locks
from kvpool.transport.direct_io import BouncePool, DirectFile, write_all
from kvpool.transport.shared_memory import (
    HANDOVER_TIMEOUT,
    HeldSegment,
    MappingRefused,
    SegmentFile,
    open_node_file,
)

#: Direct I/O moves whole blocks at block-aligned offsets from block-aligned memory; a page
#: is a multiple of every block size in use.
BLOCK = 4096
#: Bytes written per direct write (a bounce buffer's size), and between two deadline checks.
PIECE = 4 << 20
#: Bounce buffers this process keeps at most for such writes; a piece that finds none free
#: is written through the plain descriptor (the page cache) instead.
BOUNCE_COUNT = 8
BOUNCES = BouncePool(BOUNCE_COUNT, PIECE)
#: Pieces of one large write in flight at once (a disk takes several direct writes side by
#: side faster than one after another), on threads this process shares for it.
PARALLEL_PIECES = 4
_PIECE_WRITERS = ThreadPoolExecutor(PARALLEL_PIECES, thread_name_prefix="kvpool-file-write")


def _after_fork_in_child() -> None:
    """A fork child gets a pool of its own: the parent's threads did not survive the fork,
    yet its pool may count them idle and never start one for the child's pieces."""
    global _PIECE_WRITERS
    _PIECE_WRITERS = ThreadPoolExecutor(PARALLEL_PIECES, thread_name_prefix="kvpool-file-write")
    BOUNCES.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class SharedFile(HeldSegment):
    """A node's NVMe segment file, held open in this process for writes: ``direct`` for
    whole blocks, ``plain_fd`` for the rest. ``Mappings`` keeps it as it keeps mappings."""

    #: Writes only: gets read such a segment as any other client does.
    writable = True

    def __init__(
        self,
        direct_fd: int,
        plain_fd: int,
        size: int,
        remote_base: int,
        pidfd: int,
        origin: tuple[int, ...] = (),
        lock_fd: int | None = None,
    ) -> None:
        super().__init__(size, remote_base, pidfd, origin, lock_fd)
        self.direct = DirectFile(direct_fd, fallback="through the page cache")
        self.plain_fd = plain_fd
        self._closing = threading.Lock()

    @classmethod
    def open(cls, file: SegmentFile, *, timeout: float = HANDOVER_TIMEOUT) -> SharedFile:
        """Opens the node's file for writes; MappingRefused when this process cannot reach
        it. With ``file.socket_name`` the node hands both descriptors over there under
        ``file.grant``; else they are opened as ``/proc/<pid>/fd/<fd>`` (a node of this
        process's user that lets it)."""
        pidfd, opened = open_node_file(
            file, [os.O_RDWR | os.O_DIRECT, os.O_RDWR], writable=True, timeout=timeout
        )
        if not os.O_DIRECT & fcntl.fcntl(opened[0], fcntl.F_GETFL):
            for fd in (*opened, pidfd):
                os.close(fd)
            raise MappingRefused(0, f"node process {file.pid} handed over no direct-I/O file")
        lock_fd = writer_locks.own_description(opened[1], handed_over=bool(file.socket_name))
        origin = file.origin(True)
        return cls(opened[0], opened[1], file.size, file.remote_base, pidfd, origin, lock_fd)

    def write(self, offset: int, source: int, length: int, deadline: float) -> bool:
        """Writes ``length`` bytes from ``source`` (an address in this process) at
        ``offset``: the partial blocks at either end through the plain descriptor, the
        whole blocks between them with direct I/O. False when the deadline passed before
        the last piece started (what was written stays unpublished: the put fails)."""
        end = offset + length
        head_end = min(-(-offset // BLOCK) * BLOCK, end)
        tail_start = max(end // BLOCK * BLOCK, head_end)
        if time.monotonic() >= deadline:
            return False
        if head_end > offset:
            write_all(self.plain_fd, _view(source, head_end - offset), offset)
        pieces = [(at, min(PIECE, tail_start - at)) for at in range(head_end, tail_start, PIECE)]
        if len(pieces) == 1:
            if not self._write_piece(offset, source, *pieces[0], deadline):
                return False
        elif pieces:
            # (each piece is one bounded write: none reads the caller's memory after this,
            # an interrupt of the caller included)
            helpers = Helpers(_PIECE_WRITERS)
            try:
                with helpers:
                    for at, size in pieces:
                        helpers.submit(self._write_piece, offset, source, at, size, deadline)
            except BaseException:
                helpers.stop_and_wait()  # (see Helpers: an interrupt as the block ended)
                raise
            if not all([piece.result() for piece in helpers.futures]):  # (a piece's error)
                return False
        if end > tail_start:
            if time.monotonic() >= deadline:
                return False
            write_all(self.plain_fd, _view(source + (tail_start - offset), end - tail_start),
                      tail_start)  # fmt: skip
        return True

    def _write_piece(self, offset: int, source: int, at: int, size: int, deadline: float) -> bool:
        """Writes the whole blocks [at, at + size) of a write of ``source`` at ``offset``,
        unless the deadline passed before it started."""
        if time.monotonic() >= deadline:
            return False
        self._write_blocks(source + (at - offset), size, at)
        return True

    def _write_blocks(self, source: int, length: int, offset: int) -> None:
        """Writes whole blocks: from ``source`` itself when aligned, else through a bounce
        buffer; through the page cache when no buffer is free or direct I/O is refused."""
        if self.direct.usable:
            if source % BLOCK == 0:
                if self.direct.write(_view(source, length), offset):
                    return
            elif (bounce := BOUNCES.take()) is not None:
                try:
                    view = memoryview(bounce.memory)[:length]
                    view[:] = _view(source, length)
                    if self.direct.write(view, offset):
                        return
                finally:
                    BOUNCES.give(bounce)
        write_all(self.plain_fd, _view(source, length), offset)

    def close(self) -> None:
        with self._closing:
            if not self.closed:
                self.closed = True
                self.direct.close()
                for fd in (self.plain_fd, self.pidfd, self.lock_fd):
                    if fd is not None:
                        os.close(fd)


def _view(address: int, length: int) -> memoryview:
    return memoryview(ucp.view_of(address, length))
