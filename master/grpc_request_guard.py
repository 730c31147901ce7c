"""What a gRPC call to the master must show before its request is read, and that it parses.

gRPC reads a unary call's request whole (up to the message limit) before its handler runs,
and the handler is where the call's identity was checked: anyone who reached the port could
make the master hold that much memory per call in flight. Where callers prove who they are
with bearer tokens (no client certificate required), the token is in the call's metadata,
which arrives first: a call without a token the cluster knows is refused here, its request
never read. (Where client certificates are required, TLS has checked the caller before any
call; the handler still reads the identity the certificate names.)

A call that passes is served as a client-streaming method, so that its request is read when
the handler asks, with a deadline (``REQUEST_READ_TIMEOUT``: DEADLINE_EXCEEDED past it), and
so that one identity's tenant has at most ``UNREAD_PER_TENANT`` calls whose request is still
being read (RESOURCE_EXHAUSTED past it). Without both, a caller with a token could open calls
and send their requests never whole: each holds what gRPC buffered of it, and a slot of the
master's in-flight limit, for as long as the connection lives; a thousand such calls kept
every other tenant's calls refused as the master's being saturated.

A request that does not parse as its method's message is refused INVALID_ARGUMENT, saying so,
where gRPC would answer UNKNOWN with the parser's exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from kvpool.master.authenticator import Authenticator, bearer
from kvpool.master.driver import CallRefused
from kvpool.master.grpc_refusal import refuse, refusing_unread

#: Seconds a call's request may take to arrive whole once the call is dispatched.
REQUEST_READ_TIMEOUT = 10.0
#: Calls of one tenant whose requests are still being read, at most (its clients' calls
#: arrive whole at once: these are for many threads' calls arriving together).
UNREAD_PER_TENANT = 64


class Unparsed:
    """A request that did not parse, in place of the message (its handler refuses it)."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


class RequestGuard(grpc.aio.ServerInterceptor):
    def __init__(self, auth: Authenticator, *, certificates_required: bool) -> None:
        self.auth = auth
        #: Whether the token is checked here (with certificates required, TLS checked them).
        self.checks_tokens = not auth.insecure and not certificates_required
        #: Tenant -> its calls dispatched whose request is not read yet (tenants with any).
        self._unread: dict[str, int] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        name = handler_call_details.method.rsplit("/", 1)[-1]
        if handler.stream_stream is not None:  # (its identity is checked before it reads)
            return grpc.stream_stream_rpc_method_handler(
                _stream_refusing_unparsed(handler.stream_stream, name),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_unary is None:
            return handler
        tenant = None
        if self.checks_tokens:
            try:
                identity = self.auth.from_token(
                    bearer(handler_call_details.invocation_metadata or ())
                )
            except CallRefused as refused:
                return refusing_unread(refused.code, refused.details, handler.response_serializer)
            tenant = identity.tenant
            if self._unread.get(tenant, 0) >= UNREAD_PER_TENANT:
                return refusing_unread(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{name}: {UNREAD_PER_TENANT} calls of this tenant are still sending their "
                    "requests: send each request whole, or retry with backoff",
                    handler.response_serializer,
                )
            self._unread[tenant] = self._unread.get(tenant, 0) + 1
        return grpc.stream_unary_rpc_method_handler(
            self._read_in_time(_refusing_unparsed(handler.unary_unary, name), name, tenant),
            request_deserializer=_tolerant(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )

    def _read_in_time(
        self,
        behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
        name: str,
        tenant: str | None,
    ) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], Awaitable[Any]]:
        """The unary ``behavior`` served as client-streaming: its one request read within
        REQUEST_READ_TIMEOUT, counted among its tenant's unread calls until then."""

        async def served(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            try:
                request = await asyncio.wait_for(anext(requests), REQUEST_READ_TIMEOUT)
            except TimeoutError:
                refuse(
                    context,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"{name}: the request did not arrive whole within "
                    f"{REQUEST_READ_TIMEOUT:g} s of the call: send it at once",
                )
                return None
            except StopAsyncIteration:
                refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"{name}: no request came")
                return None
            finally:
                if tenant is not None:
                    self._read(tenant)
            return await behavior(request, context)

        return served

    def _read(self, tenant: str) -> None:
        left = self._unread[tenant] - 1
        if left:
            self._unread[tenant] = left
        else:
            del self._unread[tenant]


def _tolerant(parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if parse is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception as error:
            return Unparsed(f"{type(error).__name__}: {error}"[:200])

    return deserialize


def _unparsed_refusal(name: str, unparsed: Unparsed) -> str:
    return (
        f"{name}: the request does not parse ({unparsed.error}): "
        "send one built from kvpool's proto/master.proto"
    )


def _refusing_unparsed(
    behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], name: str
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Unparsed):
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, _unparsed_refusal(name, request))
            return None
        return await behavior(request, context)

    return guarded


def _stream_refusing_unparsed(
    behavior: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]], name: str
) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
    """A stream's handler that sees its requests end at the first that does not parse; the
    stream then ends INVALID_ARGUMENT, saying so."""

    async def guarded(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        unparsed: list[Unparsed] = []

        async def parsed() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Unparsed):
                    unparsed.append(request)
                    return
                yield request

        async for answer in behavior(parsed(), context):
            yield answer
        if unparsed:
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, _unparsed_refusal(name, unparsed[0]))

    return guarded
