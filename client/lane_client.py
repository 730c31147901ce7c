"""The client's end of the master's metadata lane (common/lane_protocol.py): blocking calls on
kept-open TCP connections, one call at a time per connection, a pool of them per master so
that threads sharing a client never queue behind each other.

Every wait is bounded by the caller's deadline; a connection that timed out or broke is
reset, never reused (a late answer must not be read as the next call's, nor a request still
queued sent after the caller was told it failed: ``_Connection.reset``). The master closes
connections idle for minutes: an idle connection is used again only within ``MAX_IDLE``
seconds and while the master has not closed it (else a new one is made, unseen by the caller).

A connection the master ends before it is established (reset or closed in the TLS handshake
or at the AUTH frame, as a master at a connection cap does, or refused RESOURCE_EXHAUSTED
there) is ``lp.LaneUnreachable``, as a failed connect is: no request went on it, and the
caller (client/master_link.py) makes that call over gRPC at once. A connection that breaks
once established is UNAVAILABLE: the request may have reached the master, and is not sent
again by this module.

A fork child never uses its parent's connections: it would send on the parent's stream, and
either process could read the other's answer. The child's copies of the idle ones are closed
as it starts (its descriptors only: the parent's connection stays open, and TLS says no
goodbye on it), and its calls connect anew.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import select
import socket
import ssl
import struct
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from kvpool.common import lane_protocol as lp
from kvpool.common.limits import MESSAGE_LIMIT
from kvpool.security.caller import ANONYMOUS, CallerCredentials

if TYPE_CHECKING:
    from google.protobuf.message import Message

#: How long connecting may take at most (a lane behind a firewall drops the SYN: the client
#: gives up on it after this and uses gRPC).
CONNECT_TIMEOUT = 1.0
#: Idle connections kept per master: as many as the threads that usually share a client (an
#: asyncio client's threads among them), so that calls in flight together do not each connect
#: anew (a TLS handshake) and close again.
POOL_SIZE = 32
#: Seconds an idle connection is kept for reuse: well within the master's idle timeout
#: (master/lane_server.py IDLE_TIMEOUT), so that it is never closed under a call.
MAX_IDLE = 60.0
#: Connections one client makes to a master at once, at most: a burst of calling threads
#: beyond it waits for a connection given back, or for its turn to connect. A master lets an
#: address hold only so many connections that have not proven who they are (master/
#: lane_server.py's MAX_UNAUTHENTICATED_PER_ADDRESS): a burst past that would evict this
#: client's own handshakes. A thread waits for its turn at most CONNECT_TIMEOUT, and half
#: of what its call has left: then that call goes over gRPC (``LaneBusy``), as where the
#: lane cannot be reached, so that a lane whose packets are dropped (each connect taking
#: its whole timeout) costs queued calls no more than it costs the first ones.
MAX_CONNECTING = 16
RECEIVE_BUFFER = 64 * 1024


#: SO_LINGER on with a 0 s timeout: ``close`` then drops what is unsent and sends a reset.
_RESET = struct.pack("ii", 1, 0)
#: The longest ``poll`` waits at once (milliseconds, a C int).
POLL_MAX_MS = 2**31 - 1


class _Closed(ConnectionError):
    """The master ended the connection (an empty read, or TLS's end without its goodbye)."""


#: What ends a connection not yet established without a word from the master: a reset, or
#: its end, in the TLS handshake or at the AUTH frame. (Not any other TLS error: a
#: certificate refused on either side says why, and the caller reports it as such.)
_CUT_SHORT = (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


#: What a lane error says where the master ended the connection at this client's credentials,
#: right after the TLS handshake, with a client certificate given (master_link.py reads it
#: as the master refusing the certificate).
CERTIFICATE_CUT = (
    "the lane ended the connection at this client's credentials, after the TLS handshake: "
    "an alert refusing its certificate"
)


class LaneBusy(lp.LaneUnreachable):
    """No connection of this client was free, nor its turn to make one, in time (or it was
    closed meanwhile): the call goes over gRPC, but this says nothing of the lane itself,
    which is not paused for it."""


class LaneError(Exception):
    """A call over the lane failed with a gRPC status code (``lane_protocol`` numbers)."""

    def __init__(self, code: int, details: str, leader: str = "") -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.leader = leader


class LaneClient:
    def __init__(self, host: str, port: int, credentials: CallerCredentials = ANONYMOUS) -> None:
        self.host = host
        self.port = port
        self.credentials = credentials
        self._tls = credentials.lane_context()
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        #: Connections being made now, and what wakes a thread waiting for its turn (a
        #: connection given back, a turn over, the client closed).
        self._connecting = 0
        self._turns = threading.Condition(self._lock)
        #: Connects that found the lane out of reach: a thread waiting for its turn when
        #: one does goes over gRPC (``LaneBusy``) rather than try in its turn.
        self._failed_connects = 0
        self._closed = False
        _LIVE.add(self)

    def call(
        self, method: str, request: Message, response_type: type[Message], timeout: float
    ) -> Any:
        """Sends ``request`` as ``method`` and returns its answer, within ``timeout`` seconds.
        Raises ``lp.LaneUnreachable`` when no connection could be made (or the master ended
        it before it was established), else LaneError."""
        deadline = time.monotonic() + timeout
        connection = self._take(deadline)
        try:
            response = connection.call(lp.METHOD_IDS[method], request, response_type, deadline)
        except LaneError as error:
            if error.code in (lp.DEADLINE_EXCEEDED, lp.UNAVAILABLE):
                connection.reset()  # (see ``reset``: never reused, nothing of it sent later)
            else:
                self._give_back(connection)
            raise
        except BaseException:
            connection.reset()  # (interrupted mid-call: the same)
            raise
        self._give_back(connection)
        return response

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._turns.notify_all()
        for connection in idle:
            connection.close()

    def _after_fork_in_child(self) -> None:
        """Lets go of the parent's idle connections (see the module docstring)."""
        self._lock = threading.Lock()  # (another thread may have held it at fork)
        self._turns = threading.Condition(self._lock)
        self._connecting = 0  # (the parent's threads making them are not in this process)
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()  # (this process's descriptor; no TLS close_notify is sent)

    def _take(self, deadline: float) -> _Connection:
        """An idle connection, else a new one (``MAX_CONNECTING`` made at once at most);
        ``LaneBusy`` where neither comes within the wait MAX_CONNECTING allows."""
        now = time.monotonic()
        give_up = now + min(CONNECT_TIMEOUT, max(0.0, deadline - now) / 2)
        waited = False
        with self._turns:
            failures = self._failed_connects
        while True:
            with self._turns:
                while True:
                    if self._closed:
                        raise LaneBusy("the lane client was closed (a new one is used)")
                    if self._idle:
                        connection: _Connection | None = self._idle.pop()
                        break
                    if self._failed_connects != failures:
                        raise LaneBusy("a connect to the lane failed meanwhile: gRPC instead")
                    if self._connecting < MAX_CONNECTING:
                        self._connecting += 1
                        connection = None
                        break
                    left = give_up - time.monotonic()
                    if left <= 0:
                        raise LaneBusy(
                            f"{MAX_CONNECTING} lane connections were being made and none was "
                            "free: this call goes over gRPC"
                        )
                    waited = True
                    self._turns.wait(left)
            if connection is None:
                break
            if connection.reusable():
                return connection
            connection.close()
        failed = False
        try:
            # (a thread that waited for its turn leaves half of what it has left for gRPC)
            return self._connect(deadline, half=waited)
        except lp.LaneUnreachable:
            failed = True
            raise
        finally:
            with self._turns:
                self._connecting -= 1
                if failed:
                    self._failed_connects += 1
                    self._turns.notify_all()
                else:
                    self._turns.notify()

    def _connect(self, deadline: float, half: bool = False) -> _Connection:
        left = deadline - time.monotonic()
        timeout = min(CONNECT_TIMEOUT, left / 2 if half else left)
        if timeout <= 0:
            raise LaneError(lp.DEADLINE_EXCEEDED, "no time left to connect to the lane")
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as error:
            raise lp.LaneUnreachable(
                f"cannot connect to the lane at {self.host}:{self.port}: {error}"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshaken = False
        try:
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            handshaken = True
            connection = _Connection(sock)
            connection.authenticate(self.credentials.lane_auth, deadline)
        except TimeoutError:
            sock.close()
            raise LaneError(lp.DEADLINE_EXCEEDED, "the lane did not answer in time") from None
        except _CUT_SHORT as error:
            sock.close()
            if handshaken and self.credentials.tls is not None and self.credentials.tls.cert:
                # (TLS 1.3: the master checks a client certificate after the client's side
                # of the handshake is done, and its alert refusing one can be lost to the
                # close that follows: no connection cap cuts a connection there)
                raise LaneError(lp.UNAVAILABLE, f"{CERTIFICATE_CUT} ({error})") from None
            raise lp.LaneUnreachable(
                f"the lane at {self.host}:{self.port} ended the connection before it was "
                f"established ({error or type(error).__name__}): its master may be at a "
                "connection cap"
            ) from None
        except ssl.SSLError as error:
            sock.close()
            raise LaneError(
                lp.UNAVAILABLE,
                f"TLS with the lane at {self.host}:{self.port} failed ({error}): check that "
                "KVPOOL_TLS_CA is the CA of the master's certificate",
            ) from None
        except OSError as error:
            sock.close()
            raise LaneError(lp.UNAVAILABLE, f"the lane connection broke: {error}") from None
        except LaneError as error:
            sock.close()
            if error.code == lp.RESOURCE_EXHAUSTED:  # (a cap on its connections: said so)
                raise lp.LaneUnreachable(
                    f"the lane at {self.host}:{self.port} refused a connection: {error.details}"
                ) from None
            raise
        return connection

    def _give_back(self, connection: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < POOL_SIZE:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
                self._turns.notify()
                return
        connection.close()


class _Connection:
    _ids = itertools.count(1)

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        #: With TLS: OpenSSL's side of the socket (``_openssl``), whose reads and writes it
        #: calls itself; None in plaintext.
        self._tls = _openssl(sock)
        #: Where answers land: most fit whole, so that one recv usually reads a whole frame.
        self._buffer = bytearray(RECEIVE_BUFFER)
        #: When it was last given back to the pool.
        self.idle_since = time.monotonic()
        #: Asks whether anything waits to be read, without reading it (see ``reusable``).
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)

    def authenticate(self, token: bytes, deadline: float) -> None:
        """Sends the connection's credentials (the AUTH frame every connection opens with);
        LaneError when the master refuses them."""
        call_id = next(self._ids) & 0xFFFFFFFF
        self._sock.settimeout(_left(deadline))
        self._send(lp.encode(call_id, lp.AUTH, token))
        answer = self._read_frame(call_id, deadline)
        if answer.status not in (lp.OK, lp.UNIMPLEMENTED):  # (UNIMPLEMENTED: an older master)
            details, leader = answer.error()
            raise LaneError(answer.status, details, leader)

    def reusable(self) -> bool:
        """Not idle too long, and the master has neither closed it nor sent anything unasked.
        One poll without waiting: readable means closed (an empty read), broken (POLLERR
        and POLLHUP come unasked), or bytes nobody asked for; a peek would cost two calls
        into the kernel, one of them to make the socket non-blocking, on every call."""
        if time.monotonic() - self.idle_since > MAX_IDLE:
            return False
        try:
            if self._tls is not None and self._tls.pending():
                return False  # (bytes TLS already decrypted: nobody asked for them)
            return not self._poller.poll(0)
        except OSError:
            return False

    def call(
        self, method: int, request: Message, response_type: type[Message], deadline: float
    ) -> Any:
        call_id = next(self._ids) & 0xFFFFFFFF
        body = request.SerializeToString()
        if len(body) > lp.REQUEST_LIMIT:  # (the master would drop the connection unread)
            raise LaneError(
                lp.INVALID_ARGUMENT, lp.too_large(lp.LANE_METHODS[method][0], len(body))
            )
        frame = lp.encode(call_id, method, body)
        try:
            self._sock.settimeout(_left(deadline))
            self._send(frame)
            answer = self._read_frame(call_id, deadline)
        except TimeoutError:
            raise LaneError(lp.DEADLINE_EXCEEDED, "the lane did not answer in time") from None
        except OSError as error:
            raise LaneError(lp.UNAVAILABLE, f"the lane connection broke: {error}") from None
        if answer.status != lp.OK:
            details, leader = answer.error()
            raise LaneError(answer.status, details, leader)
        try:
            return response_type.FromString(answer.body)
        except DecodeError as error:
            raise LaneError(
                lp.INTERNAL, f"the master's answer does not parse ({error}): is it this version?"
            ) from None

    def _read_frame(self, call_id: int, deadline: float) -> lp.Frame:
        """Reads the answer to ``call_id`` (the only call in flight on this connection)."""
        buffer = self._buffer
        have = self._receive(buffer, 0, deadline)
        while have < lp.HEADER.size:
            have = self._receive(buffer, have, deadline)
        length, answered, method, status = lp.HEADER.unpack_from(buffer)
        if length > MESSAGE_LIMIT or answered != call_id:
            raise OSError("the lane answered out of turn")
        end = lp.HEADER.size + length
        if end > len(buffer):
            buffer = bytearray(end)
            buffer[:have] = self._buffer[:have]
        while have < end:
            have = self._receive(buffer, have, deadline)
        if have > end:
            raise OSError("the lane sent more than one answer")
        return lp.Frame(call_id, method, status, bytes(memoryview(buffer)[lp.HEADER.size : end]))

    def _send(self, frame: bytes) -> None:
        tls = self._tls
        if tls is None:
            self._sock.sendall(frame)
            return
        sent = tls.write(frame)  # (all of it, as a rule: OpenSSL retries until the timeout)
        while sent < len(frame):
            sent += tls.write(memoryview(frame)[sent:])

    def _receive(self, buffer: bytearray, have: int, deadline: float) -> int:
        if have:  # the first read keeps the timeout the send was given
            self._sock.settimeout(_left(deadline))
        view = memoryview(buffer)[have:]
        try:
            if self._tls is None:
                got = self._sock.recv_into(view)
            else:
                if not have and not self._tls.pending():
                    self._wait_readable(deadline)
                got = self._tls.read(len(view), view)
        except ssl.SSLEOFError:  # (closed without TLS's goodbye: the same to this client)
            got = 0
        if not got:
            raise _Closed("the master closed the connection")
        return have + got

    def _wait_readable(self, deadline: float) -> None:
        """Waits for the answer's first bytes before OpenSSL reads: a read that finds
        nothing yet costs OpenSSL a failed record read (and the kernel a read) on every
        call before it waits itself."""
        while not self._poller.poll(min(math.ceil(_left(deadline) * 1000), POLL_MAX_MS)):
            if _left(deadline) <= 0:  # (else a wait longer than poll takes: wait on)
                raise TimeoutError

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    def reset(self) -> None:
        """Closes the connection with a reset (SO_LINGER on, 0 s), for a call that failed
        before its answer came (timed out, broken, interrupted). A graceful close would
        leave its request in the kernel's send queue, to be sent (retransmitted for minutes
        over a cut link) and acted on after the caller was told the call failed: a PutEnd
        delivered once a link heals published an object its put had reported not stored.
        Reset, that queue is dropped, and what the master's host got already is all it
        gets. (What did reach it is still read and acted on: the caller is told that a
        commit's outcome is unknown, client/put_path.py ``outcome_unknown``.)

        Nothing else can be lost with it: a connection carries one call at a time (it is
        taken from the pool for a call and given back after), so the only bytes queued on
        it are this call's request, and the only ones unread the answer nobody waits for
        any more. Only the owning process resets: a fork child closes its copies of the
        parent's connections plainly (``close``), as an option set on its copy would be
        set on the parent's socket too."""
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        self.close()


#: The lane clients of this process, for ``_after_fork_in_child``.
_LIVE: weakref.WeakSet[LaneClient] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lane in list(_LIVE):
        lane._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _openssl(sock: socket.socket) -> Any:
    """The C object under an ``ssl.SSLSocket`` (its ``_sslobj``: OpenSSL's read, write and
    pending, with the socket's timeout), or None for a plain socket. The ``SSLSocket``
    methods are Python wrappers around it (``sendall`` a loop over memoryview slices,
    ``recv_into`` two calls deep): on a lane call they cost the client about 15,000
    instructions (callgrind), as much as OpenSSL's own work on the call's two records,
    and most of what a secure call cost it beyond a plaintext one. A Python without it
    gets the wrappers, which behave the same (the ``SSLSocket`` itself, as its own
    stand-in)."""
    if not isinstance(sock, ssl.SSLSocket):
        return None
    inner = getattr(sock, "_sslobj", None)
    return sock if inner is None else inner


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left
