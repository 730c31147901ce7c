"""The master over its metadata lane: the hot client calls and the nodes' command streams on
kept-open TCP connections in lean frames (common/lane_protocol.py), beside gRPC.

A thin adapter over the transport-neutral handlers (handlers.py), behind the same leader gate
and load shedder as gRPC: each frame runs its handler as it arrives; an answer that comes
later (a ``Pending``: a PutEnd waiting for its nodes) is sent when it does, so requests on one
connection may be answered out of order and a waiting call never holds up the next. A node's
first frame turns its connection into its command stream.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from typing import Any

import grpc
from google.protobuf.message import Message

from kvpool.common import lane_protocol as lp
from kvpool.common.logging import get_logger
from kvpool.master import metrics
from kvpool.master.driver import CallRefused, NodeStream, Pending
from kvpool.master.handlers import MasterHandlers
from kvpool.master.leader_gate import LeaderGate
from kvpool.master.load_shedding import LoadShedder
from kvpool.proto import master_pb2 as pb

log = get_logger("kvpool.master.lane")


class LaneServer:
    def __init__(self, handlers: MasterHandlers, gate: LeaderGate, shedder: LoadShedder) -> None:
        self.handlers = handlers
        self.gate = gate
        self.shedder = shedder
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[_Connection] = set()

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for connection in list(self._connections):
                connection.close()
            await self._server.wait_closed()


class _Connection(asyncio.Protocol):
    def __init__(self, lane: LaneServer) -> None:
        self.lane = lane
        self.transport: asyncio.Transport | None = None
        self._decoder = lp.FrameDecoder()
        #: On a node's command stream: the stream, as the driver knows it.
        self._stream: NodeStream | None = None

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lane._connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            for frame in self._decoder.feed(data):
                self._dispatch(frame)
        except (lp.LaneProtocolError, ValueError) as error:
            log.warning("dropping a lane connection", error=str(error))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.lane._connections.discard(self)
        stream, self._stream = self._stream, None
        if stream is not None:
            self.lane.handlers.driver.node_disconnected(stream)
            log.info("node session closed", node_id=stream.node_id)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ---- frames

    def _dispatch(self, frame: lp.Frame) -> None:
        driver = self.lane.handlers.driver
        if self._stream is not None:  # a node's command stream: every frame is a report
            if not driver.node_report(self._stream, _parse(pb.NodeReport, frame.body)):
                self.close()  # its term ended
            return
        if frame.method == lp.NODE_SESSION:
            self._open_node_session(frame)
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
        try:
            reply = self.lane.handlers.call(name, request)
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
        if refused is not None:
            self._send_error(frame, refused.code.value[0], refused.details)
        else:
            self._send(lp.encode(frame.call_id, frame.method, response.SerializeToString()))

    def _open_node_session(self, frame: lp.Frame) -> None:
        refusal = self.lane.gate.refusal("/NodeSession")
        hello = _parse(pb.NodeReport, frame.body)
        if refusal is None and (not hello.HasField("hello") or not hello.hello.node_id):
            refusal = (grpc.StatusCode.INVALID_ARGUMENT, "say hello with a node_id first", "")
        if refusal is None and self.lane.handlers.driver.core is None:
            refusal = (grpc.StatusCode.UNAVAILABLE, "this master is not serving: retry", "")
        if refusal is not None:
            code, details, leader = refusal
            self._send_error(frame, code.value[0], details, leader)
            self.close()
            return
        metrics.LANE_SESSIONS.inc()
        node_id = hello.hello.node_id
        self._stream = self.lane.handlers.driver.node_connected(
            node_id, hello.hello.incarnation, self._send_command, self.close
        )
        log.info("node session open", node_id=node_id)

    def _send_command(self, command: pb.NodeCommand) -> None:
        self._send(lp.encode(0, lp.NODE_SESSION, command.SerializeToString()))

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _send_error(self, frame: lp.Frame, code: int, details: str, leader: str = "") -> None:
        self._send(lp.encode_error(frame.call_id, frame.method, code, details, leader))


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
