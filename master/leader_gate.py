"""Only the leading master answers: the others refuse, naming the leader.

A standby (or a leader whose etcd lease may be running out) answers every call with
FAILED_PRECONDITION "not the leader" and the leader's address in the ``kvpool-leader``
trailing metadata, so clients and nodes go there instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc

from kvpool.common.leader_resolver import LEADER_METADATA
from kvpool.master.grpc_refusal import refuse as end_with
from kvpool.master.grpc_refusal import refusing_unread


class Leadership(Protocol):
    leader: str

    def serving(self) -> bool: ...


#: Calls a new leader takes while it rebuilds its index: the nodes' own (``Lane`` too: nodes
#: ask for it before opening their command streams).
NODE_METHODS = ("/MountSegment", "/UnmountSegment", "/Heartbeat", "/NodeSession", "/Lane")
#: Calls a leader answers while it turns clients away: what an operator asks during the
#: outage (the status answer says why clients are refused), which change no object.
STATUS_METHODS = ("/ClusterStatus", "/Story")


class LeaderGate(grpc.aio.ServerInterceptor):
    """Refuses every call on a standby; on a leader that may not answer clients from what it
    holds (a new leader still rebuilding its index from the nodes, one that hears from no
    node: ``MasterCore.client_refusal``), refuses clients' calls with UNAVAILABLE (they
    retry) and takes the nodes'."""

    def __init__(
        self, leadership: Leadership, client_refusal: Callable[[], str | None] = lambda: None
    ) -> None:
        self.leadership = leadership
        self.client_refusal = client_refusal

    def refusal(self, method: str) -> tuple[grpc.StatusCode, str, str] | None:
        """Why this master turns ``method`` (``/Name``) away now, as (code, details, leader
        hint), or None when it takes it. Shared by gRPC and the metadata lane."""
        if self.leadership.serving():
            if method.endswith(NODE_METHODS) or method.endswith(STATUS_METHODS):
                return None
            why = self.client_refusal()
            return None if why is None else (grpc.StatusCode.UNAVAILABLE, why, "")
        leader = self.leadership.leader
        details = f"not the leader: the leader is {leader or '(none yet)'}"
        return grpc.StatusCode.FAILED_PRECONDITION, details, leader

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        refusal = self.refusal(handler_call_details.method)
        if refusal is None:
            return handler
        if handler.unary_unary is not None:
            code, details, leader = refusal
            hint = ((LEADER_METADATA, leader),) if leader else ()
            return refusing_unread(code, details, handler.response_serializer, hint)
        refuse = self._refuser(*refusal)

        async def refuse_stream(
            request_iterator: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[None]:
            await refuse(None, context)
            return
            yield  # pragma: no cover - unreachable: (makes this an async generator)

        return grpc.stream_stream_rpc_method_handler(
            refuse_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    @staticmethod
    def _refuser(code: grpc.StatusCode, details: str, leader: str) -> Callable[..., Any]:
        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if leader:
                context.set_trailing_metadata(((LEADER_METADATA, leader),))
            end_with(context, code, details)
            return None

        return refuse
