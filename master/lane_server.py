"""The master's metadata lane: the hot client calls and the nodes' command streams over
kept-open TCP connections in lean frames (common/lane_protocol.py), beside gRPC.

Each frame runs the very handler gRPC runs (``MasterService``), behind the same leader gate
and load shedder, so both doors give the same answers; only the envelope differs. Requests
on one connection may be answered out of order (a call that waits, such as a PutEnd waiting
for its nodes, does not hold up the next). A node's first frame turns its connection into
its command stream.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc

from kvpool.common import lane_protocol as lp
from kvpool.common.logging import get_logger
from kvpool.master import metrics
from kvpool.master.leader_gate import LeaderGate
from kvpool.master.load_shedding import LoadShedder
from kvpool.proto import master_pb2 as pb

log = get_logger("kvpool.master.lane")


class LaneAbort(Exception):
    """A handler's ``context.abort``: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class LaneContext:
    """What handlers use of a ``grpc.aio.ServicerContext``."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise LaneAbort(code, details)

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass


class LaneServer:
    def __init__(self, service: Any, gate: LeaderGate, shedder: LoadShedder) -> None:
        self.service = service
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
        self._tasks: set[asyncio.Task[None]] = set()
        #: On a node's command stream: its reports, in order.
        self._reports: _Reports | None = None

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
            frames = self._decoder.feed(data)
            for frame in frames:
                self._dispatch(frame)
        except (lp.LaneProtocolError, ValueError) as error:
            log.warning("dropping a lane connection", error=str(error))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.lane._connections.discard(self)
        if self._reports is not None:
            self._reports.end()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ---- frames

    def _dispatch(self, frame: lp.Frame) -> None:
        if self._reports is not None:  # a node's command stream: every frame is a report
            self._reports.put(_parse(pb.NodeReport, frame.body))
            return
        if frame.method == lp.NODE_SESSION:
            hello = _parse(pb.NodeReport, frame.body)
            self._reports = _Reports(self._send_command)
            self._reports.put(hello)
            self._spawn(self._node_session(frame))
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
        handler = getattr(self.lane.service, name)
        metrics.labelled(metrics.LANE_REQUESTS, name).inc()
        self._step(handler(request, LaneContext()), frame, call_id)

    def _step(self, call: Coroutine[Any, Any, Any], frame: lp.Frame, call_id: int, *_: Any) -> None:
        """Runs a handler until it answers or waits; one that waits runs on once what it
        waits for is done. This is what an asyncio task does, without the task: most calls
        answer in one go, and a task would first cost a pass of the event loop."""
        try:
            try:
                waited = call.send(None)
            except StopIteration as finished:
                body = finished.value.SerializeToString()
            else:
                resume = functools.partial(self._step, call, frame, call_id)
                if waited is None:  # a bare yield (asyncio.sleep(0)): again on the next pass
                    asyncio.get_running_loop().call_soon(resume)
                    return
                if not asyncio.isfuture(waited):
                    call.close()
                    raise RuntimeError(f"a handler waited on {waited!r}, not a future")
                waited._asyncio_future_blocking = False  # (as a task does when it takes it)
                waited.add_done_callback(resume)
                return
        except LaneAbort as abort:
            self._send_error(frame, abort.code.value[0], abort.details)
        except asyncio.CancelledError:  # what it waited for was cancelled: the client retries
            self._send_error(frame, lp.CANCELLED, "the call was cancelled: retry")
        except Exception as error:
            log.exception("lane call failed", method=frame.method)
            self._send_error(frame, lp.INTERNAL, f"{type(error).__name__}: {error}")
        else:
            self._send(lp.encode(frame.call_id, frame.method, body))
        self.lane.shedder.release(call_id)  # answered (or failed): no longer in flight

    async def _node_session(self, first: lp.Frame) -> None:
        """Runs the service's NodeSession over this connection until either side ends it."""
        refusal = self.lane.gate.refusal("/NodeSession")
        if refusal is not None:
            code, details, leader = refusal
            self._send_error(first, code.value[0], details, leader)
            self.close()
            return
        assert self._reports is not None
        metrics.LANE_SESSIONS.inc()
        commands = self.lane.service.NodeSession(self._reports, LaneContext())
        try:
            async for command in commands:
                self._send_command(command)
        except LaneAbort as abort:
            self._send_error(first, abort.code.value[0], abort.details)
        except asyncio.CancelledError:
            pass  # the node's side ended (NodeSession cancels its own task then)
        finally:
            self.close()

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send_command(self, command: pb.NodeCommand) -> None:
        self._send(lp.encode(0, lp.NODE_SESSION, command.SerializeToString()))

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _send_error(self, frame: lp.Frame, code: int, details: str, leader: str = "") -> None:
        self._send(lp.encode_error(frame.call_id, frame.method, code, details, leader))


class _Reports:
    """A node's side of its command stream, as NodeSession reads and writes it: its reports
    (an async iterator, or handed over as they arrive through ``deliver_to``) and
    ``send_now``, which writes a command at once."""

    def __init__(self, send_now: Callable[[pb.NodeCommand], None]) -> None:
        self.send_now = send_now
        self._queue: asyncio.Queue[pb.NodeReport | None] = asyncio.Queue()
        self._on_report: Callable[[pb.NodeReport], bool] | None = None
        self._ended: asyncio.Future[None] | None = None

    def put(self, report: pb.NodeReport) -> None:
        on_report = self._on_report
        if on_report is None:
            self._queue.put_nowait(report)
            return
        try:
            if not on_report(report):
                self._finish(None)
        except Exception as error:  # ends the session, as it would a reading task
            self._finish(error)

    def end(self) -> None:
        """The connection ended."""
        self._queue.put_nowait(None)
        self._finish(None)

    async def deliver_to(self, on_report: Callable[[pb.NodeReport], bool]) -> None:
        """Hands every report to ``on_report`` as its frame arrives, without a pass of the
        event loop, until the connection ends or ``on_report`` returns False."""
        while not self._queue.empty():  # what came before the session listened, in order
            report = self._queue.get_nowait()
            if report is None:  # the connection already ended
                self._queue.put_nowait(None)  # (stays ended for any later reader)
                return
            if not on_report(report):
                return
        self._ended = asyncio.get_running_loop().create_future()
        self._on_report = on_report
        try:
            await self._ended
        finally:
            self._on_report = None

    def _finish(self, error: Exception | None) -> None:
        self._on_report = None  # nothing more is delivered, even from the same data
        ended = self._ended
        if ended is not None and not ended.done():
            if error is None:
                ended.set_result(None)
            else:
                ended.set_exception(error)

    def __aiter__(self) -> _Reports:
        return self

    async def __anext__(self) -> pb.NodeReport:
        report = await self._queue.get()
        if report is None:
            self._queue.put_nowait(None)  # stays ended for any later reader
            raise StopAsyncIteration
        return report


def _parse(message_type: type, body: bytes) -> Any:
    try:
        return message_type.FromString(body)
    except Exception as error:
        raise lp.LaneProtocolError(f"a {message_type.__name__} that does not parse") from error
