"""Load shedding: beyond a limit of client calls in flight, answer RESOURCE_EXHAUSTED.

A saturated master that queued without bound would turn every client's deadline into a
timeout; refusing at once lets clients back off and retry (they do, until their deadline).
A call counts from the moment it is dispatched (before its request is even read) until its
answer is sent. Node command streams are long-lived and exempt: they are not load, and must
never be shed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from kvpool.master import metrics
from kvpool.master.grpc_refusal import refusing_unread

EXEMPT_SUFFIX = "/NodeSession"
#: A call dispatched but never run (cancelled while its request was read) stops counting
#: after this long.
STALE_AFTER = 30.0


class LoadShedder(grpc.aio.ServerInterceptor):
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the in-flight limit must be at least 1, got {limit}")
        self.limit = limit
        self._inflight: dict[int, float] = {}
        self._ids = itertools.count()

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.endswith(EXEMPT_SUFFIX):
            return handler
        # (a unary method comes as unary, or as client-streaming from the request guard,
        # which reads its one request with a deadline: grpc_request_guard.py)
        behavior = handler.unary_unary or handler.stream_unary
        if behavior is None:
            return handler
        call_id = self.admit(method)
        if call_id is None:
            return refusing_unread(
                grpc.StatusCode.RESOURCE_EXHAUSTED, self.refusal(), handler.response_serializer
            )
        make = (
            grpc.unary_unary_rpc_method_handler
            if handler.unary_unary is not None
            else grpc.stream_unary_rpc_method_handler
        )
        return make(
            self._counted(behavior, call_id),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def admit(self, method: str) -> int | None:
        """Counts a call in (its id, to ``release`` when answered), or None when the master is
        saturated and the call must be refused. Shared by gRPC and the metadata lane."""
        if len(self._inflight) >= self.limit:
            self._forget_stale()
        if len(self._inflight) >= self.limit:
            metrics.labelled(metrics.SHED, method.rsplit("/", 1)[-1]).inc()
            return None
        call_id = next(self._ids)
        self._inflight[call_id] = time.monotonic()
        return call_id

    def release(self, call_id: int) -> None:
        self._inflight.pop(call_id, None)

    def refusal(self) -> str:
        return f"the master is saturated ({self.limit} calls in flight): retry with backoff"

    def _counted(self, behavior: Callable[..., Awaitable[Any]], call_id: int) -> Any:
        async def counted(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await behavior(request, context)
            finally:
                self.release(call_id)

        return counted

    def _forget_stale(self) -> None:
        too_old = time.monotonic() - STALE_AFTER
        for call_id in [c for c, started in self._inflight.items() if started < too_old]:
            del self._inflight[call_id]
