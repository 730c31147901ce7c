"""The master over its metadata lane: the hot client calls and the nodes' command streams on
kept-open TCP connections in lean frames (common/lane_protocol.py), beside gRPC.

A thin adapter over the transport-neutral handlers (handlers.py), behind the same leader gate
and load shedder as gRPC: each frame runs its handler as it arrives; an answer that comes
later (a ``Pending``: a PutEnd waiting for its nodes) is sent when it does, so requests on one
connection may be answered out of order and a waiting call never holds up the next. A node's
first frame turns its connection into its command stream.

What a peer can make the master hold is bounded. A request's body is refused at its header
beyond ``lp.REQUEST_LIMIT`` (a node's reports beyond ``lp.REPORT_LIMIT``), before any of it
is kept. A frame of more than ``FREE_FRAME`` bytes (on a client's connection) is read only
once its announced size is reserved from ``request_memory``, which all connections share: one
that does not fit waits, not read, until others give theirs back (first come, first served),
so what frames still arriving hold is bounded whatever the number of connections. A
connection that sent part of a frame and then nothing for ``read_timeout``, or
whose answers have waited unread that long, is closed; so is one whose frame takes longer
than twice ``read_timeout`` plus its size at ``FRAME_RATE_FLOOR`` to arrive (a byte every few
seconds would otherwise hold it, and its reserved memory, for ever), one that has not
proven who it is within ``read_timeout`` of connecting, and a client's connection with no
call in flight and nothing heard for ``idle_timeout`` (clients connect again; a node's
command stream may rightly stay quiet, and is not).

No peer fills the lane's connections against the others (``_make_room``, ``admit``). A
connection counts from its accept, its TLS handshake included. One that has not proven who
it is (handshaking, or before its AUTH frame) may be evicted: past
``max_unauthenticated_per_address`` of them from one address (an IPv6 address's /64), a new
one from there takes the place of that address's oldest; at ``max_connections``, a new one
takes the place of the oldest of all, if that came ``EVICT_AFTER`` ago or more, else it is
closed as it comes. Proven, an identity
holds at most ``max_per_identity`` connections, and clients together hold all but
``node_reserve``, kept for nodes' command streams: a connection past either is answered
RESOURCE_EXHAUSTED at its AUTH, naming the limit, and closed (its client makes that call
over gRPC).

A connection whose answers are not being read (its write buffer past ``WRITE_HIGH``) is not
read either, and the frames already read wait, until the answers drain. One sweep per
server checks the deadlines, so a frame arms no timer. Each such close is one log line, at
most one per second per reason (with a count of the others).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import ipaddress
import math
import os
import socket
import ssl
import time
from typing import Any

import grpc
from google.protobuf.message import Message

from kvpool.common import lane_protocol as lp
from kvpool.common.listen_address import bare, listening_socket
from kvpool.common.logging import get_logger
from kvpool.common.tcp_keepalive import keep_alive
from kvpool.common.tls_transport import TlsTransport
from kvpool.master import metrics
from kvpool.master.access import authorize, own_node
from kvpool.master.authenticator import Authenticator
from kvpool.master.driver import CallRefused, NodeStream, Pending
from kvpool.master.handlers import MasterHandlers
from kvpool.master.leader_gate import LeaderGate
from kvpool.master.load_shedding import LoadShedder
from kvpool.proto import master_pb2 as pb
from kvpool.security.identity import Identity, Role

log = get_logger("kvpool.master.lane")

#: Seconds a connection may sit on part of a frame, or on answers it does not read.
READ_TIMEOUT = 10.0
#: Seconds a client's connection may stay open with no call in flight and nothing sent.
IDLE_TIMEOUT = 300.0
#: Connections open at once, at most (``KVPOOL_MASTER_LANE_MAX_CONNECTIONS`` lowers it):
#: past it a new one takes the place of the oldest that has not proven who it is, or is
#: closed as it comes where all have.
MAX_CONNECTIONS = 4096
#: Connections one identity (a token's, a certificate's) may hold once proven
#: (``KVPOOL_MASTER_LANE_MAX_PER_IDENTITY``). A client process keeps up to
#: client/lane_client.py's POOL_SIZE (32) idle and opens one more per thread calling at once
#: beyond those, so this serves 32 busy processes sharing a token (a tenant's fleet of
#: engines), and it takes four identities together to fill what clients may take of
#: MAX_CONNECTIONS. One past it is refused at its AUTH (RESOURCE_EXHAUSTED): its client
#: makes its calls over gRPC a while (slower, not failing), as do the others' past the
#: clients' places.
MAX_PER_IDENTITY = 1024
#: Connections from one address that have not proven who they are (in their TLS handshake,
#: or before their AUTH frame), at most (``KVPOOL_MASTER_LANE_MAX_UNAUTHENTICATED_PER_ADDRESS``):
#: past it a new one from there takes the place of that address's oldest. A client process
#: makes at most client/lane_client.py's MAX_CONNECTING (16) at once, each proven within its
#: TLS handshake and one round trip; this leaves room for sixteen such processes behind one
#: address (a host's engines, a NAT) connecting at the same moment.
MAX_UNAUTHENTICATED_PER_ADDRESS = 256
#: Seconds after its accept a connection that has not proven who it is may be evicted at
#: the connection cap (``_make_room``): an honest one proves itself well within them.
EVICT_AFTER = 2.0
#: Of MAX_CONNECTIONS, how many only nodes may take (each node's command stream is one
#: connection): clients together never hold more than the rest. A smaller cap keeps a
#: sixteenth of it.
NODE_RESERVE = 256
#: Bytes all large frames still arriving may hold at once (``--lane-request-memory``).
REQUEST_MEMORY = 1 << 30
#: A frame up to this size is read without reserving request memory (every connection may
#: hold one: with MAX_CONNECTIONS, 256 MiB at most).
FREE_FRAME = 64 << 10
#: Answers waiting in a connection's write buffer beyond which it is not read (bytes), and
#: below which it is read again.
WRITE_HIGH = 1 << 20
WRITE_LOW = 256 << 10
#: Seconds a node may leave its command stream unread (paused past WRITE_HIGH), and the
#: commands' bytes it may leave waiting, before the stream is closed: a node busy with its
#: disk reads again well within these; one that does not reconnects.
NODE_STREAM_STALL = 60.0
NODE_STREAM_BUFFER = 64 << 20
#: Seconds between two log lines about connections closed for the same reason.
LOG_EVERY = 1.0


class LaneServer:
    def __init__(
        self,
        handlers: MasterHandlers,
        gate: LeaderGate,
        shedder: LoadShedder,
        auth: Authenticator,
        *,
        tls: ssl.SSLContext | None = None,
        max_connections: int | None = None,
        read_timeout: float = READ_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        request_memory: int = REQUEST_MEMORY,
        max_per_identity: int | None = None,
        max_unauthenticated_per_address: int | None = None,
        node_reserve: int | None = None,
    ) -> None:
        """The caps left out (None) are read from their environment variables, else their
        defaults (see MAX_CONNECTIONS and those after it); ValueError for one that is not a
        whole number in range."""
        if max_connections is None:
            max_connections = _from_environment(
                "KVPOOL_MASTER_LANE_MAX_CONNECTIONS", MAX_CONNECTIONS, MAX_CONNECTIONS
            )
        if max_per_identity is None:
            max_per_identity = _from_environment(
                "KVPOOL_MASTER_LANE_MAX_PER_IDENTITY", MAX_PER_IDENTITY
            )
        if max_unauthenticated_per_address is None:
            max_unauthenticated_per_address = _from_environment(
                "KVPOOL_MASTER_LANE_MAX_UNAUTHENTICATED_PER_ADDRESS",
                MAX_UNAUTHENTICATED_PER_ADDRESS,
            )
        if node_reserve is None:
            node_reserve = min(NODE_RESERVE, max_connections // 16)
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        if max_per_identity < 1 or max_unauthenticated_per_address < 1:
            raise ValueError(
                f"the lane's caps per identity and per address must be at least 1, got "
                f"{max_per_identity} and {max_unauthenticated_per_address}"
            )
        if not 0 <= node_reserve < max_connections:
            raise ValueError(
                f"the lane's node reserve must be from 0 to below max_connections "
                f"({max_connections}), got {node_reserve}"
            )
        if request_memory < lp.REQUEST_LIMIT:
            raise ValueError(
                f"the lane's request memory must hold the largest request "
                f"({lp.REQUEST_LIMIT} bytes), got {request_memory}"
            )
        if not read_timeout > 0 or not idle_timeout > 0:
            raise ValueError(
                f"the lane's timeouts must be positive, got {read_timeout} and {idle_timeout}"
            )
        self.handlers = handlers
        self.gate = gate
        self.shedder = shedder
        self.auth = auth
        self.tls = tls
        self.max_connections = max_connections
        self.max_per_identity = max_per_identity
        self.max_unauthenticated_per_address = max_unauthenticated_per_address
        self.node_reserve = node_reserve
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self.request_memory = request_memory
        #: Request memory reserved by the large frames being read.
        self.reserved = 0
        #: Connections waiting (not read) for request memory, first come first.
        self._waiting: collections.deque[_Connection] = collections.deque()
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        #: The TLS listener (with TLS, connections are accepted here, not by asyncio).
        self._listener: socket.socket | None = None
        #: TLS connections still in their handshake (not yet in ``_connections``).
        self._handshaking: set[TlsTransport] = set()
        self._connections: set[_Connection] = set()
        #: Connections that have not proven who they are (handshaking, or before their AUTH
        #: frame), oldest first: all of them, and by address (``_address_of``).
        self._unproven: dict[_Connection, None] = {}
        self._unproven_at: dict[str, dict[_Connection, None]] = {}
        #: Connections that have proven who they are, per identity (none of insecure ones),
        #: and how many of them are not nodes'.
        self._proven: dict[Identity, int] = {}
        self._proven_clients = 0
        self._sweeper: asyncio.TimerHandle | None = None
        #: Per reason: when a close for it was last logged, and how many since were not.
        self._logged: dict[str, tuple[float, int]] = {}

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        if self.tls is None:
            self._server = await loop.create_server(lambda: _Connection(self), bare(host), port)
            self.port = self._server.sockets[0].getsockname()[1]
        else:  # TLS by OpenSSL on the socket itself (common/tls_transport.py says why)
            listener = listening_socket(host, port, backlog=1024)
            listener.setblocking(False)
            self._listener = listener
            self.port = listener.getsockname()[1]
            loop.add_reader(listener.fileno(), self._accept, listener)
        self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        return self.port

    def _accept(self, listener: socket.socket) -> None:
        """Takes the connections waiting at a TLS listener; each handshakes within the read
        timeout, and counts against the connection caps meanwhile (``_make_room``)."""
        assert self.tls is not None
        loop = asyncio.get_running_loop()
        for _ in range(64):
            try:
                conn, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # (out of descriptors: the next event tries again)
                self._complain("accept_failed", str(error), "?")
                return
            connection = _Connection(self)
            if not self._place(connection, peer):
                conn.close()
                continue
            conn.setblocking(False)
            try:
                sock = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            except (ssl.SSLError, OSError):
                conn.close()
                continue
            self._unproven_add(connection)  # (before its transport, which may end at once)
            transport = TlsTransport(
                loop,
                sock,
                connection,
                handshake_timeout=self.read_timeout,
                on_done=functools.partial(self._transport_done, connection),
            )
            if not transport.is_closing() and connection.transport is None:
                connection.handshake = transport
                self._handshaking.add(transport)

    def _transport_done(self, connection: _Connection, transport: TlsTransport) -> None:
        """A TLS connection ended: in its handshake, or after ``connection_lost``."""
        self._handshaking.discard(transport)
        connection.handshake = None
        self._forget(connection)

    # ---- the connection caps

    def _place(self, new: _Connection, peer: object) -> bool:
        """Names ``new`` (just accepted) by its ``peer`` and makes room for it
        (``_make_room``): False if it is to be closed."""
        new.peer = _peer_name(peer)
        new.address = _address_of(peer)
        return self._make_room(new)

    def _make_room(self, new: _Connection) -> bool:
        """Makes room for ``new``, just accepted (not counted yet), where it has none: past
        its address's cap on connections that have not proven who they are, the oldest of
        those from there goes; at the connection cap, the oldest of all that have not, if it
        came ``EVICT_AFTER`` ago or more. False (the new one is to be closed, counted
        ``over_cap``) where none such is left. A place goes to the newest, as an old
        unproven one is held by a peer that will prove nothing: a client's connection proves
        itself within its handshake and a round trip, well within EVICT_AFTER. So a flood
        from one address evicts a client there only by opening that address's cap of
        connections meanwhile, and a flood from many addresses never evicts a handshake
        younger than EVICT_AFTER: new connections are closed as they come instead (a client
        then calls over gRPC), until the flood's own connections have aged."""
        held = self._unproven_at.get(new.address)
        if held is not None and len(held) >= self.max_unauthenticated_per_address:
            self._evict(
                next(iter(held)),
                "address_cap",
                f"{len(held)} connections from {new.address} had not proven who they are, "
                f"the most one address may hold ({self.max_unauthenticated_per_address}): "
                "the oldest made room for a new one",
            )
        if len(self._connections) + len(self._handshaking) < self.max_connections:
            return True
        oldest = next(iter(self._unproven), None)
        if oldest is not None and time.monotonic() - oldest.accepted_at >= EVICT_AFTER:
            self._evict(
                oldest,
                "evicted",
                f"{self.max_connections} connections are open: the oldest that had not proven "
                f"who it is, {EVICT_AFTER:g} s after it came, made room for a new one",
            )
            return True
        metrics.labelled(metrics.LANE_CLOSED, "over_cap").inc()
        why = (
            f"{self.max_connections} connections are open, each of a proven caller or one "
            f"that came less than {EVICT_AFTER:g} s ago"
        )
        self._complain("over_cap", why, new.peer)
        return False

    def _evict(self, connection: _Connection, reason: str, why: str) -> None:
        """Closes ``connection`` (one that has not proven who it is) for a new one: out of
        the counts at once, so that the place is free for the new one."""
        metrics.labelled(metrics.LANE_CLOSED, reason).inc()
        self._complain(reason, why, connection.peer)
        self._forget(connection)
        self._connections.discard(connection)
        handshake = connection.handshake
        if handshake is not None:
            handshake.abort()  # (which takes it out of ``_handshaking``)
        else:
            connection.abort()

    def _unproven_add(self, connection: _Connection) -> None:
        self._unproven[connection] = None
        self._unproven_at.setdefault(connection.address, {})[connection] = None

    def _forget(self, connection: _Connection) -> None:
        """Takes ``connection`` out of the counts: as unproven, or of its identity."""
        if connection in self._unproven:
            del self._unproven[connection]
            held = self._unproven_at[connection.address]
            del held[connection]
            if not held:
                del self._unproven_at[connection.address]
        identity, connection.counted = connection.counted, None
        if identity is not None:
            left = self._proven[identity] - 1
            if left:
                self._proven[identity] = left
            else:
                del self._proven[identity]
            if identity.role is not Role.NODE:
                self._proven_clients -= 1

    def admit(self, connection: _Connection, identity: Identity) -> str | None:
        """Counts ``connection``, which has just proven ``identity``, as that identity's;
        or says why not (the cap per identity, or the places clients may take all taken),
        and counts the refusal."""
        if identity.insecure:  # (everyone is the same caller: nobody to tell apart)
            self._forget(connection)
            return None
        held = self._proven.get(identity, 0)
        node = identity.role is Role.NODE
        clients = self.max_connections - self.node_reserve
        if held >= self.max_per_identity:
            reason = "identity_cap"
            why = (
                f"{identity.describe()} holds {held} metadata lane connections, the most one "
                f"identity may ({self.max_per_identity}): close some, or call over gRPC"
            )
        elif not node and self._proven_clients >= clients:
            reason = "client_cap"
            why = (
                f"the metadata lane holds {self._proven_clients} connections of clients, the "
                f"most it takes ({self.max_connections} less {self.node_reserve} kept for "
                "nodes): call over gRPC"
            )
        else:
            self._forget(connection)
            connection.counted = identity
            self._proven[identity] = held + 1
            if not node:
                self._proven_clients += 1
            return None
        metrics.labelled(metrics.LANE_CLOSED, reason).inc()
        self._complain(reason, why, connection.peer)
        return why

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
            for transport in list(self._handshaking):
                transport.abort()
            for connection in list(self._connections):
                if connection.stalled:
                    connection.abort()
                else:
                    connection.close()
        if self._server is not None:
            self._server.close()
            for connection in list(self._connections):
                if connection.stalled:
                    connection.abort()  # (its peer would never let it close)
                else:
                    connection.close()
            await self._server.wait_closed()

    @property
    def _sweep_every(self) -> float:
        return min(self.read_timeout, self.idle_timeout) / 4

    def _sweep(self) -> None:
        """Closes the connections past a deadline; runs every ``_sweep_every`` seconds, so a
        deadline is kept to within that."""
        now = time.monotonic()
        for connection in list(self._connections):
            reason = connection.overdue(now)
            if reason == "idle":
                metrics.labelled(metrics.LANE_CLOSED, reason).inc()
                connection.close()  # clients connect again: nothing to report
            elif reason is not None:
                self.drop(connection, reason, _OVERDUE[reason].format(self.read_timeout))
        self._sweeper = asyncio.get_running_loop().call_later(self._sweep_every, self._sweep)

    def reserve(self, connection: _Connection, size: int) -> bool:
        """Reserves ``size`` bytes of request memory for a frame of ``connection``; False when
        they do not fit (or others wait before it): it then waits in line, and is called
        back (``granted``) once they do."""
        if not self._waiting and self.reserved + size <= self.request_memory:
            self.reserved += size
            metrics.LANE_MEMORY_RESERVED.set(self.reserved)
            return True
        metrics.LANE_MEMORY_WAITS.inc()
        self._waiting.append(connection)
        return False

    def give_back(self, size: int) -> None:
        """Request memory a frame held (now whole, or its connection gone) is free again:
        the connections waiting for some get it in turn, as far as it goes."""
        self.reserved -= size
        waiting = self._waiting
        while waiting:
            connection = waiting[0]
            wanted = connection.wanted
            if not wanted:  # (gone meanwhile)
                waiting.popleft()
                continue
            if self.reserved + wanted > self.request_memory:
                break
            waiting.popleft()
            self.reserved += wanted
            connection.granted()
        metrics.LANE_MEMORY_RESERVED.set(self.reserved)

    def drop(self, connection: _Connection, reason: str, why: str) -> None:
        """Closes ``connection`` for ``reason`` (a word, a metric label), logging ``why``; what
        it was still to be sent is dropped (a peer that does not read would hold it open)."""
        metrics.labelled(metrics.LANE_CLOSED, reason).inc()
        self._complain(reason, why, connection.peer)
        connection.abort()

    def _complain(self, reason: str, why: str, peer: str) -> None:
        now = time.monotonic()
        last, unlogged = self._logged.get(reason, (-math.inf, 0))
        if now - last < LOG_EVERY:
            self._logged[reason] = (last, unlogged + 1)
            return
        self._logged[reason] = (now, 0)
        log.warning("closed a lane connection", reason=why, peer=peer, unlogged_before=unlogged)


#: The slowest a frame may arrive, beyond ``read_timeout`` (bytes a second): a large batch on a
#: slow link still makes it, a peer trickling a byte at a time does not.
FRAME_RATE_FLOOR = 1024 * 1024

#: What the log says of a connection closed by the sweep, by reason.
_OVERDUE = {
    "read_timeout": "it sent part of a frame and then nothing for {}s",
    "slow_frame": "a frame of it took longer than twice {}s plus 1 s a MiB to arrive",
    "unread_answers": "its answers waited unread for {}s",
    "unauthenticated": "it sent no credentials for {}s",
    "unread_commands": "its node read none of its commands for a minute",
}


class _Connection(asyncio.Protocol):
    def __init__(self, lane: LaneServer) -> None:
        self.lane = lane
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        #: Whom the cap on unproven connections counts it as (``_address_of``).
        self.address = "?"
        #: Its TLS transport while in its handshake (not yet ``transport``).
        self.handshake: TlsTransport | None = None
        #: When it was accepted (time.monotonic()): how long it has had to prove who it is.
        self.accepted_at = time.monotonic()
        #: The identity it counts as, once admitted (``LaneServer.admit``).
        self.counted: Identity | None = None
        #: Who is calling, once proven (an AUTH frame, a client certificate, or insecure).
        self.identity: Identity | None = lane.auth.from_token(None) if lane.auth.insecure else None
        #: Until then, no frame beyond a token's size is read.
        self._decoder = lp.FrameDecoder(lp.REQUEST_LIMIT if self.identity else lp.AUTH_LIMIT)
        #: The client certificate the connection presented (TLS), if any.
        self._certificate: bytes | None = None
        #: The token its AUTH frame proved, checked again on every frame: revoked, it ends
        #: the connection (a client's connection may stay open for as long as it calls).
        self._token: str | None = None
        #: On a node's command stream: the stream, as the driver knows it.
        self._stream: NodeStream | None = None
        #: Calls dispatched and not yet answered.
        self._inflight = 0
        #: Frames read while the answers were not being read: dispatched once they drain.
        self._held: collections.deque[lp.Frame] = collections.deque()
        #: Since when the answers wait unread (writing paused), else None.
        self._paused_since: float | None = None
        #: Request memory reserved for the large frame still arriving (bytes).
        self._reserved = 0
        #: Request memory it waits for (not read meanwhile), else 0.
        self.wanted = 0
        #: Something arrived since the last sweep, which then notes the time.
        self._heard = True
        self._last_heard = self._opened = time.monotonic()
        #: Since when the frame still arriving has been (None: no part of one is here).
        self._frame_since: float | None = None
        #: Since when it has been closing, its last answers still to be sent (else None).
        self._closing_since: float | None = None

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        lane = self.lane
        lane._handshaking.discard(transport)  # (a TLS one: its handshake is done)
        self.handshake = None
        # (its credentials are due a read timeout after the handshake, which had its own)
        self._last_heard = self._opened = time.monotonic()
        if lane.tls is None:  # (a TLS one was counted as it was accepted)
            if not lane._place(self, transport.get_extra_info("peername")):
                transport.abort()
                return
            lane._unproven_add(self)
        self.transport = transport
        if self.identity is not None:  # (an insecure master's: proven as it connects)
            lane.admit(self, self.identity)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock)  # (a node's stream cut silently ends in about half a minute)
        with contextlib.suppress(NotImplementedError):  # (a transport without a buffer)
            transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        tls = transport.get_extra_info("ssl_object")
        if tls is not None:
            self._certificate = tls.getpeercert(binary_form=True)
        lane._connections.add(self)

    def data_received(self, data: bytes) -> None:
        self._heard = True
        try:
            decoder = self._decoder
            frames = decoder.feed(data)
            if not decoder.pending:
                self._frame_since = None
            elif frames or self._frame_since is None:  # (a frame began in this chunk)
                self._frame_since = time.monotonic()
            self._reserve_for_what_arrives()
            if self._held or self._paused_since is not None:
                self._held.extend(frames)
                return
            for at, frame in enumerate(frames):
                self._dispatch(frame)
                if self._paused_since is not None:  # its answers are not being read
                    self._held.extend(frames[at + 1 :])
                    return
        except lp.LaneProtocolError as error:
            self.lane.drop(self, "bad_frame", str(error))

    def _reserve_for_what_arrives(self) -> None:
        """Holds request memory for the frame still arriving, as its header announced, when
        it is large; or stops reading until the lane has that much to give. Gives back what
        a frame held once it is whole. (A node's command stream is exempt: its reports are
        bounded by ``lp.REPORT_LIMIT`` and must never wait behind clients.)"""
        announced = self._decoder.announced
        need = announced if announced > FREE_FRAME and self._stream is None else 0
        if need == self._reserved:
            return
        self._give_back_reserved()
        if need and self.transport is not None:
            if self.lane.reserve(self, need):
                self._reserved = need
            else:
                self.wanted = need
                self.transport.pause_reading()

    def granted(self) -> None:
        """The lane reserved the request memory this connection waited for: read on."""
        self._reserved, self.wanted = self.wanted, 0
        self._heard = True  # (a partial frame's deadline starts again)
        self._frame_since = time.monotonic()  # (the wait was the lane's, not the peer's)
        self._read_on()

    def _give_back_reserved(self) -> None:
        if self._reserved:
            held, self._reserved = self._reserved, 0
            self.lane.give_back(held)

    def _read_on(self) -> None:
        """Reads again, unless its answers wait unread or it waits for request memory."""
        if self._paused_since is None and not self.wanted and self.transport is not None:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._paused_since = time.monotonic()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused_since = None
        self._heard = True  # (a partial frame's deadline starts again)
        if self._frame_since is not None:  # (the pause was the peer's reading, not sending)
            self._frame_since = time.monotonic()
        try:
            while self._held and self._paused_since is None and self.transport is not None:
                self._dispatch(self._held.popleft())
        except lp.LaneProtocolError as error:
            self.lane.drop(self, "bad_frame", str(error))
            return
        self._read_on()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lane._forget(self)
        if self.transport is None:
            return  # refused at the cap: never counted
        self.transport = None
        self._held.clear()
        self.wanted = 0  # (the lane drops it from its line)
        self._give_back_reserved()
        self.lane._connections.discard(self)
        stream, self._stream = self._stream, None
        if stream is not None:
            self.lane.handlers.driver.node_disconnected(stream)
            log.info("node session closed", node_id=stream.node_id)

    def close(self) -> None:
        """Closes once what is still to be sent has gone; the sweep aborts it should that
        not happen within the read timeout (a peer that reads nothing would hold it open)."""
        if self.transport is not None:
            if self._closing_since is None:
                self._closing_since = time.monotonic()
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    @property
    def stalled(self) -> bool:
        """Its answers are waiting unread."""
        return self._paused_since is not None

    # ---- deadlines

    def overdue(self, now: float) -> str | None:
        """Why this connection must be closed at ``now`` (a reason for ``LaneServer.drop``),
        or None. Called by the server's sweep: it also notes when the peer was last heard."""
        if self._heard:
            self._heard = False
            self._last_heard = now
        lane = self.lane
        if self._closing_since is not None:  # (its answers unread: a close never ends)
            return "unread_answers" if now - self._closing_since > lane.read_timeout else None
        if self.identity is None and now - self._opened > lane.read_timeout:
            # (from its handshake, whatever it sends since: credentials are one small frame,
            # and there is no reason to keep a connection long that has not proven who it is)
            return "unauthenticated"
        if self._paused_since is not None:  # not reading: the silence is ours
            if self._stream is not None:  # (a node busy with its disk: given longer)
                stalled = now - self._paused_since > NODE_STREAM_STALL
                return "unread_commands" if stalled else None
            stalled = now - self._paused_since > lane.read_timeout
            return "unread_answers" if stalled else None
        if self.wanted:  # not reading until the lane has memory for its frame: ours too
            return None
        silent = now - self._last_heard
        if self._decoder.pending:
            if silent > lane.read_timeout:
                return "read_timeout"
            allowed = 2 * lane.read_timeout + self._decoder.announced / FRAME_RATE_FLOOR
            since = self._frame_since
            return "slow_frame" if since is not None and now - since > allowed else None
        if self._stream is None and not self._inflight and not self._held:
            return "idle" if silent > lane.idle_timeout else None
        return None

    # ---- frames

    def _dispatch(self, frame: lp.Frame) -> None:
        driver = self.lane.handlers.driver
        identity = self.identity
        if identity is None or frame.method == lp.AUTH:
            if self._closing_since is None:  # (else refused at its AUTH: read no further)
                self._authenticate(frame)
            return
        if self._token is not None and self._revoked(frame):
            return
        if self._stream is not None:  # a node's command stream: every frame is a report
            if not driver.node_report(self._stream, _parse(pb.NodeReport, frame.body)):
                self.close()  # its term ended
            return
        if frame.method == lp.NODE_SESSION:
            self._open_node_session(frame, identity)
            return
        described = lp.LANE_METHODS.get(frame.method)
        if described is None:
            self._send_error(frame, lp.UNIMPLEMENTED, f"no lane method {frame.method}: upgrade")
            return
        name, request_type, _ = described
        refusal = self.lane.gate.refusal(f"/{name}")
        if refusal is not None:
            code, details, leader = refusal
            self._send_error(frame, code.value[0], details, leader)
            return
        call_id = self.lane.shedder.admit(f"/{name}")
        if call_id is None:
            self._send_error(frame, lp.RESOURCE_EXHAUSTED, self.lane.shedder.refusal())
            return
        try:
            request = request_type.FromString(frame.body)
        except Exception:
            self.lane.shedder.release(call_id)
            self._send_error(frame, lp.INVALID_ARGUMENT, f"{name}: the request does not parse")
            return
        metrics.labelled(metrics.LANE_REQUESTS, name).inc()
        self._inflight += 1
        try:
            reply = self.lane.handlers.call(name, request, identity)
        except Exception as error:
            self._answer(frame, call_id, None, _refused(error, frame))
            return
        if isinstance(reply, Pending):
            reply.then(functools.partial(self._answer, frame, call_id))
        else:
            self._answer(frame, call_id, reply, None)

    def _answer(
        self, frame: lp.Frame, call_id: int, response: Any, refused: CallRefused | None
    ) -> None:
        self.lane.shedder.release(call_id)  # answered (or failed): no longer in flight
        self._inflight -= 1
        if refused is not None:
            self._send_error(frame, refused.code.value[0], refused.details)
            return
        try:
            answer = lp.encode(frame.call_id, frame.method, response.SerializeToString())
        except ValueError as error:  # an answer larger than any frame
            self._send_error(frame, lp.RESOURCE_EXHAUSTED, f"{error}: split the batch")
            return
        self._send(answer)

    def _authenticate(self, frame: lp.Frame) -> None:
        """The connection's first frame: its credentials. Anything else, or credentials that
        prove nothing, is answered UNAUTHENTICATED and the connection closed."""
        if self.identity is not None:  # (an insecure master: every caller is let in)
            self._send(lp.encode(frame.call_id, lp.AUTH, b""))
            return
        try:
            if frame.method != lp.AUTH:
                raise self.lane.auth.refusal_before_auth()
            token = frame.body.decode("utf-8", "replace").strip() or None
            identity = self.lane.auth.from_token(token, self._certificate)
        except CallRefused as refused:
            self._send_error(frame, refused.code.value[0], refused.details)
            self.close()
            return
        full = self.lane.admit(self, identity)
        if full is not None:  # (a cap on proven connections: said so, not a bare close)
            self._send_error(frame, lp.RESOURCE_EXHAUSTED, full)
            self.close()
            return
        self.identity, self._token = identity, token
        self._decoder.limit = lp.REQUEST_LIMIT
        self._send(lp.encode(frame.call_id, lp.AUTH, b""))

    def _revoked(self, frame: lp.Frame) -> bool:
        """The connection's token no longer proves its identity (revoked since): the frame
        is refused UNAUTHENTICATED and the connection closed."""
        if self._token is None or not self.lane.auth.revoked(self._token):
            return False
        refused = self.lane.auth.refusal_revoked()
        self._send_error(frame, refused.code.value[0], refused.details)
        self.close()
        return True

    def _open_node_session(self, frame: lp.Frame, identity: Identity) -> None:
        refusal = self.lane.gate.refusal("/NodeSession")
        hello = _parse(pb.NodeReport, frame.body)
        if refusal is None and (not hello.HasField("hello") or not hello.hello.node_id):
            refusal = (grpc.StatusCode.INVALID_ARGUMENT, "say hello with a node_id first", "")
        if refusal is None:
            try:
                authorize(identity, "NodeSession")
                own_node(identity, hello.hello.node_id, "open the command stream")
                self._stream = self.lane.handlers.driver.node_connected(
                    hello.hello.node_id,
                    hello.hello.incarnation,
                    self._send_command,
                    self.close,
                    self.peer,
                )
            except CallRefused as refused:
                refusal = (refused.code, refused.details, "")
        if refusal is not None:
            code, details, leader = refusal
            self._send_error(frame, code.value[0], details, leader)
            self.close()
            return
        metrics.LANE_SESSIONS.inc()
        self._decoder.limit = lp.REPORT_LIMIT
        node_id = hello.hello.node_id
        log.info("node session open", node_id=node_id)

    def _send_command(self, command: pb.NodeCommand) -> None:
        if self._unread_bytes() > NODE_STREAM_BUFFER:
            # the node reads none of its commands: its stream ends (it reconnects, and what
            # it did not answer is sent again), rather than the buffer growing
            self.lane.drop(self, "unread_commands", "its node left its commands unread")
            return
        self._send(lp.encode(0, lp.NODE_SESSION, command.SerializeToString()))

    def _unread_bytes(self) -> int:
        """Bytes waiting in the transport's write buffer (0 for one without a buffer)."""
        try:
            return self.transport.get_write_buffer_size() if self.transport is not None else 0
        except NotImplementedError:
            return 0

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _send_error(self, frame: lp.Frame, code: int, details: str, leader: str = "") -> None:
        self._send(lp.encode_error(frame.call_id, frame.method, code, details, leader))


def _from_environment(variable: str, default: int, most: int | None = None) -> int:
    """The whole number in ``variable`` (from 1 to ``most``), else ``default``."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or (most is not None and value > most):
        within = f"from 1 to {most}" if most is not None else "of at least 1"
        raise ValueError(f"{variable} must be a whole number {within}, got {text!r}")
    return value


def _peer_name(peer: object) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"


def _address_of(peer: object) -> str:
    """Whom the cap on unproven connections counts a peer as: its IP address, an IPv6 one
    by its /64 (what one host is usually given; an IPv4-mapped one as the IPv4 address)."""
    host = peer[0] if isinstance(peer, tuple) and peer and isinstance(peer[0], str) else "?"
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.partition("%")[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


def _refused(error: Exception, frame: lp.Frame) -> CallRefused:
    if isinstance(error, CallRefused):
        return error
    log.error("lane call failed", method=frame.method, exc_info=error)
    return CallRefused(grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")


def _parse(message_type: type[Message], body: bytes) -> Any:
    try:
        return message_type.FromString(body)
    except Exception as error:
        raise lp.LaneProtocolError(f"a {message_type.__name__} that does not parse") from error
