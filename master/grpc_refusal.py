"""Ending a gRPC call with a refusal's status, without ``context.abort``.

``context.abort`` raises an ``AbortError`` that gRPC keeps on the call's state. The error's
traceback holds the handler's frame, and the frame holds the call's context, which holds that
state: a reference cycle that keeps the whole request (up to the message limit) alive until
the collector's next full pass, which a server tuned to collect rarely (common/gc_tuning.py)
may not run for a long time. A client sending large requests that are refused could grow the
master by gigabytes that way. Setting the status and returning gives the caller the same
status and details (gRPC discards the response of a call whose status is not OK, and a stream
ends with the status set) and leaves nothing behind.
"""

from __future__ import annotations

import grpc


def refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """Makes the call end with ``code`` and ``details``: the handler returns next (a unary
    handler returns None, a streaming one stops)."""
    context.set_code(code)
    context.set_details(details)
