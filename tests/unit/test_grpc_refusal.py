"""A refused gRPC call leaves nothing of itself behind (master/grpc_refusal.py).

The master's gRPC adapter and its interceptors, in a real ``grpc.aio`` server in this process
over the real handlers, driver and core. A refusal used to be ``context.abort``, whose
``AbortError`` gRPC keeps on the call's state, in a reference cycle with the handler's frame:
each refused request stayed in memory until the collector's next full pass, which a master
(common/gc_tuning.py) runs rarely. A client sending large refused requests grew the master by
gigabytes. A call refused after it waited (a ``Pending``) had the same kind of cycle through
the frame that kept its refusal. The collector is off while these tests count what a call
left alive.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import Iterator
from typing import NamedTuple

import grpc
import pytest
from state_helpers import segment_info

from kvpool.master.authenticator import Authenticator
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.driver import CallRefused, CoreDriver, Pending
from kvpool.master.handlers import MasterHandlers
from kvpool.master.leader_gate import LeaderGate
from kvpool.master.load_shedding import LoadShedder
from kvpool.master.service import MasterService
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc

#: A key past the longest a key may be: the Exists is refused INVALID_ARGUMENT.
TOO_LONG = "x" * 100_000


class Standby:
    leader = "10.0.0.9:50051"

    def serving(self) -> bool:
        return False


class Leader:
    leader = ""

    def serving(self) -> bool:
        return True


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def live_requests() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, pb.ExistsRequest))


async def refused_calls(leadership: Standby | Leader, calls: int) -> list[grpc.aio.AioRpcError]:
    """Sends ``calls`` Exists of a too-long key (as bytes: the test itself holds no request
    message) to a master of ``leadership``; the errors they ended with."""
    state = MasterState(MasterConfig(), clock=time.monotonic)
    state.mount_segment(segment_info("n1", 64 << 20), [])
    handlers = MasterHandlers(CoreDriver(MasterCore(state)))
    server = grpc.aio.server(interceptors=[LoadShedder(100), LeaderGate(leadership)])
    service = MasterService(handlers, Authenticator(None, insecure=True))
    master_pb2_grpc.add_MasterServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    request = pb.ExistsRequest(client_id="c", keys=[TOO_LONG]).SerializeToString()
    errors = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            exists = channel.unary_unary("/kvpool.v1.Master/Exists")
            for _ in range(calls):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await exists(request, timeout=10)
                errors.append(refused.value)
    finally:
        await server.stop(None)
    return errors


def test_a_request_the_handler_refuses_is_freed_with_its_call(collector_off):
    errors = asyncio.run(refused_calls(Leader(), 5))
    assert {e.code() for e in errors} == {grpc.StatusCode.INVALID_ARGUMENT}
    assert "key 'xxxx" in errors[0].details() and "100000 characters" in errors[0].details()
    assert live_requests() == 0, "refused requests are still held"


def test_a_request_a_standby_refuses_is_freed_with_its_call(collector_off):
    errors = asyncio.run(refused_calls(Standby(), 5))
    assert {e.code() for e in errors} == {grpc.StatusCode.FAILED_PRECONDITION}
    assert errors[0].details() == "not the leader: the leader is 10.0.0.9:50051"
    assert dict(errors[0].trailing_metadata())["kvpool-leader"] == "10.0.0.9:50051"
    assert live_requests() == 0, "refused requests are still held"


class Held:
    """Something a waiting call holds (its request, say), watched through a weak reference."""


def refusing_with(held: Held) -> Pending:
    """A waiting call whose answer is refused, holding ``held`` until it is done."""

    def finish(answer: object) -> object:
        raise CallRefused(grpc.StatusCode.NOT_FOUND, f"nothing for {held!r}")

    return Pending(finish)


def test_a_call_refused_after_it_waited_leaves_nothing_it_held_behind(collector_off):
    async def waiter(pending: Pending) -> tuple[object, CallRefused | None]:
        outcome = asyncio.ensure_future(pending.outcome())
        await asyncio.sleep(0)
        pending.resolve("the core's answer")
        return await outcome

    held = Held()
    alive = weakref.ref(held)
    pending = refusing_with(held)
    del held
    response, refused = asyncio.run(waiter(pending))
    assert response is None and refused is not None
    assert refused.code == grpc.StatusCode.NOT_FOUND
    del pending, refused
    assert alive() is None, "the refused call's frames still hold what it held"


class CallDetails(NamedTuple):
    """What gRPC tells interceptors of a call (``grpc.HandlerCallDetails``)."""

    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


def interceptors_handler(interceptor: grpc.aio.ServerInterceptor) -> grpc.RpcMethodHandler:
    """The handler ``interceptor`` gives for a unary method (Exists)."""
    exists = grpc.unary_unary_rpc_method_handler(
        lambda request, context: None,
        request_deserializer=pb.ExistsRequest.FromString,
        response_serializer=pb.ExistsResponse.SerializeToString,
    )

    async def continuation(details: object) -> grpc.RpcMethodHandler:
        return exists

    details = CallDetails("/kvpool.v1.Master/Exists", ())
    return asyncio.run(interceptor.intercept_service(continuation, details))


def test_a_standby_and_a_saturated_master_refuse_before_the_request_is_read():
    """gRPC reads a unary call's request whole before its handler runs: a refusal that does
    not depend on the request is served as a handler that never asks for it."""
    full = LoadShedder(1)
    assert full.admit("/Exists") is not None
    for refusing in (LeaderGate(Standby()), full):
        handler = interceptors_handler(refusing)
        assert handler.unary_unary is None and handler.request_deserializer is None
        assert handler.stream_unary is not None, "a request stream the handler never reads"
    taking = interceptors_handler(LeaderGate(Leader()))
    assert taking.unary_unary is not None, "a call taken is read as before"
