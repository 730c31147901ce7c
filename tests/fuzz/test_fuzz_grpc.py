"""Every unary method of a real ``kvpool master``'s gRPC service, fed generated requests.

Whatever a request holds, the master answers it or refuses it with a status it chose
(INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED...), never UNKNOWN or INTERNAL (an exception
its handler did not expect), and goes on serving: the watch's probe, canaries, memory bound
and logs (tests/fuzz/fuzzing.py) hold after every case.
"""

from __future__ import annotations

import grpc
import pytest
from fuzzing import Watch, fuzz_settings, messages, share, steer_clear
from hypothesis import event, given
from hypothesis import strategies as st

from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security.caller import CallerCredentials

SURFACE = "grpc"
pytestmark = pytest.mark.fuzz
SETTINGS = fuzz_settings(share(2))

UNARY = sorted(
    (method.name, method.input_type)
    for method in pb.DESCRIPTOR.services_by_name["Master"].methods
    if not method.client_streaming and not method.server_streaming
)
calls = st.sampled_from(UNARY).flatmap(
    lambda named: st.tuples(st.just(named[0]), messages(named[1]))
)
UNEXPECTED = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)


def altered(draw: st.DrawFn, raw: bytes) -> bytes:
    """``raw`` with a byte flipped, cut, lengthened, or bytes made up instead: what may or
    may not parse as the method's request."""
    how = draw(st.sampled_from(["flipped", "cut", "lengthened", "made up"]))
    event(how)
    if how == "flipped" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    if how == "cut" and raw:
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if how == "lengthened":
        return raw + draw(st.binary(min_size=1, max_size=64))
    return draw(st.binary(max_size=256))


def test_the_fuzzer_reaches_every_unary_method():
    assert {name for name, _ in UNARY} >= {"PutStart", "MountSegment", "Story", "Lane"}


def settle(name: str, outcome: grpc.Future) -> None:
    try:
        outcome.result()
        event(f"{name}: OK")
    except grpc.RpcError as error:
        event(f"{name}: {error.code().name}")
        assert error.code() not in UNEXPECTED, f"{name}: {error.code()} {error.details()}"


@SETTINGS
@given(call=calls)
def test_generated_requests_of_every_unary_method(watch: Watch, call):
    name, request = call
    steer_clear(request, watch.node_ids)
    caller = watch.as_caller_of(name)
    settle(name, getattr(watch.stub, name).future(request, timeout=30, metadata=caller))
    watch.after_case()


@SETTINGS
@given(call=calls, data=st.data())
def test_altered_and_made_up_request_bytes(watch: Watch, call, data):
    name, request = call
    steer_clear(request, watch.node_ids)
    raw = altered(data.draw, request.SerializeToString())
    send = watch.channel.unary_unary(
        f"/kvpool.v1.Master/{name}",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    settle(name, send.future(raw, timeout=30, metadata=watch.as_caller_of(name)))
    watch.after_case()


@SETTINGS
@given(sequence=st.lists(st.tuples(st.integers(0, 2), calls), min_size=2, max_size=8))
def test_random_call_sequences_across_several_connections(watch: Watch, sequence):
    channels = [CallerCredentials.resolve().channel(watch.master, []) for _ in range(3)]
    try:
        stubs = [master_pb2_grpc.MasterStub(channel) for channel in channels]
        pending = []
        for connection, (name, request) in sequence:  # all in flight at once
            steer_clear(request, watch.node_ids)
            call = getattr(stubs[connection], name)
            caller = watch.as_caller_of(name)
            pending.append((name, call.future(request, timeout=30, metadata=caller)))
        for name, outcome in pending:
            settle(name, outcome)
    finally:
        for channel in channels:
            channel.close()
    watch.after_case()
