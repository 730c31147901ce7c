"""Only the leading master answers: the others refuse, naming the leader.

A standby (or a leader whose etcd lease may be running out) answers every call with
FAILED_PRECONDITION "not the leader" and the leader's address in the ``kvpool-leader``
trailing metadata, so clients and nodes go there instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc

from kvpool.common.leader_resolver import LEADER_METADATA


class Leadership(Protocol):
    leader: str

    def serving(self) -> bool: ...


#: Calls a new leader takes while it rebuilds its index: the nodes' own.
NODE_METHODS = ("/MountSegment", "/UnmountSegment", "/Heartbeat", "/NodeSession")


class LeaderGate(grpc.aio.ServerInterceptor):
    """Refuses every call on a standby; on a new leader still rebuilding its index from the
    nodes, refuses clients' calls with UNAVAILABLE (they retry) and takes the nodes'."""

    def __init__(
        self, leadership: Leadership, accepting_clients: Callable[[], bool] = lambda: True
    ) -> None:
        self.leadership = leadership
        self.accepting_clients = accepting_clients

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if self.leadership.serving():
            if self.accepting_clients() or handler_call_details.method.endswith(NODE_METHODS):
                return handler
            refuse = self._rebuilding
        else:
            refuse = self._refuse
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                refuse,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            self._refuse_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    async def _refuse(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        leader = self.leadership.leader
        if leader:
            context.set_trailing_metadata(((LEADER_METADATA, leader),))
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"not the leader: the leader is {leader}" if leader else "not the leader: none yet",
        )

    async def _rebuilding(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            "a new leader is rebuilding its index from the storage nodes: retry shortly",
        )

    async def _refuse_stream(self, request_iterator: Any, context: grpc.aio.ServicerContext):
        await self._refuse(None, context)
        yield  # pragma: no cover - unreachable: abort raises
