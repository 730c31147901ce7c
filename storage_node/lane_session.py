"""A storage node's command stream over the master's metadata lane (common/lane_protocol.py).

The same conversation as the gRPC ``NodeSession`` stream (hello, then one answer per command,
in order) in lean frames: every put waits for its node to record the object, so this hop is
on the critical path of every small put, and a Python gRPC stream message costs several
times a framed one. The node falls back to the gRPC stream where the master has no lane or it
cannot be reached.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable

from kvpool.common import lane_protocol as lp
from kvpool.common.tcp_keepalive import keep_alive
from kvpool.common.tls_transport import open_tls_connection
from kvpool.proto import master_pb2 as pb
from kvpool.security.caller import ANONYMOUS, CallerCredentials
from kvpool.storage_node.commands import MAX_GROUP

CONNECT_TIMEOUT = 2.0
#: Commands waiting for (or running on) the asynchronous path at most before the stream is
#: read no further: what the master sends meanwhile waits in its own buffers, where its
#: back-pressure (the gRPC stream's too) sees it, rather than grow the node without bound
#: while its disk is slow. Read again once half of them are done.
BACKLOG_CAP = 32 * MAX_GROUP
#: Bytes of answers the master has not read at most before the node ends the stream. Not a
#: pause of its reading: the master stops reading answers while the node reads no commands
#: (each side's writes back up), and two such pauses would stall each other for good; the
#: node reads on, and a master that reads nothing for this long is taken for stuck.
UNSENT_ANSWERS_CAP = 16 << 20


class SessionRefused(Exception):
    """The master ended the stream with an error (a standby names the leader)."""

    def __init__(self, code: int, details: str, leader: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.leader = leader


async def serve_commands(
    host: str,
    port: int,
    hello: pb.NodeHello,
    run_commands: Callable[[list[pb.NodeCommand]], Awaitable[list[pb.CommandResult]]],
    run_now: Callable[[pb.NodeCommand], pb.CommandResult | None] = lambda command: None,
    credentials: CallerCredentials = ANONYMOUS,
    groups_with: Callable[[pb.NodeCommand, pb.NodeCommand], bool] = lambda first, later: False,
) -> None:
    """Answers the master's commands, in order, until the master closes the connection.
    ``run_now`` answers a command on the spot where it can (one that only touches memory,
    with nothing before it still running): the answer then leaves in the same pass of the
    event loop as the command arrived. Commands found waiting back to back that
    ``groups_with`` the first of them go to ``run_commands`` together (at most
    ``MAX_GROUP``; storage_node/commands.py says why). Raises lp.LaneUnreachable when the
    lane cannot be reached, SessionRefused when the master refuses, OSError when the
    connection breaks.
    The connection opens with the node's credentials (TLS where a CA is given, then the
    AUTH frame), then the hello."""
    loop = asyncio.get_running_loop()
    stream = _CommandStream(hello, run_commands, run_now, credentials.lane_auth, groups_with)
    tls = credentials.lane_context()
    transport: asyncio.BaseTransport
    try:
        if tls is None:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: stream, host, port), timeout=CONNECT_TIMEOUT
            )
        else:  # (OpenSSL on the socket itself: common/tls_transport.py)
            transport = await open_tls_connection(stream, host, port, tls, CONNECT_TIMEOUT)
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as error:
        # (ended in the handshake without a word, as a reset does, which is unreachable
        # too: a master at its connection cap, say; a certificate refused says why, below.
        # The node keeps its command stream over gRPC instead)
        raise lp.LaneUnreachable(
            f"the lane at {host}:{port} ended the connection in its TLS handshake ({error})"
        ) from None
    except ssl.SSLError as error:
        raise SessionRefused(
            lp.UNAVAILABLE,
            f"TLS with the master's lane at {host}:{port} failed ({error}): check --tls-ca",
            "",
        ) from None
    except (TimeoutError, OSError) as error:
        raise lp.LaneUnreachable(f"cannot connect to the lane at {host}:{port}: {error}") from None
    try:
        # No deadline here: the stream lives as long as the master leads; a silent master is
        # noticed by the node's heartbeats, which then end this session, and a connection
        # cut silently by TCP keepalive (common/tcp_keepalive.py).
        await stream.serve()
    finally:
        transport.close()


class _CommandStream(asyncio.Protocol):
    """The connection: commands in, one answer per command out, in order."""

    def __init__(
        self,
        hello: pb.NodeHello,
        run_commands: Callable[[list[pb.NodeCommand]], Awaitable[list[pb.CommandResult]]],
        run_now: Callable[[pb.NodeCommand], pb.CommandResult | None],
        auth: bytes,
        groups_with: Callable[[pb.NodeCommand, pb.NodeCommand], bool],
    ) -> None:
        self._hello = hello
        self._auth = auth
        self._run_commands = run_commands
        self._run_now = run_now
        self._groups_with = groups_with
        self._decoder = lp.FrameDecoder()
        self._transport: asyncio.Transport | None = None
        #: Commands that wait for (or run on) the asynchronous path, in order.
        self._backlog: asyncio.Queue[pb.NodeCommand] = asyncio.Queue()
        self._unfinished = 0  # commands taken on the asynchronous path and not yet answered
        self._ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock)  # (a stream cut silently is noticed in about half a minute)
        self.send(lp.encode(0, lp.AUTH, self._auth))
        self.send(
            lp.encode(0, lp.NODE_SESSION, pb.NodeReport(hello=self._hello).SerializeToString())
        )

    def data_received(self, data: bytes) -> None:
        try:
            for frame in self._decoder.feed(data):
                if frame.status != lp.OK:
                    if frame.method == lp.AUTH and frame.status == lp.UNIMPLEMENTED:
                        continue  # an older master: it checks no credentials
                    raise SessionRefused(frame.status, *frame.error())
                if frame.method == lp.AUTH:
                    continue  # the credentials were accepted
                command = pb.NodeCommand.FromString(frame.body)
                if not self._unfinished:
                    result = self._run_now(command)
                    if result is not None:
                        self._answer(result)
                        continue
                self._unfinished += 1
                self._backlog.put_nowait(command)
            if self._unfinished >= BACKLOG_CAP and self._transport is not None:
                self._transport.pause_reading()
        except Exception as error:  # a refusal, a frame that does not parse
            self._end(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)

    def send(self, data: bytes) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            if transport.get_write_buffer_size() > UNSENT_ANSWERS_CAP:
                self._end(
                    ConnectionError(
                        f"the master read none of the node's last {UNSENT_ANSWERS_CAP >> 20} "
                        "MiB of answers: the command stream is ended (the node looks for the "
                        "leader again)"
                    )
                )

    async def serve(self) -> None:
        """Runs the commands that cannot be answered on the spot, in order, until the
        connection ends (raising what ended it, if anything but the master closing it)."""
        worker = asyncio.ensure_future(self._work())
        try:
            await self._ended
        finally:
            worker.cancel()

    async def _work(self) -> None:
        carried: pb.NodeCommand | None = None  # (taken, and not of the group before it)
        while True:
            first = carried if carried is not None else await self._backlog.get()
            carried = None
            group = [first]
            while len(group) < MAX_GROUP and not self._backlog.empty():
                later = self._backlog.get_nowait()
                if not self._groups_with(first, later):
                    carried = later
                    break
                group.append(later)
            try:
                results = await self._run_commands(group)
            except Exception as error:  # ends the session, as it did the reading task
                self._end(error)
                return
            finally:
                self._unfinished -= len(group)
                transport = self._transport
                if (
                    transport is not None
                    and not transport.is_reading()
                    and not transport.is_closing()
                    and self._unfinished <= BACKLOG_CAP // 2
                ):
                    transport.resume_reading()
            for result in results:
                self._answer(result)

    def _answer(self, result: pb.CommandResult) -> None:
        if len(result.error) > lp.REPORT_ERROR_CHARS:  # the master reads reports of a bounded size
            result.error = result.error[: lp.REPORT_ERROR_CHARS - 3] + "..."
        self.send(lp.encode(0, lp.NODE_SESSION, pb.NodeReport(result=result).SerializeToString()))

    def _end(self, error: Exception | None) -> None:
        if self._transport is not None:
            self._transport.close()
        if not self._ended.done():
            if error is None:
                self._ended.set_result(None)
            else:
                self._ended.set_exception(error)
