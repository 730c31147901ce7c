"""One connection of the checked stream, on a thread of its own (storage_node/checked_server.py
says what is checked, and why).

**Few system calls per request.** A client sends its requests pipelined (a batch of small
gets is a few KiB of headers in one send), so the connection reads what has come into a
buffer of its own, as much as is there, and handles every request found in it. The answers
wait in a list (header, and for a small read the segment's bytes: a view, no copy) and go
out in one ``sendmsg`` once no complete request is left to handle. A small write's payload
is copied from that buffer into the segment (a few KiB: less than a call); a large one is
received straight into the segment. Waits are the kernel's (transport/checked_socket.py).
An NVMe segment whose blocks are not all reserved (``--nvme-sparse``) is written with
``pwrite`` to its file instead, never through its mapping: its disk may fill, and a full disk
is then an error its writer is answered (DISK_ERROR), not a SIGBUS that kills the node.

**Nothing late lands.** A write's bytes are copied or received into the segment only while
its capability runs (the node's estimate of the master's clock against its expiry plus the
allowance); a receive straight into the segment never waits past that end. Past it the
connection is closed. A read answered later than its capability's end is not sent either.

**Seals.** A transfer runs only once ``Seals.admit`` let it, and counts as in flight until
its bytes left or reached the segment (``leave``): a Forget shuts its connection down and
waits for that (storage_node/checked_seals.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import math
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import google_crc32c

from kvpool.common.file_writes import write_all
from kvpool.common.log_throttle import LogThrottle
from kvpool.common.logging import get_logger
from kvpool.common.status import Tier
from kvpool.security import capabilities as caps
from kvpool.storage_node.checked_seals import Seals
from kvpool.storage_node.checked_writes import WrittenRanges
from kvpool.storage_node.direct_writes import (
    BLOCK,
    BOUNCES,
    DirectReadRefused,
    DirectWriter,
    read_error,
    uncached_pieces,
)
from kvpool.storage_node.metrics import DIRECT_READ_BYTES, DIRECT_WRITE_BYTES, DISK_ERRORS
from kvpool.transport import checked_frames as frames
from kvpool.transport import ucp
from kvpool.transport.checked_socket import Waits

if TYPE_CHECKING:
    from kvpool.storage_node.checked_server import NodeKeys

log = get_logger("kvpool.node.checked")
#: Refusals are logged at a bounded rate (a peer chooses how many it causes); the
#: ``kvpool_node_checked_requests_total`` counter counts every one.
REFUSAL_LOGS = LogThrottle()
DISK_ERROR_LOGS = LogThrottle()


class _DiskFailed(Exception):
    """An NVMe segment's disk failed a read: before any byte of its answer was sent, or
    ``midway`` (the answer cannot be taken back: the connection ends)."""

    def __init__(self, error: OSError, *, midway: bool) -> None:
        super().__init__(f"the node's disk failed to read the object: {error}")
        self.error = error
        self.midway = midway


class _WriteFailed(Exception):
    """An NVMe segment's disk refused a write's bytes (ENOSPC on a full file system, EIO):
    answered DISK_ERROR once the ``unread`` rest of its payload is read and dropped, so that
    its writer hears why on a connection still in step (``_write_failed``)."""

    def __init__(self, error: OSError, *, unread: int) -> None:
        super().__init__(f"the node's disk failed to write the object: {error}")
        self.error = error
        self.unread = unread


def _unreserved_file(segment: Any) -> int | None:
    """The data file of an NVMe segment whose blocks are not all reserved on its disk
    (``--nvme-sparse``, or a file system that cannot reserve them), which the connection
    writes with ``pwrite``: a store into a hole of its mapping on a full disk (or a page the
    disk cannot read in) is a SIGBUS that kills the node, where ``pwrite`` fails with
    ENOSPC (EIO), an error its writer is answered. None: stores go through the mapping
    (every block allocated, so none faults for space; and a copy costs less than a call).
    A segment that does not say (the server's tests' stand-ins) is written through it."""
    if segment.tier is not Tier.NVME or getattr(segment, "space_reserved", True):
        return None
    fd: int | None = getattr(segment, "fd", None)
    return fd


def _disk_error(op: str, segment: Any, offset: int, length: int, error: OSError) -> None:
    """Counts and logs (a few lines per 10 s) a transfer the segment's disk failed: the
    object there may be unreadable, which the operator should hear of."""
    DISK_ERRORS.labels(op).inc()
    if (suppressed := DISK_ERROR_LOGS.allow(op)) is not None:
        log.error(
            "disk error on a checked transfer",
            op=op,
            segment=getattr(segment, "segment_id", "?"),
            offset=offset,
            length=length,
            error=str(error),
            suppressed=suppressed,
        )


#: Bytes moved per socket call into or out of a segment, and between two checks of the
#: capability's expiry.
CHUNK = 8 << 20
#: Reads up to this size are answered from a view of the segment gathered with others;
#: writes up to this size are received into the connection's buffer first.
SMALL = 64 << 10
#: The connection's receive buffer.
BUFFER = 1 << 20
#: Answers gathered at most before they are sent (below the kernel's IOV_MAX of 1024).
MAX_PARTS = 512
#: Bytes of answers gathered at most before they are sent.
MAX_GATHERED = 4 << 20
#: A refused write's payload up to this size is read and dropped, keeping the connection in
#: step (its writer then learns why); a larger one ends the connection.
DRAIN_LIMIT = 64 << 20
#: The slowest a refused write's payload may arrive, beyond the io timeout (bytes a second).
DRAIN_RATE_FLOOR = 1 << 20
#: The slowest the answers gathered may leave, beyond the io timeout (bytes a second).
SEND_RATE_FLOOR = 1 << 20
#: The slowest a large write's payload may arrive, or a large read's answer leave, beyond the
#: io timeout (bytes a second): each wait is bounded by the io timeout, so without a bound on
#: the whole, a peer trickling a byte now and then held its connection (one of the node's
#: few) for as long as its capability ran, minutes, and a few such held them all.
TRANSFER_RATE_FLOOR = 1 << 20

_WRITE, _READ = int(frames.Op.WRITE), int(frames.Op.READ)
_OK = frames.Status.OK
_pack_reply = frames.pack_reply  # (an OK answer's header, as encode_reply makes it)
_unpack_request = frames.unpack_request_fields  # (a header's fields, unchecked)
_REQUEST_MAGIC, _REPLY_MAGIC, _VERSION = frames.REQUEST_MAGIC, frames.REPLY_MAGIC, frames.VERSION
_REQUEST_SIZE = frames.REQUEST_SIZE


class Closed(Exception):
    """The connection ends here (its peer left, stalled, or fell out of step)."""


class Counters:
    """The metrics a connection counts (checked_server.py makes them)."""

    def __init__(self, requests: Any, moved: Any) -> None:
        self.requests = requests
        self.ok = {_WRITE: requests.labels("write", "ok"), _READ: requests.labels("read", "ok")}
        self.bytes_in = moved.labels("in")
        self.bytes_out = moved.labels("out")


class Activity:
    """What the server weighs when it must make room for a new connection: when it opened
    and since when it has waited between requests (monotonic; None while it handles one),
    and whether a transfer was ever admitted on it.

    A connection with no transfer ever admitted may be chosen to make room at any point of
    a request, even midway through its header: nothing of a transfer runs on it, and a peer
    without a capability that sent a byte of a header must not hold its place for the io
    timeout (enough such connections would keep every new client out). ``admit`` and
    ``evict`` decide under one lock which came first, so that a connection chosen to make
    room admits no transfer, and one whose first transfer was admitted is not chosen
    midway through it."""

    __slots__ = ("_lock", "admitted", "evicted", "opened", "waiting_since")

    def __init__(self) -> None:
        self.opened = time.monotonic()
        self.waiting_since: float | None = self.opened
        self.admitted = False
        self.evicted = False
        self._lock = threading.Lock()

    def admit(self) -> None:
        """Marks the connection as one with a transfer: called once a request's capability
        checked out, before the seals admit its first transfer (a peer needs a capability
        to get here). Raises ``Closed`` if the server chose the connection to make room
        already (it is being shut down): no transfer starts on it."""
        with self._lock:
            if self.evicted:
                raise Closed
            self.admitted = True

    def evict(self) -> bool:
        """Chooses the connection to make room for a new one (its thread is then shut down):
        False, leaving it be, where it handles a request and a transfer was admitted on it
        (a transfer may be under way: never cut off for a new connection)."""
        with self._lock:
            if self.admitted and self.waiting_since is None:
                return False
            self.evicted = True
            return True


class CheckedConnection:
    def __init__(
        self,
        connection: socket.socket,
        *,
        segments: dict[bytes, Any],
        keys: Callable[[], NodeKeys | None],
        clock: Callable[[], float],
        seals: Seals,
        counters: Counters,
        io_timeout: float,
        idle_timeout: float,
        stopping: Callable[[], bool],
        activity: Activity | None = None,
        written: WrittenRanges | None = None,
    ) -> None:
        """``written``: told of every write that lands, where the node follows them
        (storage_node/checked_writes.py); None: nothing asks."""
        self._connection = connection
        self._written_ranges = written
        self.activity = activity or Activity()
        self._segments = segments
        self._keys = keys
        self._clock = clock
        self._seals = seals
        self._counters = counters
        self._io_timeout = io_timeout
        #: When the large transfer under way must be over (time.monotonic(); see
        #: TRANSFER_RATE_FLOOR), infinite between them.
        self._transfer_ends = math.inf
        self._idle_timeout = idle_timeout
        self._stopping = stopping
        self._waits = Waits(connection)
        self._buffer = bytearray(BUFFER)
        self._view = memoryview(self._buffer)
        #: The buffer's address, for copies that release the GIL (it is never resized).
        self._pinned = (ctypes.c_char * BUFFER).from_buffer(self._buffer)
        self._buffer_at = ctypes.addressof(self._pinned)
        self._start = 0  # (the first byte not handled yet)
        self._end = 0  # (after the last byte received)
        #: Answers not sent yet, in order; the reads among them (segment digest, grant
        #: offset), in flight until sent; the earliest end of their capabilities.
        self._parts: list[bytes | memoryview] = []
        self._gathered = 0
        self._reads: list[tuple[bytes, int]] = []
        self._reads_end = float("inf")
        self._read_bytes = 0
        self._memory: dict[bytes, memoryview] = {}
        #: Where each NVMe segment is mapped: stores into it are copied with ``memmove``,
        #: which releases the GIL (a store may wait for the disk: see ``_store``). 0 for one
        #: whose blocks are not all reserved: its bytes are written to its file (``_files``).
        self._on_disk: dict[bytes, int] = {}
        self._files: dict[bytes, int] = {}
        self._longest_ms = int(seals.longest_grant * 1000)
        #: Writes done whose answers are not sent yet, and their bytes (counted then).
        self._writes = 0
        self._written = 0

    def serve(self) -> None:
        """Handles requests until the peer leaves (returns) or the stream must end
        (``Closed``, ``OSError``)."""
        try:
            while not self._stopping():
                if self._end - self._start < frames.REQUEST_SIZE:
                    if not self._receive_more(frames.REQUEST_SIZE):
                        return  # the peer left between requests
                    continue
                self._handle_buffered()
        finally:
            self._seals.leave_all(self._reads, self._connection)
            self._parts.clear()
            for memory in self._memory.values():
                with contextlib.suppress(BufferError):
                    memory.release()

    # ---- requests

    def _handle_buffered(self) -> None:
        """Handles the requests buffered. The common ones (a small read; a small write whose
        bytes are all buffered) are handled in this loop, with what they share looked up
        once; the first other one (anything refused, large, or a write still arriving) goes
        to ``_handle``, which may wait, and then this returns. The rules are ``_handle``'s:
        the capability checked on the clock read for each request, the seal admitted before
        a byte moves, a write's bytes copied only while its capability runs."""
        keys = self._keys()
        if keys is None:
            self._handle()
            return
        check, term, skew_ms = keys.ring.check, keys.term, keys.max_skew_ms
        buffer, view, memories = self._buffer, self._view, self._memory
        segment_of, clock, seals = self._segments.get, self._clock, self._seals
        wrote = self._written_ranges.wrote if self._written_ranges is not None else None
        on_disk, buffer_at, memmove = self._on_disk.get, self._buffer_at, ctypes.memmove
        connection, parts, reads = self._connection, self._parts, self._reads
        longest_ms, end, size = self._longest_ms, self._end, _REQUEST_SIZE
        activity = self.activity
        start = self._start
        while end - start >= size:
            magic, version, op, reserved, request_id, capability, offset, length = _unpack_request(
                buffer, start
            )
            write = op == _WRITE
            if (
                magic != _REQUEST_MAGIC
                or version != _VERSION
                or reserved
                or not 0 < length <= SMALL
                or (not write and op != _READ)
                or (write and end - start - size < length)
            ):
                break
            now_ms = int(clock() * 1000)
            checked = check(capability, now_ms, offset, length, 2 if write else 1, term, skew_ms)
            if checked is None:
                break
            digest, grant_offset, expiry_ms, grant_id = checked
            segment = segment_of(digest)
            if segment is None or offset + length > segment.size or expiry_ms > now_ms + longest_ms:
                break  # (_handle checks it again, and says why it is refused)
            if not activity.admitted:
                activity.admit()
            if not seals.admit(digest, grant_offset, grant_id, write, connection):
                break
            ends_at = (expiry_ms + skew_ms) / 1000.0
            memory = memories.get(digest) or self._segment_memory(digest, segment)
            if write:
                payload = start + size
                failed: OSError | None = None
                try:
                    if clock() > ends_at:
                        raise self._expired()
                    mapped_at = on_disk(digest)
                    if mapped_at is None:  # (DRAM: a copy that never waits for a disk)
                        memory[offset : offset + length] = view[payload : payload + length]
                    elif mapped_at:
                        memmove(mapped_at + offset, buffer_at + payload, length)
                    else:  # (no blocks reserved: written to the file, see _unreserved_file)
                        try:
                            self._store(digest, memory, offset, buffer_at + payload, length)
                        except OSError as error:
                            failed = error
                    if wrote is not None and failed is None:
                        wrote(digest, grant_offset, grant_id, offset, offset + length)
                finally:
                    seals.leave(digest, grant_offset, connection)
                start = self._start = payload + length
                if failed is not None:  # (its payload was all buffered: nothing left to drop)
                    self._write_failed(request_id, segment, offset, length, failed, 0)
                    continue
                self._writes += 1  # (counted as the answers go)
                self._written += length
                parts.append(_pack_reply(_REPLY_MAGIC, _VERSION, 0, 0, request_id, 0))
            else:
                start = self._start = start + size
                reads.append((digest, grant_offset))  # (in flight until sent: _flush)
                if ends_at < self._reads_end:
                    self._reads_end = ends_at
                self._read_bytes += length
                parts.append(_pack_reply(_REPLY_MAGIC, _VERSION, 0, 0, request_id, length))
                parts.append(memory[offset : offset + length])
                self._gathered += length
            if len(parts) >= MAX_PARTS or self._gathered >= MAX_GATHERED:
                self._flush()
        else:
            return
        self._handle()

    def _handle(self) -> None:
        start = self._start
        try:
            op, request_id, capability, offset, length = frames.unpack_request(self._buffer, start)
        except frames.FrameError as error:
            self._refuse(0, "unknown", frames.Status.BAD_REQUEST, str(error))
            self._flush()
            raise Closed from None
        self._start = start + frames.REQUEST_SIZE
        write = op == _WRITE
        keys = self._keys()
        now_ms = int(self._clock() * 1000)
        checked = None
        if keys is not None:  # (positional: this runs for every transfer)
            checked = keys.ring.check(
                capability, now_ms, offset, length, 2 if write else 1, keys.term, keys.max_skew_ms
            )
        segment = self._segments.get(checked[0]) if checked is not None else None
        if checked is None or segment is None or offset + length > segment.size:
            status, why = self._why(keys, capability, offset, length, write, now_ms)
            self._refused(request_id, write, length, status, why)
            return
        assert keys is not None
        digest, grant_offset, expiry_ms, grant_id = checked
        if expiry_ms > now_ms + self._longest_ms:
            # (a grant must end within the time its seal is kept: checked_seals.py)
            why = "the capability runs too far ahead"
            self._refused(request_id, write, length, frames.Status.EXPIRED, why)
            return
        connection = self._connection
        if not self.activity.admitted:
            self.activity.admit()
        if not self._seals.admit(digest, grant_offset, grant_id, write, connection):
            why = "its object was recorded: no more writes" if write else "its object is gone"
            self._refused(request_id, write, length, frames.Status.SEALED, why)
            return
        ends_at = (expiry_ms + keys.max_skew_ms) / 1000.0
        if not write:  # (small ones are gathered: the common case is _handle_buffered's)
            with self._transfer(length):
                self._read(
                    request_id, digest, (grant_offset, grant_id), segment, offset, length, ends_at
                )
            return
        unwritten: _WriteFailed | None = None
        try:
            with self._transfer(length):
                self._write(segment, digest, offset, length, ends_at, (grant_offset, grant_id))
            if self._written_ranges is not None:
                self._written_ranges.wrote(digest, grant_offset, grant_id, offset, offset + length)
        except _WriteFailed as failed:
            unwritten = failed
        finally:
            # (left before the answer: its writer's commit, then the Persist, follow it)
            self._seals.leave(digest, grant_offset, connection)
        if unwritten is not None:
            self._write_failed(
                request_id, segment, offset, length, unwritten.error, unwritten.unread
            )
            return
        self._writes += 1  # (counted as the answers go)
        self._written += length
        self._answer(frames.encode_reply(request_id, _OK, 0))

    def _why(
        self,
        keys: NodeKeys | None,
        capability: bytes,
        offset: int,
        length: int,
        write: bool,
        now_ms: int,
    ) -> tuple[frames.Status, str]:
        """Why a request is refused (the slow path: ``verify`` says which check failed)."""
        if keys is None:
            return frames.Status.UNKNOWN_KEY, "no capability keys from the master yet"
        try:
            digest = caps.parse(capability).segment
        except caps.CapabilityError as error:
            return frames.REFUSAL_STATUS[error.refusal], str(error)
        segment = self._segments.get(digest)
        if segment is None:
            return frames.Status.NO_SEGMENT, "no segment of this node"
        if offset + length > segment.size:
            return frames.Status.OUT_OF_RANGE, "beyond the segment"
        try:
            keys.ring.verify(
                capability,
                now_ms=now_ms,
                segment=digest,
                offset=offset,
                length=length,
                rights=caps.Rights.WRITE if write else caps.Rights.READ,
                min_term=keys.term,
                max_skew_ms=keys.max_skew_ms,
            )
        except caps.CapabilityError as error:
            return frames.REFUSAL_STATUS[error.refusal], str(error)
        return frames.Status.FAILED, "refused"  # (not reached: check and verify agree)

    def _refused(
        self, request_id: int, write: bool, length: int, status: frames.Status, why: str
    ) -> None:
        self._refuse(request_id, "write" if write else "read", status, why)
        if write:
            self._drop_payload(length)

    def _write_failed(
        self,
        request_id: int,
        segment: Any,
        offset: int,
        length: int,
        error: OSError,
        unread: int,
    ) -> None:
        """Answers a write whose bytes the segment's disk refused (a full file system, an
        I/O error) DISK_ERROR, counted and logged, having read and dropped the ``unread``
        rest of its payload: its writer learns why, and the connection (and the node) serve
        on; the object is never recorded (its writer's put fails), and its space is freed
        as any failed put's."""
        _disk_error("write", segment, offset, length, error)
        why = f"the node's disk failed to write the object: {error}"
        self._refused(request_id, True, unread, frames.Status.DISK_ERROR, why)

    def _refuse(self, request_id: int, op: str, status: frames.Status, why: str) -> None:
        self._counters.requests.labels(op, status.name.lower()).inc()
        suppressed = REFUSAL_LOGS.allow((op, status))
        if suppressed is not None:
            log.warning(
                "checked transfer refused",
                op=op,
                status=status.name,
                why=why,
                suppressed=suppressed,
            )
        self._answer(frames.encode_reply(request_id, status))

    def _drop_payload(self, length: int) -> None:
        """Reads a refused write's payload and drops it (small ones), else ends the
        connection: either way nothing of it reaches a segment."""
        if length > DRAIN_LIMIT:
            self._flush()  # (its writer learns why)
            raise Closed
        # (one deadline for all of it: a byte every few seconds would hold the thread for
        # as long as the payload is, and no capability is needed to be refused)
        ends = time.monotonic() + self._io_timeout + length / DRAIN_RATE_FLOOR
        while length:
            buffered = min(self._end - self._start, length)
            self._start += buffered
            length -= buffered
            if length:
                self._receive_more(1, max(ends - time.monotonic(), 0.0))

    def _write(
        self,
        segment: Any,
        digest: bytes,
        offset: int,
        length: int,
        ends_at: float,
        grant: tuple[int, int],
    ) -> None:
        """Receives a write's payload into the segment; ``_WriteFailed`` where its disk
        refused the bytes (a direct write, or any write into a segment whose blocks are not
        all reserved: ``_unreserved_file``)."""
        direct = segment.direct if length > SMALL else None
        if direct is not None and self._write_direct(
            direct, digest, segment, offset, length, ends_at, grant
        ):
            return
        memory = self._segment_memory(digest, segment)
        fd = self._files.get(digest)
        if fd is not None:
            self._write_file(fd, offset, length, ends_at)
            return
        target = memory[offset : offset + length]
        try:
            if length <= SMALL and self._end - self._start < length:
                self._receive_more(length, self._until(ends_at))
            buffered = min(self._end - self._start, length)
            if buffered:
                if self._clock() > ends_at:
                    raise self._expired()
                start = self._start
                self._store(digest, target, offset, self._buffer_at + start, buffered)
                self._start = start + buffered
            if buffered < length:
                self._receive_into(target[buffered:], ends_at)
        finally:
            target.release()

    def _write_direct(
        self,
        direct: DirectWriter,
        digest: bytes,
        segment: Any,
        offset: int,
        length: int,
        ends_at: float,
        grant: tuple[int, int],
    ) -> bool:
        """A write into an NVMe segment past the page cache (storage_node/direct_writes.py):
        received piece by piece into a bounce buffer, checksummed there, then written: whole
        pages directly, the partial pages at either end as ``_store`` stores them (through
        the mapping, or to the file). False, having received nothing, when it holds no whole
        page or no bounce buffer is free (the caller writes it another way). ``_WriteFailed``
        where the disk refused a piece (its part then has no checksum: never recorded)."""
        end = offset + length
        first = min(end, -(-offset // BLOCK) * BLOCK)
        last = max(first, end // BLOCK * BLOCK)
        if last == first:
            return False
        bounce = BOUNCES.take()
        if bounce is None:
            return False
        part = direct.parts.begin(grant, offset, length)
        memory = self._segment_memory(digest, segment)
        staged = memoryview(bounce.memory)
        crc = 0
        try:
            at = offset
            while at < end:
                through_disk = first <= at < last
                if through_disk:
                    upto = min(at + len(staged), last)
                elif at < first:
                    upto = first  # (the partial page it starts in)
                else:
                    upto = end  # (the partial page it ends in)
                piece = staged[: upto - at]
                self._fill(piece, ends_at)
                crc = google_crc32c.extend(crc, ucp.view_of(bounce.address, upto - at))
                if self._clock() > ends_at:
                    raise self._expired()
                try:
                    written = through_disk and direct.write(piece, at)
                    if not written:
                        self._store(digest, memory[at:upto], at, bounce.address, upto - at)
                except OSError as error:  # (answered, once the rest is read: _write_failed)
                    raise _WriteFailed(error, unread=end - upto) from None
                finally:
                    piece.release()
                at = upto
        finally:
            staged.release()
            BOUNCES.give(bounce)
        part.crc = crc
        if direct.usable:
            DIRECT_WRITE_BYTES.inc(last - first)
        return True

    def _fill(self, target: memoryview, ends_at: float) -> None:
        """Fills ``target`` with the next bytes of the stream: those buffered, then more."""
        buffered = min(self._end - self._start, len(target))
        if buffered:
            start = self._start
            target[:buffered] = self._view[start : start + buffered]
            self._start = start + buffered
        if buffered < len(target):
            self._receive_into(target[buffered:], ends_at)

    def _write_file(self, fd: int, offset: int, length: int, ends_at: float) -> None:
        """Writes a write's payload into the file ``fd`` of an NVMe segment whose blocks are
        not all reserved (``_unreserved_file``) with ``pwrite``, a buffer at a time through
        the connection's own buffer: a full disk is then ENOSPC (``_WriteFailed``), where a
        store into a hole of the mapping would kill the node with SIGBUS, and a receive
        straight into it would fail the connection (EFAULT) with the stream out of step."""
        at, end = offset, offset + length
        while at < end:
            piece = min(end - at, BUFFER)
            if self._end - self._start < piece:
                self._receive_more(piece, self._until(ends_at))
            if self._clock() > ends_at:
                raise self._expired()
            start = self._start
            try:
                write_all(fd, self._view[start : start + piece], at)
            except OSError as error:  # (the piece, still buffered, is dropped with the rest)
                raise _WriteFailed(error, unread=end - at) from None
            self._start = start + piece
            at += piece

    def _read(
        self,
        request_id: int,
        digest: bytes,
        grant: tuple[int, int],
        segment: Any,
        offset: int,
        length: int,
        ends_at: float,
    ) -> None:
        """``grant``: the object's offset and generation (the capability's)."""
        grant_offset = grant[0]
        source = self._segment_memory(digest, segment)[offset : offset + length]
        if length <= SMALL:  # (sent with the others gathered; in flight until then)
            self._reads.append((digest, grant_offset))
            self._reads_end = min(self._reads_end, ends_at)
            self._read_bytes += length
            self._answer(frames.encode_reply(request_id, _OK, length), source)
            return
        direct = segment.direct  # (NVMe only)
        mapped_at = segment.region.address if direct is not None else 0
        try:
            self._flush()  # (the answers before it)
            with uncached_pieces(direct, mapped_at, offset, length) as pieces:
                try:
                    sent = pieces is not None and self._send_pieces(
                        request_id, pieces, length, ends_at
                    )
                except _DiskFailed as failed:
                    _disk_error("read", segment, offset, length, failed.error)
                    segment.unreadable.note(*grant)  # (the master hears at the next heartbeat)
                    if failed.midway:
                        raise Closed from None  # (its reader tries another replica)
                    self._refuse(request_id, "read", frames.Status.DISK_ERROR, str(failed))
                    return
                if not sent:
                    connection, waits = self._connection, self._waits
                    waits.send(self._until(ends_at))
                    connection.sendall(frames.encode_reply(request_id, _OK, length))
                    at = 0
                    try:
                        while at < length:
                            waits.send(self._until(ends_at))
                            at += connection.send(source[at : min(length, at + CHUNK)])
                    except OSError as error:
                        if error.errno == errno.EFAULT:  # (a page its disk could not read in)
                            _disk_error("read", segment, offset, length, error)
                            segment.unreadable.note(*grant)
                        raise Closed from None
        finally:
            source.release()
            self._seals.leave(digest, grant_offset, self._connection)
        self._counters.ok[_READ].inc()
        self._counters.bytes_out.inc(length)

    def _send_pieces(
        self,
        request_id: int,
        pieces: Generator[memoryview, None, None],
        length: int,
        ends_at: float,
    ) -> bool:
        """Answers a large read of an NVMe segment's bytes that are not in the page cache
        from ``pieces``, read with direct I/O (on this VM a read through the page cache
        faults in a fresh page per 4 KiB, at a fraction of the disk's speed). False, having
        sent nothing, where the file system turns direct reads down. Direct reads see every
        write: the kernel writes dirty cached pages of the range back first."""
        connection, waits = self._connection, self._waits
        try:
            piece: memoryview | None = next(pieces)
        except DirectReadRefused:
            return False
        except OSError as error:
            raise _DiskFailed(error, midway=False) from None
        waits.send(self._until(ends_at))
        connection.sendall(frames.encode_reply(request_id, _OK, length))
        while piece is not None:
            sent = 0
            try:
                while sent < len(piece):
                    waits.send(self._until(ends_at))
                    sent += connection.send(piece[sent:])
            except OSError:
                raise Closed from None  # (its reader left)
            try:
                piece = next(pieces, None)
            except OSError as error:  # (its reader tries again, or another replica)
                raise _DiskFailed(error, midway=True) from None
        DIRECT_READ_BYTES.inc(length)
        return True

    # ---- the connection

    def _answer(self, header: bytes, payload: memoryview | None = None) -> None:
        parts = self._parts
        parts.append(header)
        if payload is not None:
            parts.append(payload)
            self._gathered += len(payload)
        if len(parts) >= MAX_PARTS or self._gathered >= MAX_GATHERED:
            self._flush()

    def _find_unreadable(self, parts: list[Any]) -> None:
        """A send of gathered answers failed on a page of an NVMe segment its disk could not
        read in: which of the small reads among ``parts`` it was, asked of the disk one at a
        time, each counted and noted as a failed read (only on this error path)."""
        spans = [
            (segment.region.address, digest, segment)
            for digest, segment in self._segments.items()
            if segment.direct is not None
        ]
        for part in parts:
            if not isinstance(part, memoryview) or part.readonly or not part.nbytes:
                continue  # (a header)
            address = ctypes.addressof(ctypes.c_char.from_buffer(part))
            for base, digest, segment in spans:
                if base <= address < base + segment.size:
                    offset, length = address - base, part.nbytes
                    error = read_error(segment.direct, offset, length)
                    if error is not None:
                        _disk_error("read", segment, offset, length, error)
                        self._note_unreadable(digest, segment, offset)

    def _note_unreadable(self, digest: bytes, segment: Any, offset: int) -> None:
        """Notes the object a gathered read at ``offset`` was of: the read in flight on this
        connection whose grant (the object's offset) starts nearest below it, with the
        generation its grant named (the seals hold it until the read leaves)."""
        starts = [at for d, at in self._reads if d == digest and at <= offset]
        if not starts:
            return
        grant_offset = max(starts)
        generation = self._seals.generation_in_flight(digest, grant_offset, self._connection)
        if generation is not None:
            segment.unreadable.note(grant_offset, generation)

    def _flush(self) -> None:
        """Sends the answers gathered, in one call as a rule; then their reads are done."""
        parts = self._parts
        if not parts:
            return
        reads, connection = self._reads, self._connection
        if reads:
            self._waits.send(self._until(self._reads_end))
        else:
            self._waits.send(self._io_timeout)
        # (one deadline for all of them: a peer that reads a little now and then, each time
        # before a send's wait runs out, would hold the thread for as long as it liked)
        ends = time.monotonic() + self._io_timeout + self._gathered / SEND_RATE_FLOOR
        while True:
            try:
                sent = connection.sendmsg(parts)
            except OSError as error:
                if error.errno == errno.EFAULT:  # (a page the disk could not read in)
                    self._find_unreadable(parts)
                raise
            done = 0
            while done < len(parts) and sent >= len(parts[done]):
                sent -= len(parts[done])
                done += 1
            if done == len(parts):
                break
            del parts[:done]  # (rare: the kernel took part of it; the rest goes on)
            if sent:
                parts[0] = memoryview(parts[0])[sent:]
            left = ends - time.monotonic()
            if left <= 0:
                raise Closed
            self._waits.send(min(left, self._until(self._reads_end)) if reads else left)
        parts.clear()
        self._gathered = 0
        counters = self._counters
        if self._writes:
            counters.ok[_WRITE].inc(self._writes)
            counters.bytes_in.inc(self._written)
            self._writes = self._written = 0
        if reads:
            self._seals.leave_all(reads, connection)
            counters.ok[_READ].inc(len(reads))
            counters.bytes_out.inc(self._read_bytes)
            reads.clear()
            self._reads_end = float("inf")
            self._read_bytes = 0

    def _receive_more(self, wanted: int, timeout: float | None = None) -> bool:
        """Receives until at least ``wanted`` bytes are buffered past the first not handled;
        False on a clean end of stream before any of them (between requests). The answers
        gathered go out before the connection waits."""
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._buffer) - self._start < wanted:  # (room for it: to the front)
            kept = self._end - self._start
            self._buffer[:kept] = self._view[self._start : self._end]
            self._start, self._end = 0, kept
        connection, view = self._connection, self._view
        between = self._start == self._end and timeout is None
        activity = self.activity
        if between:
            activity.waiting_since = time.monotonic()
        #: Once a request has begun: when all of what is wanted must have come (``timeout``
        #: given: within it, in all; a peer that trickles bytes in holds the thread no longer).
        if between:
            ends = None
        else:
            ends = time.monotonic() + (self._io_timeout if timeout is None else timeout)
        while self._end - self._start < wanted:
            got = -1
            if self._parts:
                try:  # (more requests may have come: answer them together)
                    got = connection.recv_into(view[self._end :], 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    self._flush()
            if got < 0:
                wait = self._idle_timeout if ends is None else max(ends - time.monotonic(), 0.0)
                self._waits.receive(wait)
                try:
                    got = connection.recv_into(view[self._end :])
                except BlockingIOError:
                    raise Closed from None  # (it waited its time: stalled, or idle too long)
            if not got:
                if between and self._start == self._end:
                    return False
                raise Closed
            self._end += got
            if ends is None:
                ends = time.monotonic() + self._io_timeout
                activity.waiting_since = None
        return True

    def _receive_into(self, target: memoryview, ends_at: float) -> None:
        """Fills ``target`` (a segment's bytes) from the connection, never waiting past
        ``ends_at``: bytes arriving later never land."""
        connection, at, end = self._connection, 0, len(target)
        self._flush()
        while at < end:
            self._waits.receive(self._until(ends_at), late=0.0)
            try:  # (all of a chunk in one call, unless the wait, cut to the end, ends first)
                got = connection.recv_into(target[at : min(end, at + CHUNK)], 0, socket.MSG_WAITALL)
            except BlockingIOError:
                if self._clock() < ends_at:
                    continue  # (woke a little early: the capability still runs)
                raise self._expired() from None
            if not got:
                raise Closed
            at += got

    def _until(self, ends_at: float) -> float:
        """The longest a wait may last now: the io timeout, cut to the capability's end and
        to the large transfer's (raises Closed once either has passed)."""
        left = ends_at - self._clock()
        if left <= 0:
            raise self._expired()
        slow = self._transfer_ends - time.monotonic()
        if slow <= 0:
            raise self._too_slow()
        return min(left, self._io_timeout, slow)

    @contextlib.contextmanager
    def _transfer(self, length: int) -> Iterator[None]:
        """A large transfer of ``length`` bytes: all of it within the io timeout and its
        length at TRANSFER_RATE_FLOOR (``_until``), however its bytes trickle. The answers
        gathered before it leave first, under their own deadline (``_flush``); a small one
        (gathered too) has none of its own."""
        if length <= SMALL:
            yield
            return
        self._flush()
        self._transfer_ends = time.monotonic() + self._io_timeout + length / TRANSFER_RATE_FLOOR
        try:
            yield
        finally:
            self._transfer_ends = math.inf

    def _too_slow(self) -> Closed:
        return self._cut_off(
            "too_slow",
            "checked-stream transfer too slow: its connection is closed",
            floor_bytes_per_s=TRANSFER_RATE_FLOOR,
        )

    def _expired(self) -> Closed:
        return self._cut_off(
            "expired_midway", "capability expired during a transfer: connection closed"
        )

    def _cut_off(self, outcome: str, why: str, **fields: Any) -> Closed:
        """A transfer ended midway (``outcome`` in the transfer counter), logged a few lines
        per 10 s: the Closed to raise."""
        self._counters.requests.labels("transfer", outcome).inc()
        suppressed = REFUSAL_LOGS.allow(outcome)
        if suppressed is not None:
            log.warning(why, suppressed=suppressed, **fields)
        return Closed()

    def _segment_memory(self, digest: bytes, segment: Any) -> memoryview:
        memory = self._memory.get(digest)
        if memory is None:
            memory = self._memory[digest] = memoryview(segment.memory)
            if segment.tier is Tier.NVME:
                fd = _unreserved_file(segment)
                if fd is None:
                    self._on_disk[digest] = ctypes.addressof(ctypes.c_char.from_buffer(memory))
                else:
                    self._on_disk[digest] = 0  # (its stores: to the file, ``_store``)
                    self._files[digest] = fd
        return memory

    def _store(
        self, digest: bytes, target: memoryview, offset: int, source: int, length: int
    ) -> None:
        """Copies ``length`` bytes at the address ``source`` into the segment at ``offset``
        (``target``: the segment's view of them). Into an NVMe segment with ``memmove``,
        which releases the GIL: a store into its mapping may wait for the disk (a page
        read in, or ``page_mkwrite`` on a frozen or failing file system), and a copy
        holding the GIL meanwhile would stop every thread of the node, its heartbeats and
        its DRAM tier among them.

        Into an NVMe segment whose blocks are not all reserved, with ``pwrite`` to its file
        (the GIL released too): a store into a hole of its mapping on a full disk is a
        SIGBUS that kills the node, where ``pwrite`` raises OSError (ENOSPC, EIO), which
        the write's writer is answered (``_write_failed``)."""
        mapped_at = self._on_disk.get(digest)
        if mapped_at is None:
            target[:length] = ucp.view_of(source, length)
        elif mapped_at:
            ctypes.memmove(mapped_at + offset, source, length)
        else:
            write_all(self._files[digest], ucp.view_of(source, length), offset)
