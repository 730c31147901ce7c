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
from collections.abc import Awaitable, Callable

from kvpool.common import lane_protocol as lp
from kvpool.proto import master_pb2 as pb

CONNECT_TIMEOUT = 2.0


class LaneUnreachable(Exception):
    """No connection to the lane could be made: the node uses the gRPC stream instead."""


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
    run_command: Callable[[pb.NodeCommand], Awaitable[pb.CommandResult]],
) -> None:
    """Answers the master's commands, in order, until the master closes the connection.
    Raises LaneUnreachable when the lane cannot be reached, SessionRefused when the master
    refuses, OSError when the connection breaks."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), timeout=CONNECT_TIMEOUT
        )
    except (TimeoutError, OSError) as error:
        raise LaneUnreachable(f"cannot connect to the lane at {host}:{port}: {error}") from None
    try:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        writer.write(lp.encode(0, lp.NODE_SESSION, pb.NodeReport(hello=hello).SerializeToString()))
        decoder = lp.FrameDecoder()
        while True:
            # No deadline here: the stream lives as long as the master leads; a silent master
            # is noticed by the node's heartbeats, which then end this session.
            data = await reader.read(1 << 16)
            if not data:
                return
            for frame in decoder.feed(data):
                if frame.status != lp.OK:
                    raise SessionRefused(frame.status, *frame.error())
                result = await run_command(pb.NodeCommand.FromString(frame.body))
                report = pb.NodeReport(result=result).SerializeToString()
                writer.write(lp.encode(0, lp.NODE_SESSION, report))
    finally:
        writer.close()
