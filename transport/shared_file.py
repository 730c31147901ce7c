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
bounded pool of aligned bounce buffers (transport/bounce_buffers.py; straight from the
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

import errno
import fcntl
import os
import select
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

from kvpool.common.logging import get_logger
from kvpool.transport import ucp
from kvpool.transport.bounce_buffers import BouncePool
from kvpool.transport.shared_memory import MappingRefused, SegmentFile, handed_over

log = get_logger("kvpool.client.shared_file")

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


class SharedFile:
    """A node's NVMe segment file, held open in this process for writes (``remote_base``:
    where the node has the segment, so a descriptor's remote address translates by offset).
    Shares ``MappedSegment``'s bookkeeping (``pidfd``, ``origin``, ``users``, ``alive``,
    ``close``) so that the same tables keep both."""

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
    ) -> None:
        self.direct_fd = direct_fd
        self.plain_fd = plain_fd
        self.size = size
        self.remote_base = remote_base
        self.pidfd = pidfd
        self.origin = origin
        self.users = 0
        self.closed = False
        #: False once the file system turned a direct write down: the plain descriptor then.
        self.direct_usable = True
        self._closing = threading.Lock()

    @classmethod
    def open(cls, file: SegmentFile) -> SharedFile:
        """Opens the node's file for writes; MappingRefused when this process cannot reach
        it. With ``file.socket_name`` the node hands both descriptors over there under
        ``file.grant``; else they are opened as ``/proc/<pid>/fd/<fd>`` (a node of this
        process's user that lets it)."""
        pid = file.pid
        try:
            pidfd = os.pidfd_open(pid)  # first: the pid cannot be reused while we hold this
        except OSError as error:
            raise MappingRefused(error.errno, f"node process {pid}: {error.strerror}") from None
        opened: list[int] = []
        try:
            if file.socket_name:
                opened = handed_over(file.socket_name, pid, True, file.grant, count=2)
                where = f"the file node process {pid} handed over"
            else:
                where = f"/proc/{pid}/fd/{file.fd}"
                for flags in (os.O_RDWR | os.O_DIRECT, os.O_RDWR):
                    try:
                        opened.append(os.open(where, flags | os.O_CLOEXEC))
                    except OSError as error:
                        raise MappingRefused(error.errno, f"{where}: {error.strerror}") from None
            for fd in opened:
                stat = os.fstat(fd)
                if (stat.st_ino, stat.st_dev) != (file.inode, file.device) or (
                    stat.st_size < file.size
                ):
                    raise MappingRefused(0, f"{where} is not the advertised segment")
            if not os.O_DIRECT & _flags(opened[0]):
                raise MappingRefused(0, f"{where}: the first descriptor is not for direct I/O")
        except BaseException:
            for fd in opened:
                os.close(fd)
            os.close(pidfd)
            raise
        return cls(opened[0], opened[1], file.size, file.remote_base, pidfd, file.origin(True))

    def alive(self) -> bool:
        """False once the node process has exited (its pidfd turns readable)."""
        if self.closed:
            return False
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    def offset_of(self, remote_address: int, length: int) -> int:
        """Where ``remote_address`` lies in the file; ValueError outside the segment."""
        offset = remote_address - self.remote_base
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"range {remote_address:#x}+{length} lies outside the segment")
        return offset

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
            _write_all(self.plain_fd, _view(source, head_end - offset), offset)
        pieces = [(at, min(PIECE, tail_start - at)) for at in range(head_end, tail_start, PIECE)]
        if len(pieces) == 1:
            if not self._write_piece(offset, source, *pieces[0], deadline):
                return False
        elif pieces:
            running = [
                _PIECE_WRITERS.submit(self._write_piece, offset, source, at, size, deadline)
                for at, size in pieces
            ]
            futures.wait(running)  # (each piece is one bounded write: none touches memory after)
            if not all([piece.result() for piece in running]):  # (raises a piece's error)
                return False
        if end > tail_start:
            if time.monotonic() >= deadline:
                return False
            _write_all(self.plain_fd, _view(source + (tail_start - offset), end - tail_start),
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
        if self.direct_usable:
            if source % BLOCK == 0:
                if self._direct(_view(source, length), offset):
                    return
            elif (bounce := BOUNCES.take()) is not None:
                try:
                    view = memoryview(bounce.memory)[:length]
                    view[:] = _view(source, length)
                    if self._direct(view, offset):
                        return
                finally:
                    BOUNCES.give(bounce)
        _write_all(self.plain_fd, _view(source, length), offset)

    def _direct(self, data: memoryview, offset: int) -> bool:
        try:
            _write_all(self.direct_fd, data, offset)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            self.direct_usable = False  # (an alignment the file system wants larger)
            log.warning("direct writes turned down: writing through the page cache")
            return False
        return True

    def close(self) -> None:
        with self._closing:
            if not self.closed:
                self.closed = True
                for fd in (self.direct_fd, self.plain_fd, self.pidfd):
                    os.close(fd)


def _flags(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_GETFL)


def _view(address: int, length: int) -> memoryview:
    return memoryview(ucp.view_of(address, length))


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)
