"""Ending a gRPC call with a refusal's status, without ``context.abort``.

``context.abort`` raises an ``AbortError`` that gRPC keeps on the call's state. The error's
traceback holds the handler's frame, and the frame holds the call's context, which holds that
state: a reference cycle that keeps the whole request (up to the message limit) alive until
the collector's next full pass, which a server tuned to collect rarely (common/gc_tuning.py)
may not run for a long time. A client sending large requests that are refused could grow the
master by gigabytes that way. Setting the status and returning gives the caller the same
status and details (gRPC discards the response of a call whose status is not OK, and a stream
ends with the status set) and leaves nothing behind.

A call refused for who sends it or when (no credentials, a standby, a saturated master) is
refused before its request is read (``refusing_unread``): gRPC reads a unary call's request
whole, up to the message limit, before its handler runs, so anyone who reaches the port could
otherwise make the master hold that much per call in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc


def refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """Makes the call end with ``code`` and ``details``: the handler returns next (a unary
    handler returns None, a streaming one stops)."""
    context.set_code(code)
    context.set_details(details)


def refusing_unread(
    code: grpc.StatusCode,
    details: str,
    response_serializer: Callable[[Any], bytes] | None,
    trailing_metadata: Sequence[tuple[str, str]] = (),
) -> grpc.RpcMethodHandler:
    """A handler, for a unary method, that ends the call with ``code`` and ``details``
    without reading its request: served as a client-streaming method, whose requests are read
    only as its handler asks for them (this one never does; gRPC's flow control then holds
    the peer to one window of bytes, and the stream's end drops them)."""

    async def refuse_unread(requests: Any, context: grpc.aio.ServicerContext) -> None:
        if trailing_metadata:
            context.set_trailing_metadata(tuple(trailing_metadata))
        refuse(context, code, details)

    return grpc.stream_unary_rpc_method_handler(
        refuse_unread, response_serializer=response_serializer
    )
