"""The client's side of the checked stream: transfers a storage node checks before any byte
moves (the node's side and the reasons: storage_node/checked_server.py; the frames:
transport/checked_frames.py).

A few connections per node are kept (``per_node``) and reused; the transfers of one call to
each node go on one connection, pipelined: up to ``WINDOW`` requests are sent before the
first answer is read, so a batch of small objects costs about one round trip, not one per
object. Calls to different nodes run on threads of their own.

**Few system calls per call.** Small transfers (up to ``SMALL``) go through two buffers of
the connection's: the requests of a batch, each write with its payload copied in, leave in
one ``send``; the answers are received into the other as they come, as many at once as are
there, each read's payload copied out (``memmove``: a few KiB cost less than a call). A
large payload moves straight between the caller's memory and the socket, no copy, the GIL
released while the kernel copies. Waits are the kernel's (transport/checked_socket.py).

Every send and receive waits at most until the call's deadline. A connection that timed
out, broke or fell out of step is closed, never reused: the node may still be mid-transfer
on it. A refusal (the node's status) fails that transfer only.
"""

from __future__ import annotations

import ctypes
import itertools
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

from kvpool.common.helper_threads import Helpers
from kvpool.transport import checked_frames as frames
from kvpool.transport.checked_socket import Waits

#: Requests sent ahead of the answer being read, per connection.
WINDOW = 64
#: Connections kept idle per node.
PER_NODE = 4
#: Seconds an idle connection is kept (the node closes one idle for 120 s): a node that
#: restarted elsewhere (a new port, a new pod address) is never asked again, and its
#: connections and their buffers would otherwise stay with every client that used it.
IDLE_KEPT = 60.0
#: Bytes per send or receive call.
CHUNK = 8 << 20
#: A call moving at least this many bytes to or from one node runs on ``LANES`` connections
#: at once; a transfer this large is cut in ``LANES`` parts.
PARALLEL_AT = 4 << 20
LANES = 2
#: Transfers up to this size go through the connection's buffers (copied), larger ones
#: straight between the caller's memory and the socket.
SMALL = 64 << 10
#: Parts of a cut transfer start at multiples of this.
PAGE = 4096
#: Each connection's send and receive buffers.
BUFFER = 1 << 20


@dataclass(slots=True)
class Job:
    """One transfer: ``length`` bytes at ``offset`` of the segment the capability names, on
    the node at ``address`` (HOST:PORT), to or from local memory at ``local_address``."""

    address: str
    capability: bytes
    offset: int
    length: int
    local_address: int


class Outcome(Enum):
    OK = "ok"
    REFUSED = "refused"
    TIMED_OUT = "timed out"
    #: No connection could be made: the node is down or out of reach.
    UNREACHABLE = "unreachable"
    #: Cut off on a connection that was made: the node sealed the range (its replica there
    #: was removed or moved away: it ends a read in flight by closing the connection, and
    #: refuses one not begun), or it went away mid-answer. Not a sign the node is out of
    #: reach; the object may be elsewhere now.
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    message: str = ""


_OK = Result(Outcome.OK)


class _Broken(Exception):
    """The connection can no longer be used; ``result`` is what the transfers left get."""

    def __init__(self, result: Result) -> None:
        super().__init__(result.message)
        self.result = result


class _Connection:
    """A connection to a node, with its buffers and waits."""

    __slots__ = (
        "_pinned",
        "idle_since",
        "out",
        "out_address",
        "received",
        "received_address",
        "socket",
        "view",
        "waits",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        self.waits = Waits(sock)
        self.out = bytearray(BUFFER)
        self.received = bytearray(BUFFER)
        # (the buffers' addresses, for memmove; they never move: never resized)
        self._pinned = [(ctypes.c_char * BUFFER).from_buffer(b) for b in (self.out, self.received)]
        self.out_address = ctypes.addressof(self._pinned[0])
        self.received_address = ctypes.addressof(self._pinned[1])
        self.view = memoryview(self.received)
        #: When it was last given back to the pool (time.monotonic).
        self.idle_since = 0.0

    def close(self) -> None:
        self.socket.close()


class CheckedStreams:
    """Thread-safe: threads sharing a client transfer at once, each on connections of its
    own (taken from the idle ones, or new)."""

    def __init__(self, per_node: int = PER_NODE, threads: int = 8) -> None:
        self.per_node = per_node
        self._idle: dict[str, list[_Connection]] = {}
        #: When idle connections were last looked at for age (``_close_stale``).
        self._swept = time.monotonic()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kvpool-checked")
        #: The next request id (the iterator's own ``__next__``: atomic under the GIL, and
        #: no Python call per request).
        self.next_request_id: Callable[[], int] = iter(range(1, 1 << 63)).__next__
        self._closed = False

    def run(self, jobs: Sequence[Job], *, is_get: bool, deadline: float) -> list[Result]:
        """Runs ``jobs`` until ``deadline`` (time.monotonic); entry i is job i's result.
        When this returns, no byte moves into or out of the caller's memory any more."""
        by_node: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            by_node.setdefault(job.address, []).append(i)
        if any(sum(jobs[i].length for i in group) >= PARALLEL_AT for group in by_node.values()):
            return self._run_in_lanes(jobs, by_node, is_get=is_get, deadline=deadline)
        results: list[Result] = [_OK] * len(jobs)
        self._run_groups(jobs, list(by_node.values()), is_get, deadline, results)
        return results

    def _run_groups(
        self,
        jobs: Sequence[Job],
        groups: list[list[int]],
        is_get: bool,
        deadline: float,
        results: list[Result],
    ) -> None:
        """Each group of ``jobs`` on a connection of its own, at once (on the caller's thread
        when there is one group)."""
        if len(groups) == 1:
            self._run_group(jobs, groups[0], is_get, deadline, results)
            return
        # Every group ends before any error is raised (each by the deadline), an interrupt
        # of the caller included: one that failed must not leave the others moving bytes
        # into memory the caller reuses.
        helpers = Helpers(self._pool)
        try:
            with helpers:
                for group in groups:
                    helpers.submit(self._run_group, jobs, group, is_get, deadline, results)
        except BaseException:
            helpers.stop_and_wait()  # (see Helpers: an interrupt as the block ended)
            raise
        for future in helpers.futures:
            future.result()

    def _run_in_lanes(
        self,
        jobs: Sequence[Job],
        by_node: dict[str, list[int]],
        *,
        is_get: bool,
        deadline: float,
    ) -> list[Result]:
        """``run`` for calls that move many bytes: a node's share of at least
        ``PARALLEL_AT`` bytes goes over ``LANES`` connections at once (a large transfer cut
        in parts, each under the same capability), so that one TCP stream's copying does
        not bound it. A job fails if any of its parts does."""
        parts: list[Job] = []
        owners: list[int] = []
        groups: list[list[int]] = []
        for indexes in by_node.values():
            lanes: list[list[int]] = [[] for _ in range(LANES)]
            loads = [0] * LANES
            split = sum(jobs[i].length for i in indexes) >= PARALLEL_AT
            for i in indexes:
                for part in _parts(jobs[i]) if split else (jobs[i],):
                    lane = loads.index(min(loads)) if split else 0
                    lanes[lane].append(len(parts))
                    loads[lane] += part.length
                    parts.append(part)
                    owners.append(i)
            groups += [lane for lane in lanes if lane]
        part_results: list[Result] = [_OK] * len(parts)
        self._run_groups(parts, groups, is_get, deadline, part_results)
        results: list[Result] = [_OK] * len(jobs)
        for owner, result in zip(owners, part_results, strict=True):
            if result.outcome is not Outcome.OK and results[owner].outcome is Outcome.OK:
                results[owner] = result
        return results

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
        self._pool.shutdown(wait=True)

    # ---- one node's transfers

    def _run_group(
        self,
        jobs: Sequence[Job],
        indexes: list[int],
        is_get: bool,
        deadline: float,
        results: list[Result],
    ) -> None:
        address = jobs[indexes[0]].address
        try:
            connection = self._take(address, deadline)
        except _Broken as broken:
            for i in indexes:
                results[i] = broken.result
            return
        refused = [False]  # (a write was refused: the node may end the connection after it)
        try:
            clean = _Pipeline(self, connection, jobs, indexes, is_get, deadline, results).run(
                refused
            )
        except _Broken as broken:
            connection.close()
            result = broken.result
            if refused[0] and result.outcome is Outcome.UNREACHABLE:
                result = Result(
                    Outcome.REFUSED, "the storage node ended the connection after a refused write"
                )
            elif result.outcome is Outcome.UNREACHABLE and is_get:
                # (a read: the node ends one whose range it forgets by closing; a write cut
                # off stays UNREACHABLE, so that its put is placed on other nodes)
                result = Result(Outcome.INTERRUPTED, result.message)
            for i in indexes:
                if results[i] is _PENDING:
                    results[i] = result
            return
        except BaseException:
            connection.close()
            raise
        if clean:
            self._give_back(address, connection)
        else:
            connection.close()

    # ---- connections

    def _take(self, address: str, deadline: float) -> _Connection:
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            idle = self._idle.get(address)
            while idle:
                connection = idle.pop()
                if _still_open(connection.socket):
                    return connection
                connection.close()
        host, _, port = address.rpartition(":")
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Broken(Result(Outcome.TIMED_OUT, "no time left to connect"))
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=left)
        except TimeoutError:
            raise _Broken(Result(Outcome.TIMED_OUT, f"connecting to {address} timed out")) from None
        except (OSError, ValueError) as error:
            raise _Broken(
                Result(Outcome.UNREACHABLE, f"cannot connect to {address}: {error}")
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(sock)

    def _give_back(self, address: str, connection: _Connection) -> None:
        now = time.monotonic()
        connection.idle_since = now
        stale: list[_Connection] = []
        with self._lock:
            if now - self._swept >= IDLE_KEPT / 4:
                stale = self._take_stale(now)
            idle = self._idle.setdefault(address, [])
            kept = not self._closed and len(idle) < self.per_node
            if kept:
                idle.append(connection)
        for old in stale:
            old.close()
        if not kept:
            connection.close()

    def _take_stale(self, now: float) -> list[_Connection]:
        """The idle connections kept past ``IDLE_KEPT``, out of the pool (callers hold the
        lock, and close them outside it)."""
        self._swept = now
        stale: list[_Connection] = []
        for address in list(self._idle):
            idle = self._idle[address]
            kept = [c for c in idle if now - c.idle_since < IDLE_KEPT]
            stale.extend(c for c in idle if now - c.idle_since >= IDLE_KEPT)
            if kept:
                self._idle[address] = kept
            else:
                del self._idle[address]
        return stale

    def forget(self, address: str) -> None:
        """Closes the idle connections to a node (it failed, or moved)."""
        with self._lock:
            idle = self._idle.pop(address, [])
        for connection in idle:
            connection.close()


class _Pipeline:
    """One call's transfers with one node, on one connection."""

    def __init__(
        self,
        streams: CheckedStreams,
        connection: _Connection,
        jobs: Sequence[Job],
        indexes: list[int],
        is_get: bool,
        deadline: float,
        results: list[Result],
    ) -> None:
        self.streams = streams
        self.connection = connection
        self.jobs = jobs
        self.indexes = indexes
        self.is_get = is_get
        self.deadline = deadline
        self.results = results
        self.out_at = 0  # (bytes gathered in connection.out)
        self.start = 0  # (the first byte of connection.received not read yet)
        self.end = 0  # (after the last byte received)

    def run(self, refused: list[bool]) -> bool:
        """Sends the requests (each write with its payload) at most WINDOW ahead of the
        answers read; True when the connection is still in step for another call. (What
        every request touches is looked up once, before the loop.)"""
        jobs, indexes, results, is_get = self.jobs, self.indexes, self.results, self.is_get
        for i in indexes:
            results[i] = _PENDING
        op = _READ if is_get else _WRITE
        connection = self.connection
        out, out_address, view = connection.out, connection.out_address, connection.view
        sent: deque[tuple[int, int]] = deque()  # (index, request id), answers not yet read
        clean = True
        next_to_send, count = 0, len(indexes)
        next_id = self.streams.next_request_id
        memmove, unpack_reply = ctypes.memmove, frames.unpack_reply
        request_size, reply_size = frames.REQUEST_SIZE, frames.REPLY_SIZE
        while next_to_send < count or sent:
            if next_to_send < count and len(sent) < WINDOW and not refused[0]:
                i = indexes[next_to_send]
                next_to_send += 1
                job = jobs[i]
                length = job.length
                small = length <= SMALL
                need = request_size + (length if small and not is_get else 0)
                if self.out_at + need > BUFFER:
                    self.send_gathered()
                request_id = next_id()
                at = self.out_at
                capability = job.capability
                if len(capability) != _CAPABILITY_SIZE:
                    frames.pack_request_into(out, at, op, request_id, capability, 0, 0)  # raises
                _pack_request_into(
                    out, at, _REQUEST_MAGIC, _VERSION, op, 0, request_id, capability,
                    job.offset, length,
                )  # fmt: skip
                at += request_size
                if is_get:
                    self.out_at = at
                elif small:  # (a copy of a few KiB costs less than a call)
                    memmove(out_address + at, job.local_address, length)
                    self.out_at = at + length
                else:
                    self.out_at = at
                    self.send_gathered()
                    _send(connection, _view(job.local_address, length), self.deadline)
                sent.append((i, request_id))
                continue
            self.send_gathered()  # (before waiting for an answer, everything asked goes out)
            i, request_id = sent.popleft()
            if self.end - self.start < reply_size:
                self.receive(reply_size)
            try:
                status, answered_id, length = unpack_reply(view, self.start)
            except frames.FrameError as error:
                raise _Broken(Result(Outcome.UNREACHABLE, f"bad answer: {error}")) from None
            self.start += reply_size
            if answered_id != request_id:
                raise _Broken(Result(Outcome.UNREACHABLE, "answer out of step"))
            if status:
                name = frames.Status(status).name
                if status == frames.Status.SEALED and is_get:
                    results[i] = Result(
                        Outcome.INTERRUPTED,
                        "the storage node refused the transfer: SEALED (its replica there was "
                        "removed or moved away meanwhile)",
                    )
                    continue
                disk_failed = (
                    f"the storage node's disk failed to read the object ({name}): another "
                    "replica, if any, is read instead"
                    if is_get
                    else f"the storage node's disk failed to write the object ({name}: full, "
                    "or failing): the put's other replicas, if any, are kept; free space on "
                    "that node's disk, or check its log"
                )
                results[i] = Result(
                    Outcome.REFUSED,
                    disk_failed
                    if status == frames.Status.DISK_ERROR
                    else f"the storage node refused the transfer: {name}"
                    + (
                        " (if it was granted just now, the node's clock and the master's "
                        "differ by more than the allowance: check NTP)"
                        if status == frames.Status.EXPIRED
                        else ""
                    ),
                )
                if not is_get:  # (the node may close after it: send no more on it)
                    clean = False
                    refused[0] = True
                continue
            if is_get:
                job = jobs[i]
                if length != job.length:
                    raise _Broken(Result(Outcome.UNREACHABLE, "answer of the wrong length"))
                self.receive_payload(job.local_address, length)
            results[i] = _OK
        for i in indexes:
            if results[i] is _PENDING:  # (not sent: an earlier write was refused)
                results[i] = Result(Outcome.REFUSED, "not sent: a write before it was refused")
        if self.start != self.end:
            clean = False  # (bytes nobody asked for: out of step)
        return clean

    def send_gathered(self) -> None:
        if self.out_at:
            _send(self.connection, memoryview(self.connection.out)[: self.out_at], self.deadline)
            self.out_at = 0

    def receive(self, wanted: int) -> None:
        """Receives until ``wanted`` bytes are buffered past ``start`` (``wanted`` fits)."""
        if self.end - self.start >= wanted:
            return
        connection = self.connection
        if self.start == self.end:
            self.start = self.end = 0
        elif BUFFER - self.start < wanted:  # (what is left to the front)
            kept = self.end - self.start
            connection.received[:kept] = connection.view[self.start : self.end]
            self.start, self.end = 0, kept
        while self.end - self.start < wanted:
            self.end += _receive_some(connection, connection.view[self.end :], self.deadline)

    def receive_payload(self, address: int, length: int) -> None:
        """A read's payload into the caller's memory at ``address``."""
        connection = self.connection
        if length <= SMALL:
            self.receive(length)
            ctypes.memmove(address, connection.received_address + self.start, length)
            self.start += length
            return
        buffered = min(self.end - self.start, length)
        if buffered:
            ctypes.memmove(address, connection.received_address + self.start, buffered)
            self.start += buffered
        if buffered < length:
            _receive(connection, _view(address + buffered, length - buffered), self.deadline)


_READ, _WRITE = int(frames.Op.READ), int(frames.Op.WRITE)
_pack_request_into = frames.pack_request_fields_into
_REQUEST_MAGIC, _VERSION = frames.REQUEST_MAGIC, frames.VERSION
_CAPABILITY_SIZE = frames.CAPABILITY_SIZE

#: A transfer whose answer has not been read yet.
_PENDING = Result(Outcome.UNREACHABLE, "the connection ended before the answer")


def _parts(job: Job) -> list[Job]:
    """``job`` cut in ``LANES`` page-aligned parts if it is ``PARALLEL_AT`` bytes or more."""
    if job.length < PARALLEL_AT:
        return [job]
    step = job.length // LANES // PAGE * PAGE
    cuts = [k * step for k in range(LANES)] + [job.length]
    return [
        Job(job.address, job.capability, job.offset + a, b - a, job.local_address + a)
        for a, b in itertools.pairwise(cuts)
    ]


def _still_open(connection: socket.socket) -> bool:
    """Whether an idle connection is still usable (the node did not close it meanwhile)."""
    try:  # (an end of stream, or bytes nobody asked for)
        connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        return False
    except BlockingIOError:
        return True  # (nothing to read: open and idle, as it should be)
    except OSError:
        return False


def _view(address: int, length: int) -> memoryview:
    """The caller's memory at ``address`` as a writable view (no copy)."""
    return memoryview((ctypes.c_char * length).from_address(address)).cast("B")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Broken(Result(Outcome.TIMED_OUT, "the transfer missed its deadline"))
    return left


def _send(connection: _Connection, data: bytes | bytearray | memoryview, deadline: float) -> None:
    """Sends all of ``data`` by ``deadline``."""
    view, sock, waits = memoryview(data), connection.socket, connection.waits
    at, end = 0, len(view)
    try:
        while at < end:
            waits.send(_left(deadline))
            try:
                at += sock.send(view[at : min(end, at + CHUNK)])
            except BlockingIOError:
                continue  # (its wait ended: the deadline decides)
    except OSError as error:
        raise _Broken(Result(Outcome.UNREACHABLE, f"the connection broke: {error}")) from None


def _receive_some(
    connection: _Connection, into: memoryview, deadline: float, flags: int = 0
) -> int:
    """Receives what has come (at least one byte) into ``into``, by ``deadline``; with
    ``MSG_WAITALL`` in ``flags``, all of ``into`` unless the wait ends first."""
    sock = connection.socket
    try:
        while True:
            connection.waits.receive(_left(deadline))
            try:
                got = sock.recv_into(into, 0, flags)
            except BlockingIOError:
                continue  # (its wait ended: the deadline decides)
            if not got:
                raise _Broken(Result(Outcome.UNREACHABLE, "the storage node closed the connection"))
            return got
    except OSError as error:
        raise _Broken(Result(Outcome.UNREACHABLE, f"the connection broke: {error}")) from None


def _receive(connection: _Connection, into: memoryview, deadline: float) -> None:
    """Fills ``into`` (a large payload, straight into the caller's memory) by ``deadline``."""
    at, end = 0, len(into)
    while at < end:  # (all of a chunk in one call: no wake-up per segment the kernel queued)
        chunk = into[at : min(end, at + CHUNK)]
        at += _receive_some(connection, chunk, deadline, socket.MSG_WAITALL)
