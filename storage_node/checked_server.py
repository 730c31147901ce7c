"""The storage node's side of the checked stream: every transfer checked before a byte moves.

Peers that do not share the node's host move bytes over this TCP listener rather than UCX
(whose TCP transport writes wherever a peer names: docs/security.md). Each request carries a
capability (security/capabilities.py); the node verifies it locally with the keys its master
delivered over the node's authenticated session: its tag, its key and term, its expiry, that
it names a segment of this node, that its range covers exactly the bytes touched, and its
rights. Only then does it ``recv_into`` the segment's memory (a write) or ``sendall`` from it
(a read), in chunks: the same kernel copies as UCX's TCP transport, no copy in between.

**The expiry is enforced here**, not by the writer's courtesy: before each chunk the node
compares the capability's expiry (plus the allowed clock skew) with its estimate of the
master's clock and bounds the socket's timeout by the time left, so that bytes arriving after
the capability ended never reach the segment; the connection is closed then.

**Seals.** A write grant's id is its put's id (the object's generation). Once the node has
recorded that object (the master's Persist: it is about to be published), the write grant
is refused (``Seals``): a published object's writer can change nothing more, so the master
may reuse its space as soon as its readers are done.

**Hostile peers.** Headers are parsed strictly (transport/checked_frames.py). A refusal is
answered with its status while the stream is in step (a refused write's payload is read and
dropped when it is small, else the connection is closed after the answer); a malformed
header is answered and the connection closed. Every wait has a deadline (an idle connection
is closed after ``idle_timeout``, a stalled transfer after ``io_timeout``), connections are
bounded (``max_connections``: more are closed at once), and nothing a peer sends stops the
listener. Threads with blocking sockets: the copies release the GIL.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Counter

from kvpool.common.logging import get_logger
from kvpool.security import capabilities as caps
from kvpool.storage_node.segment import Segment
from kvpool.transport import checked_frames as frames

log = get_logger("kvpool.node.checked")

#: Bytes moved per socket call, and between two checks of the capability's expiry.
CHUNK = 8 << 20
#: Reads up to this size go out with their answer's header in one send.
SMALL = 64 << 10
#: A refused write's payload up to this size is read and dropped, keeping the connection in
#: step (its writer then learns why); a larger one ends the connection.
DRAIN_LIMIT = 64 << 20

REQUESTS = Counter(
    "kvpool_node_checked_requests_total",
    "Transfers on the checked stream, by op (write, read) and outcome (ok, or why refused).",
    ["op", "outcome"],
)
BYTES = Counter(
    "kvpool_node_checked_bytes_total",
    "Payload bytes moved on the checked stream, by direction (in: written, out: read).",
    ["direction"],
)


@dataclass(frozen=True, slots=True)
class NodeKeys:
    """What a node checks capabilities with, as its master last delivered it."""

    ring: caps.KeyRing
    term: int = 0
    max_skew_ms: int = caps.DEFAULT_MAX_SKEW_MS


class Seals:
    """Objects this node recorded, by segment and offset, with their generation: a write
    grant of that generation or older for that offset is refused. Thread-safe."""

    def __init__(self) -> None:
        self._sealed: dict[bytes, dict[int, int]] = {}
        self._lock = threading.Lock()

    def seal(self, segment_id: str, objects: Iterable[tuple[int, int]]) -> None:
        """``objects``: (offset, generation) of objects just recorded."""
        digest = caps.segment_digest(segment_id)
        with self._lock:
            sealed = self._sealed.setdefault(digest, {})
            for offset, generation in objects:
                if sealed.get(offset, -1) < generation:
                    sealed[offset] = generation

    def unseal(self, segment_id: str, objects: Iterable[tuple[int, int]]) -> None:
        """Objects forgotten: a later put there has a newer generation anyway."""
        digest = caps.segment_digest(segment_id)
        with self._lock:
            sealed = self._sealed.get(digest)
            if sealed is not None:
                for offset, generation in objects:
                    if sealed.get(offset) == generation:
                        del sealed[offset]

    def sealed(self, segment: bytes, offset: int, generation: int) -> bool:
        sealed = self._sealed.get(segment)
        return sealed is not None and sealed.get(offset, -1) >= generation


class _Closed(Exception):
    """The connection ends here (its peer left, stalled, or fell out of step)."""


class CheckedServer:
    """Serves the checked stream for ``segments`` until ``stop``.

    ``keys()`` returns the keys to check with now (None: none delivered yet, so every
    request is refused as UNKNOWN_KEY); ``clock()`` is the node's estimate of the master's
    wall clock, in seconds since the epoch."""

    def __init__(
        self,
        segments: Iterable[Segment],
        keys: Callable[[], NodeKeys | None],
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        max_connections: int = 256,
        idle_timeout: float = 120.0,
        io_timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        seals: Seals | None = None,
    ) -> None:
        self.seals = seals or Seals()
        self._segments = {caps.segment_digest(s.segment_id): s for s in segments}
        self._keys = keys
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.io_timeout = io_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        self._listener = socket.create_server((host, port), backlog=128)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="kvpool-checked-accept", daemon=True
        )

    def start(self) -> None:
        self._acceptor.start()
        log.info("checked stream listening", port=self.port)

    def stop(self, timeout: float = 5.0) -> bool:
        """Stops listening and ends every connection; True once no thread touches a segment
        any more (then the segments may be closed)."""
        with self._lock:
            self._stopping = True
            connections = list(self._connections)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        if self._acceptor.is_alive():
            self._acceptor.join(timeout)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    # ---- connections

    def _accept_loop(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                if self._stopping:
                    return
                time.sleep(0.01)  # (out of descriptors: let others finish)
                continue
            with self._lock:
                if self._stopping or len(self._connections) >= self.max_connections:
                    connection.close()
                    REQUESTS.labels("connect", "too_many_connections").inc()
                    continue
                self._connections.add(connection)
                thread = threading.Thread(
                    target=self._serve, args=(connection,), name="kvpool-checked", daemon=True
                )
                self._threads.add(thread)
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            header = bytearray(frames.REQUEST_SIZE)
            while not self._stopping:
                if not self._receive(connection, memoryview(header), self.idle_timeout, True):
                    return  # the peer left between requests
                self._handle(connection, header)
        except (_Closed, OSError):
            pass
        except Exception as error:  # (a bug must not stop the node; log it)
            log.error("checked stream connection failed", error=repr(error))
        finally:
            with self._lock:
                self._connections.discard(connection)
                self._threads.discard(threading.current_thread())
            connection.close()

    def _handle(self, connection: socket.socket, header: bytearray) -> None:
        try:
            request = frames.parse_request(header)
        except frames.FrameError as error:
            self._refuse(connection, 0, "unknown", frames.Status.BAD_REQUEST, str(error))
            raise _Closed from None
        op = "write" if request.op is frames.Op.WRITE else "read"
        rights = caps.Rights.WRITE if request.op is frames.Op.WRITE else caps.Rights.READ
        status, why, capability, segment = self._check(request, rights)
        if status is not frames.Status.OK:
            self._refuse(connection, request.request_id, op, status, why)
            if request.op is frames.Op.WRITE:
                self._drop_payload(connection, request.length)
            return
        assert capability is not None and segment is not None
        ends_at = (capability.expiry_ms + self._max_skew_ms()) / 1000.0
        if request.op is frames.Op.WRITE:
            self._write(connection, request, segment, ends_at)
        else:
            self._read(connection, request, segment, ends_at)
        REQUESTS.labels(op, "ok").inc()

    def _check(
        self, request: frames.Request, rights: caps.Rights
    ) -> tuple[frames.Status, str, caps.Capability | None, Segment | None]:
        keys = self._keys()
        if keys is None:
            return frames.Status.UNKNOWN_KEY, "no capability keys from the master yet", None, None
        try:
            digest = caps.parse(request.capability).segment
        except caps.CapabilityError as error:
            return frames.REFUSAL_STATUS[error.refusal], str(error), None, None
        segment = self._segments.get(digest)
        if segment is None:
            return frames.Status.NO_SEGMENT, "no segment of this node", None, None
        if request.offset + request.length > segment.size:
            return frames.Status.OUT_OF_RANGE, "beyond the segment", None, None
        try:
            capability = keys.ring.verify(
                request.capability,
                now_ms=int(self._clock() * 1000),
                segment=digest,
                offset=request.offset,
                length=request.length,
                rights=rights,
                min_term=keys.term,
                max_skew_ms=keys.max_skew_ms,
            )
        except caps.CapabilityError as error:
            return frames.REFUSAL_STATUS[error.refusal], str(error), None, None
        if rights is caps.Rights.WRITE and self.seals.sealed(
            digest, capability.offset, capability.grant_id
        ):
            return frames.Status.SEALED, "its object was recorded: no more writes", None, None
        return frames.Status.OK, "", capability, segment

    def _max_skew_ms(self) -> int:
        keys = self._keys()
        return keys.max_skew_ms if keys is not None else 0

    def _refuse(
        self,
        connection: socket.socket,
        request_id: int,
        op: str,
        status: frames.Status,
        why: str,
    ) -> None:
        REQUESTS.labels(op, status.name.lower()).inc()
        log.warning("checked transfer refused", op=op, status=status.name, why=why)
        connection.settimeout(self.io_timeout)
        connection.sendall(frames.encode_reply(request_id, status))

    def _drop_payload(self, connection: socket.socket, length: int) -> None:
        """Reads a refused write's payload and drops it (small ones), else ends the
        connection: either way nothing of it reaches a segment."""
        if length > DRAIN_LIMIT:
            raise _Closed
        scratch = memoryview(bytearray(min(length, CHUNK)))
        left = length
        while left:
            self._receive(connection, scratch[: min(left, CHUNK)], self.io_timeout, False)
            left -= min(left, CHUNK)

    def _write(
        self, connection: socket.socket, request: frames.Request, segment: Segment, ends_at: float
    ) -> None:
        with memoryview(segment.memory) as memory:
            target = memory[request.offset : request.offset + request.length]
            try:
                self._receive(connection, target, self.io_timeout, False, ends_at)
            finally:
                target.release()
        BYTES.labels("in").inc(request.length)
        connection.sendall(frames.encode_reply(request.request_id, frames.Status.OK, 0))

    def _read(
        self, connection: socket.socket, request: frames.Request, segment: Segment, ends_at: float
    ) -> None:
        connection.settimeout(self._timeout(ends_at))
        reply = frames.encode_reply(request.request_id, frames.Status.OK, request.length)
        if request.length <= SMALL:  # (one send: a copy of a few KiB costs less than two)
            end = request.offset + request.length
            connection.sendall(reply + segment.memory[request.offset : end])
            BYTES.labels("out").inc(request.length)
            return
        connection.sendall(reply)
        with memoryview(segment.memory) as memory:
            source = memory[request.offset : request.offset + request.length]
            try:
                at, end = 0, request.length
                while at < end:
                    connection.settimeout(self._timeout(ends_at))
                    connection.sendall(source[at : min(end, at + CHUNK)])
                    at = min(end, at + CHUNK)
            finally:
                source.release()
        BYTES.labels("out").inc(request.length)

    def _timeout(self, ends_at: float | None) -> float:
        """The socket timeout of the next chunk: the io timeout, cut to the capability's
        remaining life; raises _Closed when that is over."""
        if ends_at is None:
            return self.io_timeout
        left = ends_at - self._clock()
        if left <= 0:
            REQUESTS.labels("transfer", "expired_midway").inc()
            log.warning("capability expired during a transfer: connection closed")
            raise _Closed
        return min(self.io_timeout, left)

    def _receive(
        self,
        connection: socket.socket,
        into: memoryview,
        timeout: float,
        eof_ok: bool,
        ends_at: float | None = None,
    ) -> bool:
        """Fills ``into`` from the connection; False on a clean end of stream before the
        first byte (when ``eof_ok``). Each call waits at most ``timeout`` and never past
        ``ends_at`` (the capability's end: nothing arriving later is written)."""
        at, end = 0, len(into)
        while at < end:
            connection.settimeout(min(timeout, self._timeout(ends_at)))
            try:
                got = connection.recv_into(into[at : min(end, at + CHUNK)])
            except TimeoutError:
                raise _Closed from None
            if not got:
                if at == 0 and eof_ok:
                    return False
                raise _Closed
            at += got
        return True
