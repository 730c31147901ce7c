"""The storage node's side of the checked stream: every transfer checked before a byte moves.

Peers that do not share the node's host move bytes over this TCP listener rather than UCX
(whose TCP transport writes wherever a peer names: docs/security.md). Each request carries a
capability (security/capabilities.py); the node verifies it locally with the keys its master
delivered over the node's authenticated session: its tag, its key and term, its expiry, that
it names a segment of this node, that its range covers exactly the bytes touched, and its
rights. Only then does it move the bytes: each connection's thread
(storage_node/checked_connection.py) handles every pipelined request that has come in one
go and answers them together; small payloads go through its buffer, large ones straight
between the socket and the segment.

**The expiry is enforced here**, not by the writer's courtesy: bytes are copied or
received into the segment only while the capability (plus the allowed clock skew) runs on
the node's estimate of the master's clock, and a receive into the segment never waits past
its end; the connection is closed then.

**Seals.** A grant's id is its put's id (the object's generation). Once the node has
recorded that object (the master's Persist: it is about to be published), its write grant
is refused; once it forgot it (the master's Forget: the object or reservation is gone),
every grant for it is, and transfers in flight under them are interrupted before the node
answers (storage_node/checked_seals.py): the master reuses the space at that answer.

**Hostile peers.** Headers are parsed strictly (transport/checked_frames.py). A refusal is
answered with its status while the stream is in step (a refused write's payload is read and
dropped when it is small, else the connection is closed after the answer); a malformed
header is answered and the connection closed. Every wait has a deadline (an idle connection
is closed after ``idle_timeout``, a stalled transfer, or a request begun and not finished,
after ``io_timeout``), connections are bounded (``max_connections``), and nothing a peer
sends stops the listener. A peer cannot keep others out by holding every connection: when
all are taken, a new one takes the place of one on which no transfer was ever admitted
(such as a peer's without a valid capability), waiting or midway through a header, open
``EVICTABLE_IDLE`` at least; else of the one waiting between requests the longest (as
long at least); else of the oldest with no transfer admitted, however new (``_victim``
says why); else the new one is closed. A transfer under way is never cut off for a new
connection. Threads with blocking sockets: the copies release the GIL.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Counter

from kvpool.common.listen_address import listening_socket
from kvpool.common.log_throttle import LogThrottle
from kvpool.common.logging import get_logger
from kvpool.security import capabilities as caps
from kvpool.storage_node.checked_connection import Activity, CheckedConnection, Closed, Counters
from kvpool.storage_node.checked_seals import Seals
from kvpool.storage_node.checked_writes import WrittenRanges
from kvpool.storage_node.segment import Segment

log = get_logger("kvpool.node.checked")

#: How long the node goes on reading (and dropping) what a peer still sends after the node
#: ended the connection, before it closes it. A socket closed with input unread sends a
#: reset, and the reset drops the answers the kernel had not sent yet (the last ones: a
#: refusal, and the reads answered before it); closed after the peer's end of stream, it
#: sends them all, then its own end.
LINGER_S = 1.0
#: Connections that failed for a reason no peer should cause, logged at a bounded rate.
FAILURE_LOGS = LogThrottle(burst=10, interval=60.0)
#: Seconds a connection must have been idle (or open, if no transfer was ever admitted on
#: it) before a new one takes its place in preference to any other (``_victim``).
EVICTABLE_IDLE = 0.5
#: Connections open at once, at most (``max_connections``): each holds a thread and a
#: buffer of its own; when all are taken a new one replaces one of them (``_victim``).
MAX_CONNECTIONS = 256

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
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = 120.0,
        io_timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        seals: Seals | None = None,
        written: WrittenRanges | None = None,
    ) -> None:
        self.seals = seals or Seals(clock)
        #: What landed under each write grant, until its object is recorded or forgotten
        #: (None: nothing asks, on a node of one tenant or one offering UCX over TCP).
        self.written = written
        self._counters = Counters(REQUESTS, BYTES)
        self._segments = {caps.segment_digest(s.segment_id): s for s in segments}
        self._keys = keys
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.io_timeout = io_timeout
        self._clock = clock
        self._lock = threading.Lock()
        #: Open connections, and what makes one the first to go when all are taken.
        self._connections: dict[socket.socket, Activity] = {}
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        self._listener = listening_socket(host, port, backlog=128)
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
                full = len(self._connections) >= self.max_connections
                victim = self._victim() if full and not self._stopping else None
                if self._stopping or (full and victim is None):
                    connection.close()
                    REQUESTS.labels("connect", "too_many_connections").inc()
                    continue
                if victim is not None:  # (its thread ends, and takes it out of the table)
                    del self._connections[victim]
                    with contextlib.suppress(OSError):
                        victim.shutdown(socket.SHUT_RDWR)
                    REQUESTS.labels("connect", "evicted").inc()
                activity = self._connections[connection] = Activity()
                thread = threading.Thread(
                    target=self._serve,
                    args=(connection, activity),
                    name="kvpool-checked",
                    daemon=True,
                )
                self._threads.add(thread)
            try:
                thread.start()
            except RuntimeError as error:  # (no thread to be had: a pids limit)
                with self._lock:
                    self._connections.pop(connection, None)
                    self._threads.discard(thread)
                connection.close()
                log.error("checked stream: cannot start a connection's thread", error=str(error))
                time.sleep(0.1)

    def _victim(self) -> socket.socket | None:
        """The connection a new one replaces when all are taken (callers hold the lock), the
        first of: one on which no transfer was ever admitted, open EVICTABLE_IDLE at least,
        whatever it is doing (waiting, or midway through a header: a peer without a
        capability that sends a byte of a header and no more must not keep its place for
        the io timeout); the one waiting between requests the longest (EVICTABLE_IDLE at
        least); one on which no transfer was ever admitted, however new. Each kind the one
        open (or waiting) longest first. The last kind is for a peer that reconnects as fast
        as it can: turned away whenever none of its connections had aged, a new client would
        get in only when first to a place as one aged; replacing the oldest instead, a new
        connection stays until every one opened before it has been replaced, which takes the
        peer as many connections as there are places within the client's first request.
        None when there is none: a connection with a transfer admitted is never chosen while
        it handles a request (``Activity.evict``), so a transfer under way is never cut off
        for a new connection."""
        latest = time.monotonic() - EVICTABLE_IDLE
        candidates = []
        for connection, activity in self._connections.items():
            if not activity.admitted:
                rank = 0 if activity.opened <= latest else 2
                candidates.append((rank, activity.opened, connection, activity))
            elif (since := activity.waiting_since) is not None and since <= latest:
                candidates.append((1, since, connection, activity))
        candidates.sort(key=lambda candidate: candidate[:2])
        for _, _, connection, activity in candidates:
            if activity.evict():  # (else its first transfer was admitted just now)
                return connection
        return None

    def _serve(self, connection: socket.socket, activity: Activity) -> None:
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            CheckedConnection(
                connection,
                segments=self._segments,
                keys=self._keys,
                clock=self._clock,
                seals=self.seals,
                counters=self._counters,
                io_timeout=self.io_timeout,
                idle_timeout=self.idle_timeout,
                stopping=lambda: self._stopping,
                activity=activity,
                written=self.written,
            ).serve()
        except (Closed, OSError):
            pass
        except Exception as error:  # (a bug must not stop the node; log it)
            if (suppressed := FAILURE_LOGS.allow(type(error).__name__)) is not None:
                log.error(
                    "checked stream connection failed", error=repr(error), suppressed=suppressed
                )
        finally:
            if not self._stopping:
                linger(connection, LINGER_S)
            with self._lock:
                if self._connections.get(connection) is activity:
                    del self._connections[connection]
                self._threads.discard(threading.current_thread())
            connection.close()


def linger(connection: socket.socket, seconds: float) -> None:
    """Ends the node's side of ``connection`` (its answers, then its end of stream) and
    drops what the peer still sends until the peer ends its side, for ``seconds`` at most:
    then a close sends no reset (see LINGER_S)."""
    deadline = time.monotonic() + seconds
    scratch = bytearray(1 << 16)
    with contextlib.suppress(OSError):  # (a reset, a timeout, or stop's shutdown)
        connection.shutdown(socket.SHUT_WR)
        while (left := deadline - time.monotonic()) > 0:
            connection.settimeout(left)
            if not connection.recv_into(scratch):
                return
