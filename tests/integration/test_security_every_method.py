"""Every method of a secure master, over both of its doors, checks who calls before it acts.

The rules, for a real ``kvpool master`` with credentials and TLS:

- every gRPC method and every metadata-lane method (the lane's calls and its node command
  stream), called without credentials, with a malformed token, with a well-formed token the
  cluster does not know, or with a known token id and a wrong secret, is refused
  UNAUTHENTICATED, and the refusal never repeats the token;
- called with a genuine token of a role the method is not for (``master.access.ALLOWED``),
  it is refused PERMISSION_DENIED;
- after each refusal nothing changed: the objects, reservations, segments and keys an admin
  sees are what they were;
- ``ALLOWED`` has a rule for exactly the service's methods.

The methods are read from the service's protobuf descriptor and the lane's method table, so
a new method is tested (with an empty request) the day it is added, and a new method without
a rule in ``ALLOWED`` fails ``test_every_method_of_the_service_has_an_access_rule``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from helpers import bearer, ucx_worker_address

from kvpool import Client
from kvpool.common import lane_protocol as lp
from kvpool.common.status import KeyStatus
from kvpool.local_cluster import LocalCluster
from kvpool.master.access import ALLOWED
from kvpool.master.handlers import UNARY_METHODS
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security.identity import Role
from kvpool.security.tls import TlsFiles, client_ssl_context
from kvpool.security.tokens import new_token

SERVICE = pb.DESCRIPTOR.services_by_name["Master"]
METHODS = [method.name for method in SERVICE.methods]
STREAMING = {m.name for m in SERVICE.methods if m.client_streaming or m.server_streaming}
#: The lane's methods by name, and their wire numbers (the node command stream included).
LANE_IDS = {**lp.METHOD_IDS, "NodeSession": lp.NODE_SESSION}
SEEDS = [f"seed-{i}" for i in range(4)]
PROBE_NODE = "probe"

#: Tokens that prove nobody: (what they are, the token).
MALFORMED = [
    ("not a kvpool token", "not-a-token"),
    ("a token cut short", "kvp1.0123456789ab.short"),
    ("a token of four parts", "kvp1.0123456789ab.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.x"),
]
UNKNOWN = new_token("stranger", Role.ADMIN)[0]
#: A genuine node token, of a node id no process uses.
PROBE_TOKEN, PROBE_RECORD = new_token(PROBE_NODE, Role.NODE, node_id=PROBE_NODE)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with LocalCluster(
        1, "64MiB", run_dir=tmp_path_factory.mktemp("every-method"), tokens=[PROBE_RECORD]
    ) as cluster:
        with Client(cluster.master_address, **cluster.client_credentials()) as client:
            for key in SEEDS:
                client.put(key, key.encode() * 100)
        yield cluster


@pytest.fixture(scope="module")
def tokens(cluster) -> dict[Role, str]:
    """A genuine token of each role."""
    return {
        Role.ADMIN: cluster.admin_token,
        Role.CLIENT: cluster.tenant_tokens["default"],
        Role.NODE: PROBE_TOKEN,
    }


@pytest.fixture(scope="module")
def channel(cluster) -> Iterator[grpc.Channel]:
    assert cluster.pki is not None
    credentials = grpc.ssl_channel_credentials(root_certificates=cluster.pki.ca.read_bytes())
    with grpc.secure_channel(cluster.master_address, credentials) as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel) -> master_pb2_grpc.MasterStub:
    return master_pb2_grpc.MasterStub(channel)


@pytest.fixture(scope="module")
def segment_id(stub, cluster) -> str:
    status = stub.ClusterStatus(pb.ClusterStatusRequest(), metadata=bearer(cluster.admin_token))
    return status.segments[0].segment_id


def snapshot(stub, cluster) -> tuple[Any, ...]:
    """What an admin sees of the cluster's contents (not its clocks)."""
    admin = bearer(cluster.admin_token)
    status = stub.ClusterStatus(pb.ClusterStatusRequest(), metadata=admin, timeout=10)
    listed = stub.ListKeys(pb.ListKeysRequest(), metadata=admin, timeout=10)
    segments = sorted((s.segment_id, s.node_id, s.used, s.objects) for s in status.segments)
    return (
        status.objects,
        status.reservations,
        status.nodes,
        segments,
        list(zip(listed.keys, listed.sizes, strict=True)),
    )


def request_for(method: str, segment_id: str) -> Any:
    """A request that would change or reveal something, were it let through; an empty one
    for a method this table does not know yet."""
    internal = [f"default/{key}" for key in SEEDS]
    keys = [*SEEDS, *internal]
    intruder = pb.Segment(
        segment_id="intruder/seg",
        node_id=PROBE_NODE,
        host="intruder.local",
        worker_address=ucx_worker_address(),
        base_address=0x7F00_0000_0000,
        size=1 << 20,
        rkey=b"none",
    )
    known = {
        "MountSegment": pb.MountSegmentRequest(segment=intruder),
        "UnmountSegment": pb.UnmountSegmentRequest(node_id="node0", segment_id=segment_id),
        "Heartbeat": pb.HeartbeatRequest(node_id="node0", segment_ids=[segment_id]),
        "NodeSession": pb.NodeReport(hello=pb.NodeHello(node_id="node0", incarnation="x")),
        "PutStart": pb.PutStartRequest(client_id="c", keys=["intruder-key"], sizes=[64]),
        "PutEnd": pb.PutEndRequest(
            commits=[pb.PutCommit(key=key, put_id=1, replica_ok=[True]) for key in keys]
        ),
        "PutRevoke": pb.PutRevokeRequest(keys=keys, put_ids=[1] * len(keys)),
        "GetReplicas": pb.GetReplicasRequest(client_id="c", keys=keys, lease_ms=60_000),
        "Exists": pb.ExistsRequest(client_id="c", keys=keys, lease_ms=60_000),
        "ReleaseLeases": pb.ReleaseLeasesRequest(client_id="c", keys=keys),
        "Remove": pb.RemoveRequest(keys=keys, force=True),
        "RemovePrefix": pb.RemovePrefixRequest(prefix="", force=True),
        "Stat": pb.StatRequest(key=SEEDS[0]),
        "ClientHeartbeat": pb.ClientHeartbeatRequest(client_id="c"),
        "ListKeys": pb.ListKeysRequest(),
        "ClusterStatus": pb.ClusterStatusRequest(),
        "Lane": pb.LaneRequest(),
        "Story": pb.StoryRequest(key=SEEDS[0]),
    }
    if method in known:
        return known[method]
    return getattr(pb, SERVICE.methods_by_name[method].input_type.name)()


# ---- gRPC


def call_grpc(stub, method: str, request: Any, metadata: Any) -> grpc.RpcError:
    """Calls ``method``; the error it was refused with (failing the test if it was not)."""
    with pytest.raises(grpc.RpcError) as caught:
        if method in STREAMING:
            for _ in getattr(stub, method)(iter([request]), metadata=metadata, timeout=10):
                pass
        else:
            getattr(stub, method)(request, metadata=metadata, timeout=10)
    return caught.value


def refused_grpc(stub, cluster, segment_id, method, metadata, code, token=""):
    before = snapshot(stub, cluster)
    error = call_grpc(stub, method, request_for(method, segment_id), metadata)
    assert error.code() == code, f"{method}: {error.code()} {error.details()}"
    assert error.details(), "a refusal says what is missing"
    if token:
        assert token not in error.details(), "a refusal never repeats the token"
    assert snapshot(stub, cluster) == before, f"{method} changed something when refused"


def test_every_method_of_the_service_has_an_access_rule():
    assert set(ALLOWED) == set(METHODS)
    assert {*UNARY_METHODS, *STREAMING} == set(METHODS), "every method has a handler"
    for name, _, _ in lp.LANE_METHODS.values():
        assert name in ALLOWED


@pytest.mark.parametrize("method", METHODS)
def test_a_grpc_call_without_credentials_is_unauthenticated(stub, cluster, segment_id, method):
    refused_grpc(stub, cluster, segment_id, method, (), grpc.StatusCode.UNAUTHENTICATED)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("what", "token"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_grpc_call_with_a_malformed_token_is_unauthenticated(
    stub, cluster, segment_id, method, what, token
):
    refused_grpc(
        stub, cluster, segment_id, method, bearer(token), grpc.StatusCode.UNAUTHENTICATED, token
    )


@pytest.mark.parametrize("method", METHODS)
def test_a_grpc_call_with_a_token_the_cluster_does_not_know_is_unauthenticated(
    stub, cluster, segment_id, method
):
    refused_grpc(
        stub, cluster, segment_id, method, bearer(UNKNOWN), grpc.StatusCode.UNAUTHENTICATED, UNKNOWN
    )


@pytest.mark.parametrize("method", METHODS)
def test_a_grpc_call_with_a_known_token_id_and_a_wrong_secret_is_unauthenticated(
    stub, cluster, segment_id, method
):
    prefix, token_id, secret = cluster.admin_token.split(".")
    forged = f"{prefix}.{token_id}.{secret[::-1]}"
    refused_grpc(
        stub, cluster, segment_id, method, bearer(forged), grpc.StatusCode.UNAUTHENTICATED, forged
    )


WRONG_ROLES = [
    (method, role) for method in METHODS for role in Role if role not in ALLOWED.get(method, ())
]


@pytest.mark.parametrize(("method", "role"), WRONG_ROLES)
def test_a_grpc_call_by_a_role_it_is_not_for_is_permission_denied(
    stub, cluster, segment_id, tokens, method, role
):
    refused_grpc(
        stub, cluster, segment_id, method, bearer(tokens[role]), grpc.StatusCode.PERMISSION_DENIED
    )


# ---- the metadata lane


@contextlib.contextmanager
def lane(cluster) -> Iterator[socket.socket]:
    assert cluster.pki is not None
    context = client_ssl_context(TlsFiles(ca=cluster.pki.ca))
    raw = socket.create_connection(("127.0.0.1", cluster.lane_port), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        yield sock


def answers(sock: socket.socket, count: int) -> list[lp.Frame]:
    """Up to ``count`` frames the master sends (fewer when it closes the connection)."""
    decoder = lp.FrameDecoder()
    frames: list[lp.Frame] = []
    while len(frames) < count:
        data = sock.recv(65536)
        if not data:
            break
        frames += decoder.feed(data)
    return frames


def closed(sock: socket.socket) -> bool:
    """Whether the master closed the connection (within a few seconds)."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        return True


def lane_call(cluster, auth: bytes | None, method: str, request: Any) -> lp.Frame:
    """Opens a lane connection, sends ``auth`` (None: no AUTH frame) and one call of
    ``method``; the first refusal among the answers, else the call's answer."""
    with lane(cluster) as sock:
        sent = [lp.encode(7, LANE_IDS[method], request.SerializeToString())]
        if auth is not None:
            sent.insert(0, lp.encode(1, lp.AUTH, auth))
        sock.sendall(b"".join(sent))
        frames = answers(sock, len(sent))
        assert frames, f"{method}: no answer"
        refusals = [frame for frame in frames if frame.status != lp.OK]
        if refusals and refusals[0].status == lp.UNAUTHENTICATED:
            assert closed(sock), "an unauthenticated connection is closed"
    return refusals[0] if refusals else frames[-1]


LANE_NAMES = list(LANE_IDS)


def refused_on_lane(stub, cluster, segment_id, method, auth, status, token=""):
    before = snapshot(stub, cluster)
    frame = lane_call(cluster, auth, method, request_for(method, segment_id))
    details, _ = frame.error()
    assert frame.status == status, f"{method}: status {frame.status}: {details}"
    assert details
    if token:
        assert token not in details, "a refusal never repeats the token"
    assert snapshot(stub, cluster) == before, f"{method} changed something when refused"


def test_the_lane_tests_cover_every_lane_method():
    assert {name for name, _, _ in lp.LANE_METHODS.values()} | {"NodeSession"} == set(LANE_NAMES)


@pytest.mark.parametrize("method", LANE_NAMES)
def test_a_lane_call_without_an_auth_frame_is_unauthenticated(stub, cluster, segment_id, method):
    refused_on_lane(stub, cluster, segment_id, method, None, lp.UNAUTHENTICATED)


@pytest.mark.parametrize("method", LANE_NAMES)
def test_a_lane_call_after_an_empty_auth_frame_is_unauthenticated(
    stub, cluster, segment_id, method
):
    refused_on_lane(stub, cluster, segment_id, method, b"", lp.UNAUTHENTICATED)


@pytest.mark.parametrize("method", LANE_NAMES)
@pytest.mark.parametrize(("what", "token"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_lane_call_after_a_malformed_token_is_unauthenticated(
    stub, cluster, segment_id, method, what, token
):
    refused_on_lane(stub, cluster, segment_id, method, token.encode(), lp.UNAUTHENTICATED, token)


@pytest.mark.parametrize("method", LANE_NAMES)
def test_a_lane_call_after_a_token_the_cluster_does_not_know_is_unauthenticated(
    stub, cluster, segment_id, method
):
    refused_on_lane(
        stub, cluster, segment_id, method, UNKNOWN.encode(), lp.UNAUTHENTICATED, UNKNOWN
    )


@pytest.mark.parametrize("method", LANE_NAMES)
def test_a_lane_call_after_a_known_token_id_with_a_wrong_secret_is_unauthenticated(
    stub, cluster, segment_id, method
):
    prefix, token_id, secret = cluster.admin_token.split(".")
    forged = f"{prefix}.{token_id}.{secret[::-1]}"
    refused_on_lane(stub, cluster, segment_id, method, forged.encode(), lp.UNAUTHENTICATED, forged)


LANE_WRONG_ROLES = [
    (method, role) for method in LANE_NAMES for role in Role if role not in ALLOWED[method]
]


@pytest.mark.parametrize(("method", "role"), LANE_WRONG_ROLES)
def test_a_lane_call_by_a_role_it_is_not_for_is_permission_denied(
    stub, cluster, segment_id, tokens, method, role
):
    refused_on_lane(stub, cluster, segment_id, method, tokens[role].encode(), lp.PERMISSION_DENIED)


def test_the_seeded_objects_are_all_still_there_and_whole(cluster):
    with Client(cluster.master_address, **cluster.client_credentials()) as client:
        assert client.get_many(SEEDS) == [key.encode() * 100 for key in SEEDS]


def test_the_same_doors_answer_a_caller_with_the_right_credentials(stub, cluster, tokens):
    """(The refusals above are the master's, not a broken harness's.)"""
    status = stub.ClusterStatus(
        pb.ClusterStatusRequest(), metadata=bearer(tokens[Role.ADMIN]), timeout=10
    )
    assert status.objects == len(SEEDS)
    request = pb.ExistsRequest(client_id="c", keys=SEEDS, no_lease=True)
    frame = lane_call(cluster, tokens[Role.CLIENT].encode(), "Exists", request)
    assert frame.status == lp.OK and frame.method == lp.METHOD_IDS["Exists"]
    statuses = pb.ExistsResponse.FromString(frame.body).statuses
    assert list(statuses) == [KeyStatus.OK] * len(SEEDS)
