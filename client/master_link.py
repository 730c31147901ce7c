"""The client's line to the master: blocking gRPC calls with a deadline, retries and failover.

A call is retried with exponential backoff while the master is unreachable or shedding load
(UNAVAILABLE, RESOURCE_EXHAUSTED), and is redirected when a standby master answers that it is
not the leader (FAILED_PRECONDITION, naming the leader) or the leader stops answering, until
the caller's deadline; then MasterUnavailable says what was tried. Other gRPC failures become
typed errors at once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc

from kvpool.common.leader_resolver import LEADER_METADATA, LeaderResolver
from kvpool.common.master_address import MasterTarget, parse_master
from kvpool.errors import InvalidArgument, KVPoolError, MasterUnavailable
from kvpool.proto import master_pb2_grpc

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
MESSAGE_LIMIT = 256 * 1024 * 1024
FIRST_BACKOFF = 0.01
MAX_BACKOFF = 0.5
#: Consecutive failures to reach a master before asking where the leader is now.
FAILURES_BEFORE_RESOLVING = 2


class MasterLink:
    def __init__(self, target: MasterTarget | str) -> None:
        if isinstance(target, str):
            target = parse_master(target)
        self.target = target
        self.address = str(target)
        self.retries = 0  # calls retried because the master was away, busy or not leading
        self._resolver = LeaderResolver(target)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: master_pb2_grpc.MasterStub | None = None
        self._connected_to = ""

    def call(self, method: str, request: Any, deadline: float) -> Any:
        """Calls ``method`` on the leader until it answers or ``deadline`` (monotonic) passes."""
        backoff = FIRST_BACKOFF
        last_error = "no attempt made"
        failures = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MasterUnavailable(
                    f"master {self.address} did not answer {method} before the deadline "
                    f"({last_error}). Check that `kvpool master` runs there and is reachable, "
                    "or raise the client's timeout."
                )
            stub, leader = self._stub_for_leader()
            if stub is None:
                last_error = "no leader elected yet"
                self._resolver.failed()
            else:
                try:
                    return getattr(stub, method)(request, timeout=remaining)
                except grpc.RpcError as error:
                    code = error.code()
                    details = error.details() or ""
                    if code == grpc.StatusCode.FAILED_PRECONDITION and "not the leader" in details:
                        last_error = f"{leader}: {details}"
                        self._resolver.failed(_leader_hint(error))
                    elif code in RETRYABLE or code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        last_error = f"{leader}: {code.name}: {details}"
                        failures += 1
                        busy = code == grpc.StatusCode.RESOURCE_EXHAUSTED
                        if failures >= FAILURES_BEFORE_RESOLVING and not busy:
                            failures = 0
                            self._resolver.failed()
                    elif code == grpc.StatusCode.INVALID_ARGUMENT:
                        raise InvalidArgument(f"master rejected {method}: {details}") from None
                    else:
                        raise KVPoolError(
                            f"master {method} failed: {code.name}: {details}"
                        ) from None
            self.retries += 1
            time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
            backoff = min(backoff * 2, MAX_BACKOFF)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def _stub_for_leader(self) -> tuple[master_pb2_grpc.MasterStub | None, str]:
        leader = self._resolver.current
        with self._lock:
            if not leader:
                return None, ""
            if leader != self._connected_to or self._stub is None:
                if self._channel is not None:
                    self._channel.close()
                self._channel = grpc.insecure_channel(
                    leader,
                    options=[
                        ("grpc.max_receive_message_length", MESSAGE_LIMIT),
                        ("grpc.max_send_message_length", MESSAGE_LIMIT),
                        ("grpc.enable_retries", 0),
                        ("grpc.initial_reconnect_backoff_ms", 50),
                        ("grpc.max_reconnect_backoff_ms", 1000),
                    ],
                )
                self._stub = master_pb2_grpc.MasterStub(self._channel)
                self._connected_to = leader
            return self._stub, leader


def _leader_hint(error: grpc.RpcError) -> str:
    for key, value in error.trailing_metadata() or ():
        if key == LEADER_METADATA:
            return value
    return ""
