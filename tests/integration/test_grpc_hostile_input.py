"""A real secure ``kvpool master``'s gRPC port against requests no client of it sends.

- Calls without a token the cluster knows are refused UNAUTHENTICATED before their requests
  are read: large requests from anyone who reaches the port leave the master's memory as it
  was (gRPC would otherwise read each request whole, up to the 256 MiB message limit, before
  the handler that checked the caller ran: four such calls took the master from 66 MiB to
  1.2 GiB).
- A request larger than the largest legal one (GRPC_REQUEST_LIMIT) is refused
  RESOURCE_EXHAUSTED as its length arrives, even from a caller the cluster knows.
- A client id longer than any client makes is refused INVALID_ARGUMENT: the master keeps a
  writer's id with each reservation and in each key's story.
- A request that does not parse as its method's message is refused INVALID_ARGUMENT, naming
  the method, where gRPC answered UNKNOWN with the parser's exception; so is a node's command
  stream whose message does not parse.
- A node's command stream that never says hello ends DEADLINE_EXCEEDED after HELLO_TIMEOUT:
  a node token does not let its holder keep handlers open by saying nothing.
- A node's process id (incarnation) longer than any node makes is refused INVALID_ARGUMENT.
- A segment whose host, remote key, shared-memory description or checked-stream address is
  longer than any node sends is refused INVALID_ARGUMENT: each is sent with every replica
  of the segment in answers to clients (the worker address has its own check).

The master serves on after each.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from helpers import bearer, master_channel, ucx_worker_address

from kvpool import Client
from kvpool.common.limits import GRPC_REQUEST_LIMIT
from kvpool.master.service import HELLO_TIMEOUT
from kvpool.proto import master_pb2 as pb
from kvpool.security.identity import Role
from kvpool.security.tokens import new_token

PUT_START = "/kvpool.v1.Master/PutStart"
CALLS = 6
REQUEST_BYTES = 128 << 20
#: A genuine node token, of a node id no process uses.
NODE_TOKEN, NODE_RECORD = new_token("probe", Role.NODE, node_id="probe")


def peak_resident(pid: int) -> int:
    """The process's peak resident memory so far, in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from kvpool.local_cluster import LocalCluster

    run_dir = tmp_path_factory.mktemp("grpc-hostile")
    with LocalCluster(1, "64MiB", run_dir=run_dir, tokens=[NODE_RECORD]) as cluster:
        with Client(cluster.master_address) as client:
            client.put("seed", b"seed bytes")
        yield cluster


def raw_put_start(cluster):
    """PutStart as bytes: the request is whatever the test sends."""
    channel = master_channel(cluster.master_address)
    return channel, channel.unary_unary(
        PUT_START, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )


def raw_node_session(cluster):
    """A node's command stream as bytes: the messages are whatever the test sends."""
    channel = master_channel(cluster.master_address)
    return channel, channel.stream_stream(
        "/kvpool.v1.Master/NodeSession",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )


@pytest.mark.parametrize(
    "metadata",
    [(), bearer("kvp1.0123456789ab.not-the-secret"), bearer("")],
    ids=["no token", "an unknown token", "an empty token"],
)
def test_large_requests_without_credentials_are_refused_unread(cluster, metadata):
    before = peak_resident(cluster.master.pid)
    channel, put_start = raw_put_start(cluster)
    # (a request that parses: only who sends it is wrong)
    body = pb.PutStartRequest(client_id="c" * REQUEST_BYTES).SerializeToString()
    errors: list[grpc.RpcError] = []

    def call() -> None:
        try:
            put_start(body, timeout=30, metadata=metadata)
        except grpc.RpcError as error:
            errors.append(error)

    threads = [threading.Thread(target=call) for _ in range(CALLS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    channel.close()

    assert len(errors) == CALLS, "every call ends with an error"
    assert {e.code() for e in errors} == {grpc.StatusCode.UNAUTHENTICATED}
    grown = peak_resident(cluster.master.pid) - before
    assert grown < 64 << 20, f"the master grew by {grown >> 20} MiB: the requests were read"
    with Client(cluster.master_address) as client:
        assert client.get("seed") == b"seed bytes", "still serving"


def test_a_request_past_the_largest_legal_one_is_refused_even_from_a_known_caller(cluster):
    """The master reads requests up to GRPC_REQUEST_LIMIT (the largest legal call, a mount
    report's part, fits): a larger one is refused as its length arrives, not held."""
    before = peak_resident(cluster.master.pid)
    channel, put_start = raw_put_start(cluster)
    with pytest.raises(grpc.RpcError) as refused:
        put_start(bytes(GRPC_REQUEST_LIMIT + 1), timeout=30, metadata=bearer())
    channel.close()

    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    grown = peak_resident(cluster.master.pid) - before
    assert grown < 64 << 20, f"the master grew by {grown >> 20} MiB"
    with Client(cluster.master_address) as client:
        assert client.get("seed") == b"seed bytes", "still serving"


@pytest.mark.parametrize("method", ["PutStart", "ClientHeartbeat", "GetReplicas"])
def test_a_client_id_longer_than_any_client_makes_is_refused(cluster, method):
    """The master keeps a writer's client id with its reservations and in its keys' stories:
    one of any length would let a caller make it hold that much per object."""
    channel = master_channel(cluster.master_address)
    request = getattr(pb, f"{method}Request")(client_id="c" * 129)
    if method != "ClientHeartbeat":
        request.keys.append("k")
    if method == "PutStart":
        request.sizes.append(1)
    call = channel.unary_unary(
        f"/kvpool.v1.Master/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.RpcError) as refused:
        call(request, timeout=10, metadata=bearer())
    channel.close()

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        "a client id holds at most 128 characters, got 129: leave client_id to kvpool's "
        "Client, which makes one"
    )


def test_a_request_that_does_not_parse_is_refused_invalid_argument(cluster):
    channel, put_start = raw_put_start(cluster)
    with pytest.raises(grpc.RpcError) as refused:
        put_start(b"\xff\xff\xff\xff", timeout=10, metadata=bearer())
    channel.close()

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details()
    assert details.startswith("PutStart: the request does not parse (DecodeError")
    assert "kvpool.v1.PutStartRequest" in details
    assert "proto/master.proto" in details
    with Client(cluster.master_address) as client:
        assert client.exists_many(["seed"]) == [True], "still serving"


def test_a_command_stream_whose_message_does_not_parse_ends_invalid_argument(cluster):
    channel, session = raw_node_session(cluster)
    with pytest.raises(grpc.RpcError) as refused:
        list(session(iter([b"\xff\xff\xff"]), timeout=10, metadata=bearer(NODE_TOKEN)))
    channel.close()

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details()
    assert details.startswith("NodeSession: the request does not parse (DecodeError")
    assert "kvpool.v1.NodeReport" in details
    with Client(cluster.master_address) as client:
        assert client.get("seed") == b"seed bytes", "still serving"


def test_a_command_stream_that_never_says_hello_is_ended(cluster):
    channel, session = raw_node_session(cluster)
    silence = threading.Event()

    def nothing():  # a request stream that sends nothing until the test ends
        silence.wait(HELLO_TIMEOUT * 3)
        yield from ()

    try:
        with pytest.raises(grpc.RpcError) as ended:
            list(session(nothing(), timeout=HELLO_TIMEOUT * 3, metadata=bearer(NODE_TOKEN)))
    finally:
        silence.set()
        channel.close()

    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert ended.value.details().startswith(f"no hello within {HELLO_TIMEOUT:g} s")
    with Client(cluster.master_address) as client:
        assert client.get("seed") == b"seed bytes", "still serving"


@pytest.mark.parametrize(
    "field",
    [
        {"host": "h" * 256},
        {"rkey": b"r" * (64 << 10 | 1)},
        {"checked_address": "c" * 301},
        {"shared_memory": pb.SharedMemory(socket="s" * 5000)},
    ],
    ids=["host", "rkey", "checked_address", "shared_memory"],
)
def test_a_segment_field_longer_than_any_node_sends_is_refused(cluster, field):
    from kvpool.proto import master_pb2_grpc

    channel = master_channel(cluster.master_address)
    stub = master_pb2_grpc.MasterStub(channel)
    fields = {
        "segment_id": "probe/dram0",
        "node_id": "probe",
        "host": "probe",
        "worker_address": ucx_worker_address(),
        "size": 1 << 20,
        **field,
    }
    segment = pb.Segment(**fields)
    with pytest.raises(grpc.RpcError) as refused:
        stub.MountSegment(
            pb.MountSegmentRequest(segment=segment), metadata=bearer(NODE_TOKEN), timeout=10
        )
    channel.close()

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    name = next(iter(field))
    assert f"segment.{name} holds at most" in refused.value.details()


def test_a_heartbeat_with_an_incarnation_longer_than_any_node_makes_is_refused(cluster):
    from kvpool.master.node_processes import MAX_INCARNATION
    from kvpool.proto import master_pb2_grpc

    channel = master_channel(cluster.master_address)
    stub = master_pb2_grpc.MasterStub(channel)
    request = pb.HeartbeatRequest(node_id="probe", incarnation="i" * (MAX_INCARNATION + 1))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Heartbeat(request, metadata=bearer(NODE_TOKEN), timeout=10)
    channel.close()

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "incarnation holds at most" in refused.value.details()
