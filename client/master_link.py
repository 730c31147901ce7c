"""The client's line to the master: blocking gRPC calls with a deadline and retries.

A call is retried with exponential backoff while the master is unreachable or shedding load
(UNAVAILABLE, RESOURCE_EXHAUSTED), until the caller's deadline; then MasterUnavailable says
what was tried. Other gRPC failures become typed errors at once.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from kvpool.errors import InvalidArgument, KVPoolError, MasterUnavailable
from kvpool.proto import master_pb2_grpc

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
MESSAGE_LIMIT = 256 * 1024 * 1024
FIRST_BACKOFF = 0.01
MAX_BACKOFF = 0.5


class MasterLink:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_receive_message_length", MESSAGE_LIMIT),
                ("grpc.max_send_message_length", MESSAGE_LIMIT),
                ("grpc.enable_retries", 0),
                ("grpc.initial_reconnect_backoff_ms", 50),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._stub = master_pb2_grpc.MasterStub(self._channel)
        self.retries = 0  # calls retried because the master was away or shedding load

    def call(self, method: str, request: Any, deadline: float) -> Any:
        """Calls ``method`` until it answers or ``deadline`` (time.monotonic) passes."""
        rpc = getattr(self._stub, method)
        backoff = FIRST_BACKOFF
        last_error = "no attempt made"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MasterUnavailable(
                    f"master {self.address} did not answer {method} before the deadline "
                    f"({last_error}). Check that `kvpool master` runs there and is reachable, "
                    "or raise the client's timeout."
                )
            try:
                return rpc(request, timeout=remaining)
            except grpc.RpcError as error:
                code = error.code()
                details = error.details() or ""
                if code in RETRYABLE:
                    self.retries += 1
                    last_error = f"{code.name}: {details}"
                    time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                    backoff = min(backoff * 2, MAX_BACKOFF)
                    continue
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    last_error = "DEADLINE_EXCEEDED"
                    continue
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidArgument(f"master rejected {method}: {details}") from None
                raise KVPoolError(f"master {method} failed: {code.name}: {details}") from None

    def close(self) -> None:
        self._channel.close()
