"""The master over gRPC: a thin ``grpc.aio`` adapter over the transport-neutral handlers
(handlers.py). Each call's identity comes from its metadata or client certificate
(authenticator.py); a handler's refusal becomes the call's status (grpc_refusal.py); an
answer that comes later (a ``Pending``) is awaited. A node's command stream is a
bidirectional stream: the driver writes commands into the stream's queue, and the node's
reports go to the driver as they arrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from kvpool.common.logging import get_logger
from kvpool.master.access import authorize, own_node
from kvpool.master.authenticator import Authenticator
from kvpool.master.driver import CallRefused, NodeStream, Pending
from kvpool.master.grpc_refusal import refuse
from kvpool.master.handlers import UNARY_METHODS, MasterHandlers
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc

log = get_logger("kvpool.master")


def _unary(name: str) -> Callable[..., Any]:
    async def method(self: MasterService, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            identity = self.auth.from_grpc(context)
            reply = self.handlers.call(name, request, identity)
        except CallRefused as refused:
            code, details = refused.code, refused.details
        else:
            if not isinstance(reply, Pending):
                return reply
            reply, later = await reply.outcome()
            if later is None:
                return reply
            code, details = later.code, later.details
        # (outside the except block: the refusal and its traceback, which holds every frame
        # of the refused call and the request, are dropped as the block ends)
        refuse(context, code, details)
        return None

    method.__name__ = name
    return method


#: Commands waiting for a node that does not read them, at most: past that its gRPC command
#: stream ends (on the lane, NODE_STREAM_BUFFER bytes).
MAX_QUEUED_COMMANDS = 100_000
#: Seconds a node's command stream may stay open before its hello (as the lane's
#: ``read_timeout``): a caller with a node token cannot hold handlers open by saying nothing.
HELLO_TIMEOUT = 10.0


class MasterService(master_pb2_grpc.MasterServicer):
    def __init__(self, handlers: MasterHandlers, auth: Authenticator) -> None:
        self.handlers = handlers
        self.driver = handlers.driver
        self.auth = auth

    async def NodeSession(
        self, request_iterator: AsyncIterator[pb.NodeReport], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.NodeCommand]:
        """A node's command stream: its hello, then an answer per command we send."""
        try:
            identity = self.auth.from_grpc(context)
            authorize(identity, "NodeSession")
        except CallRefused as refused:
            refuse(context, refused.code, refused.details)
            return
        try:
            hello = await asyncio.wait_for(anext(aiter(request_iterator), None), HELLO_TIMEOUT)
        except TimeoutError:
            refuse(
                context,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no hello within {HELLO_TIMEOUT:g} s of opening the command stream: a node "
                "says hello (its node_id) first",
            )
            return
        if hello is None or not hello.HasField("hello") or not hello.hello.node_id:
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "say hello with a node_id first")
            return
        node_id = hello.hello.node_id
        queue: asyncio.Queue[pb.NodeCommand | None] = asyncio.Queue()
        handler = asyncio.current_task()

        ending = False

        def send(command: pb.NodeCommand) -> None:
            nonlocal ending
            if queue.qsize() < MAX_QUEUED_COMMANDS:
                queue.put_nowait(command)
            elif not ending and handler is not None and not handler.done():
                # the node reads none of its commands: its stream ends (it reconnects, and
                # what it did not answer is sent again), rather than the queue growing
                ending = True
                log.warning("node reads no commands; ending its stream", node_id=node_id)
                handler.cancel()

        try:
            own_node(identity, node_id, "open the command stream")
            stream = self.driver.node_connected(
                node_id,
                hello.hello.incarnation,
                send,
                lambda: queue.put_nowait(None),
                context.peer(),
            )
        except CallRefused as refused:
            refuse(context, refused.code, refused.details)
            return
        reader = asyncio.create_task(self._read_reports(request_iterator, stream))
        # When the node's side ends, so does this handler.

        def end_with_the_node(_: asyncio.Task[None]) -> None:
            if handler is not None and not handler.done():
                handler.cancel()

        reader.add_done_callback(end_with_the_node)
        log.info("node session open", node_id=node_id)
        try:
            while True:
                command = await queue.get()
                if command is None:  # the term ended: the node must find the new leader
                    return
                yield command
        except asyncio.CancelledError:
            if not reader.done():
                raise  # gRPC ended the call
        finally:
            reader.remove_done_callback(end_with_the_node)
            self.driver.node_disconnected(stream)
            reader.cancel()
            why = ""
            try:
                await reader
            except asyncio.CancelledError:
                pass
            except Exception as error:  # (the stream broke, or a bug: said, not swallowed)
                why = repr(error)
            log.info("node session closed", node_id=node_id, error=why or None)

    async def _read_reports(
        self, request_iterator: AsyncIterator[pb.NodeReport], stream: NodeStream
    ) -> None:
        async for report in request_iterator:
            if not self.driver.node_report(stream, report):
                return


for _name in UNARY_METHODS:
    setattr(MasterService, _name, _unary(_name))
