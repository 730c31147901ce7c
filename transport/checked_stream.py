"""The client's side of the checked stream: transfers a storage node checks before any byte
moves (the node's side and the reasons: storage_node/checked_server.py; the frames:
transport/checked_frames.py).

A few connections per node are kept (``per_node``) and reused; the transfers of one call to
each node go on one connection, pipelined: up to ``WINDOW`` requests are sent before the
first answer is read, so a batch of small objects costs about one round trip, not one per
object. Calls to different nodes run on threads of their own. Bytes move straight between
the caller's memory and the socket (``send``/``recv_into`` on a view of it): no copy in
between, and the GIL is released while the kernel copies.

Every send and receive waits at most until the call's deadline (``settimeout`` with the time
left). A connection that timed out, broke or fell out of step is closed, never reused: the
node may still be mid-transfer on it. A refusal (the node's status) fails that transfer only.
"""

from __future__ import annotations

import ctypes
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

from kvpool.transport import checked_frames as frames

#: Requests sent ahead of the answer being read, per connection.
WINDOW = 64
#: Connections kept idle per node.
PER_NODE = 4
#: Bytes per send or receive call.
CHUNK = 8 << 20
#: Writes up to this size go out with their header, and requests are gathered up to this
#: size, in one send.
SMALL = 64 << 10


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
    UNREACHABLE = "unreachable"


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


class CheckedStreams:
    """Thread-safe: threads sharing a client transfer at once, each on connections of its
    own (taken from the idle ones, or new)."""

    def __init__(self, per_node: int = PER_NODE, threads: int = 8) -> None:
        self.per_node = per_node
        self._idle: dict[str, list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kvpool-checked")
        self._request_ids = iter(range(1, 1 << 63))
        self._closed = False

    def run(self, jobs: Sequence[Job], *, is_get: bool, deadline: float) -> list[Result]:
        """Runs ``jobs`` until ``deadline`` (time.monotonic); entry i is job i's result.
        When this returns, no byte moves into or out of the caller's memory any more."""
        by_node: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            by_node.setdefault(job.address, []).append(i)
        results: list[Result] = [_OK] * len(jobs)
        groups = list(by_node.values())
        if len(groups) == 1:
            self._run_group(jobs, groups[0], is_get, deadline, results)
            return results
        futures = [
            self._pool.submit(self._run_group, jobs, group, is_get, deadline, results)
            for group in groups
        ]
        for future in futures:
            future.result()
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
            clean = self._pipeline(connection, jobs, indexes, is_get, deadline, results, refused)
        except _Broken as broken:
            connection.close()
            result = broken.result
            if refused[0] and result.outcome is Outcome.UNREACHABLE:
                result = Result(
                    Outcome.REFUSED, "the storage node ended the connection after a refused write"
                )
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

    def _pipeline(
        self,
        connection: socket.socket,
        jobs: Sequence[Job],
        indexes: list[int],
        is_get: bool,
        deadline: float,
        results: list[Result],
        refused: list[bool],
    ) -> bool:
        """Sends the requests (each write with its payload) at most WINDOW ahead of the
        answers read; True when the connection is still in step for another call."""
        for i in indexes:
            results[i] = _PENDING
        op = frames.Op.READ if is_get else frames.Op.WRITE
        sent: deque[tuple[int, int]] = deque()  # (index, request id), answers not yet read
        clean = True
        next_to_send = 0
        out = bytearray()  # requests (and small payloads) not sent yet: one send for many
        while next_to_send < len(indexes) or sent:
            if next_to_send < len(indexes) and len(sent) < WINDOW and not refused[0]:
                i = indexes[next_to_send]
                next_to_send += 1
                job = jobs[i]
                request_id = next(self._request_ids)
                out += frames.encode_request(op, request_id, job.capability, job.offset, job.length)
                if not is_get and job.length <= SMALL:  # (a copy of a few KiB costs less)
                    out += _view(job.local_address, job.length)
                elif not is_get:
                    _send(connection, out, deadline)
                    out.clear()
                    _send(connection, _view(job.local_address, job.length), deadline)
                if len(out) >= SMALL:
                    _send(connection, out, deadline)
                    out.clear()
                sent.append((i, request_id))
                continue
            if out:  # (before waiting for an answer, everything asked goes out)
                _send(connection, out, deadline)
                out.clear()
            i, request_id = sent.popleft()
            job = jobs[i]
            answer = bytearray(frames.REPLY_SIZE)
            _receive(connection, memoryview(answer), deadline)
            try:
                reply = frames.parse_reply(answer)
            except frames.FrameError as error:
                raise _Broken(Result(Outcome.UNREACHABLE, f"bad answer: {error}")) from None
            if reply.request_id != request_id:
                raise _Broken(Result(Outcome.UNREACHABLE, "answer out of step"))
            if reply.status is not frames.Status.OK:
                results[i] = Result(
                    Outcome.REFUSED, f"the storage node refused the transfer: {reply.status.name}"
                )
                if not is_get:  # (the node may close after it: send no more on it)
                    clean = False
                    refused[0] = True
                continue
            if is_get:
                if reply.length != job.length:
                    raise _Broken(Result(Outcome.UNREACHABLE, "answer of the wrong length"))
                _receive(connection, _view(job.local_address, job.length), deadline)
            results[i] = _OK
        for i in indexes:
            if results[i] is _PENDING:  # (not sent: an earlier write was refused)
                results[i] = Result(Outcome.REFUSED, "not sent: a write before it was refused")
        return clean

    # ---- connections

    def _take(self, address: str, deadline: float) -> socket.socket:
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            idle = self._idle.get(address)
            while idle:
                connection = idle.pop()
                if _still_open(connection):
                    return connection
                connection.close()
        host, _, port = address.rpartition(":")
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Broken(Result(Outcome.TIMED_OUT, "no time left to connect"))
        try:
            connection = socket.create_connection((host.strip("[]"), int(port)), timeout=left)
        except TimeoutError:
            raise _Broken(Result(Outcome.TIMED_OUT, f"connecting to {address} timed out")) from None
        except (OSError, ValueError) as error:
            raise _Broken(
                Result(Outcome.UNREACHABLE, f"cannot connect to {address}: {error}")
            ) from None
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def _give_back(self, address: str, connection: socket.socket) -> None:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if not self._closed and len(idle) < self.per_node:
                idle.append(connection)
                return
        connection.close()

    def forget(self, address: str) -> None:
        """Closes the idle connections to a node (it failed, or moved)."""
        with self._lock:
            idle = self._idle.pop(address, [])
        for connection in idle:
            connection.close()


#: A transfer whose answer has not been read yet.
_PENDING = Result(Outcome.UNREACHABLE, "the connection ended before the answer")


def _still_open(connection: socket.socket) -> bool:
    """Whether an idle connection is still usable (the node did not close it meanwhile)."""
    try:
        connection.setblocking(False)
        try:
            connection.recv(1, socket.MSG_PEEK)  # (an end of stream, or bytes nobody asked for)
            return False
        finally:
            connection.setblocking(True)
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


def _send(connection: socket.socket, data: bytes | bytearray | memoryview, deadline: float) -> None:
    view = memoryview(data)
    at, end = 0, len(view)
    try:
        while at < end:
            connection.settimeout(_left(deadline))
            at += connection.send(view[at : min(end, at + CHUNK)])
    except TimeoutError:
        raise _Broken(Result(Outcome.TIMED_OUT, "the transfer missed its deadline")) from None
    except OSError as error:
        raise _Broken(Result(Outcome.UNREACHABLE, f"the connection broke: {error}")) from None


def _receive(connection: socket.socket, into: memoryview, deadline: float) -> None:
    at, end = 0, len(into)
    try:
        while at < end:
            connection.settimeout(_left(deadline))
            got = connection.recv_into(into[at : min(end, at + CHUNK)])
            if not got:
                raise _Broken(Result(Outcome.UNREACHABLE, "the storage node closed the connection"))
            at += got
    except TimeoutError:
        raise _Broken(Result(Outcome.TIMED_OUT, "the transfer missed its deadline")) from None
    except OSError as error:
        raise _Broken(Result(Outcome.UNREACHABLE, f"the connection broke: {error}")) from None
