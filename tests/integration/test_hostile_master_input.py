"""A running master keeps serving whatever a broken or hostile peer sends it (issue 18).

Each case was found against a running master from one connection: a mount reporting an
object of generation 2**64-1 made every later PutStart fail until a restart; adopted objects
with empty or 5000-byte keys were taken; an unknown pin or tier answered INTERNAL with a
traceback; a lookup of a 10 MiB key was served. Now each is refused precisely (or the bad
report dropped), and legitimate puts keep working.
"""

from __future__ import annotations

import grpc
import pytest
from helpers import bearer, master_channel, ucx_worker_address

from kvpool import Client
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security.identity import Role
from kvpool.security.tokens import new_token

BASE = 0x7F00_0000_0000


def mount(
    stub,
    segment_id: str,
    objects: list[pb.StoredObject],
    tier: int = 1,
    worker_address: bytes | None = None,
    base_address: int = BASE,
):
    segment = pb.Segment(
        segment_id=segment_id,
        node_id="intruder",
        host="intruder.local",
        worker_address=ucx_worker_address() if worker_address is None else worker_address,
        base_address=base_address,
        size=1 << 20,
        rkey=b"none",
        tier=tier,
    )
    return stub.MountSegment(
        pb.MountSegmentRequest(segment=segment, objects=objects, remount=True),
        timeout=10,
        metadata=bearer(INTRUDER_TOKEN),
    )


#: A node token for node id "intruder": what a broken node, or one taken over, holds.
INTRUDER_TOKEN, INTRUDER = new_token("intruder", Role.NODE, node_id="intruder")


@pytest.fixture
def master(cluster_factory):
    cluster = cluster_factory(1, "64MiB", tokens=[INTRUDER])
    with master_channel(cluster.master_address) as channel:
        yield cluster, master_pb2_grpc.MasterStub(channel)


def test_reported_objects_are_checked_before_they_are_adopted(master):
    cluster, stub = master
    reported = [
        pb.StoredObject(key="far-future", offset=0, size=64, generation=2**64 - 1),
        pb.StoredObject(key="", offset=4096, size=64, generation=5),
        pb.StoredObject(key="k" * 5000, offset=8192, size=64, generation=6),
        pb.StoredObject(key="outside", offset=(1 << 20) - 64, size=4096, generation=7),
    ]
    answer = mount(stub, "intruder/seg", reported)
    assert sorted(answer.dropped_keys) == sorted(o.key for o in reported)

    with Client(cluster.master_address) as client:  # puts still work
        for i in range(20):
            client.put(f"after-{i}", b"v" * 100)
            assert client.get(f"after-{i}") == b"v" * 100


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (pb.PutStartRequest(client_id="c", keys=["k"], sizes=[10], pin=7), "pin must be one of"),
        (pb.PutStartRequest(client_id="c", keys=["k"], sizes=[10], tier=9), "tier must be one of"),
        (pb.PutStartRequest(client_id="c", keys=["k"], sizes=[1 << 60]), "at most"),
        (pb.GetReplicasRequest(client_id="c", keys=["x" * (1 << 20)]), "characters"),
        (
            pb.GetReplicasRequest(client_id="c", keys=["k"], mapped_segments=["s"] * 1025),
            "mapped_segments names at most 1024",
        ),
        (
            pb.PutStartRequest(client_id="c", keys=["k"], sizes=[10], mapped_segments=["s" * 5000]),
            "mapped_segments names at most",
        ),
    ],
)
def test_out_of_range_fields_are_refused_as_invalid_arguments(master, request_, expected):
    _, stub = master
    method = getattr(stub, type(request_).__name__.removesuffix("Request"))
    with pytest.raises(grpc.RpcError) as error:
        method(request_, timeout=10, metadata=bearer())
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in (error.value.details() or "")
    assert len(error.value.details() or "") < 500, "the key is not echoed in full"


def test_a_mount_of_an_unknown_tier_is_refused(master):
    _, stub = master
    with pytest.raises(grpc.RpcError) as error:
        mount(stub, "intruder/odd", [], tier=9)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "segment.tier must be one of" in (error.value.details() or "")


def test_a_mount_with_bytes_ucx_could_not_read_as_a_worker_address_is_refused(master):
    """Nodes and clients hand a segment's worker address to ucp_ep_create, which reads past
    short ones and aborts on unknown versions: the master passes on only UCX's shape."""
    cluster, stub = master
    real = ucx_worker_address()
    for garbage in (b"not-a-worker", real[:-1], real + b"\0", bytes([0x27]) + real[1:]):
        with pytest.raises(grpc.RpcError) as error:
            mount(stub, "intruder/garbled", [], worker_address=garbage)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "segment.worker_address" in (error.value.details() or "")
    with Client(cluster.master_address) as client:
        assert not [s for s in client.cluster_status().segments if s.node_id == "intruder"]


def test_a_mount_whose_addresses_pass_2_to_the_64_is_refused(master):
    """Every replica's address is its segment's base plus its offset, answered in uint64
    fields: a base this close to 2**64 made a later Stat or GetReplicas of an adopted object
    fail with UNKNOWN (found by tests/fuzz/test_fuzz_node_reports.py)."""
    cluster, stub = master
    with pytest.raises(grpc.RpcError) as error:
        mount(
            stub,
            "intruder/top",
            [pb.StoredObject(key="top", offset=4096, size=64, generation=5)],
            base_address=2**64 - 8192,
        )
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "passes 2**64" in (error.value.details() or "")
    edge = [pb.StoredObject(key="edge", offset=(1 << 20) - 64, size=64, generation=6)]
    answer = mount(stub, "intruder/edge", edge, base_address=2**64 - (1 << 20))
    assert not answer.dropped_keys  # (its last byte at 2**64 - 1: the wire still carries it)
    with Client(cluster.master_address) as client:
        assert client.put("after", b"v") and client.get("after") == b"v"
