"""A storage node's token makes it that one node, and nothing more.

The rules, for a real secure cluster with one storage node (``node0``) and a hostile process
holding a genuine node token of its own (node id ``evil``) or a second token of ``node0``:

- a node may not mount, unmount, heartbeat or open a command stream under another node's
  id: PERMISSION_DENIED;
- a node may not mount memory another node registered (the same UCX worker, or the same
  shared-memory mapping, under a new segment id), nor take a segment id another node has
  mounted: FAILED_PRECONDITION, and the cluster's segments and nodes are as they were;
- a second process of an attached node (another incarnation) is refused its command stream,
  over the lane and over gRPC, while the first heartbeats: FAILED_PRECONDITION naming the
  node; the first keeps its stream, and puts (which wait for its answers) keep working;
- a node's answer to a command sent to another node does not count: a put whose node has
  not answered yet stays unanswered, however many answers an impostor sends;
- two real node processes started with the same ``--node-id``: the second's log says the
  node is "already attached", and puts and gets still work;
- the capability keys a node is given sign for its own segments only: what ``evil`` signs
  with them for ``node0``'s segment, ``node0``'s checked stream refuses as forged.

After each refusal, a put and a get of legitimate data still return the exact bytes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from helpers import bearer, ucx_worker_address, wait_until

from kvpool import Client
from kvpool.common import lane_protocol as lp
from kvpool.local_cluster import LocalCluster, ManagedProcess
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security.identity import Role
from kvpool.security.tls import TlsFiles, client_ssl_context
from kvpool.security.tokens import new_token
from kvpool.transport import checked_frames as frames

EVIL = "evil"
EVIL_TOKEN, EVIL_RECORD = new_token(EVIL, Role.NODE, node_id=EVIL)
#: A second, genuine token of node0: what a copy-pasted deployment of node0 would hold.
TWIN_TOKEN, TWIN_RECORD = new_token("node0-twin", Role.NODE, node_id="node0")
#: Larger than the impostor's own segment: no put is ever placed there.
VALUE_SIZE = 64 << 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with LocalCluster(
        1,
        "64MiB",
        run_dir=tmp_path_factory.mktemp("nodes"),
        tokens=[EVIL_RECORD, TWIN_RECORD],
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def stub(cluster) -> Iterator[master_pb2_grpc.MasterStub]:
    assert cluster.pki is not None
    credentials = grpc.ssl_channel_credentials(root_certificates=cluster.pki.ca.read_bytes())
    with grpc.secure_channel(cluster.master_address, credentials) as channel:
        yield master_pb2_grpc.MasterStub(channel)


@pytest.fixture(scope="module")
def client(cluster) -> Iterator[Client]:
    with Client(cluster.master_address, **cluster.client_credentials()) as client:
        yield client


@pytest.fixture(scope="module")
def real_segment(cluster, client, stub) -> pb.Segment:
    """node0's segment as the master describes it to clients (worker, base, rkey, mapping)."""
    client.put("descriptor-probe", b"p" * VALUE_SIZE)
    request = pb.GetReplicasRequest(client_id="probe", keys=["descriptor-probe"])
    answer = stub.GetReplicas(request, metadata=bearer(cluster.tenant_tokens["default"]))
    [segment] = answer.segments
    assert segment.node_id == "node0" and segment.worker_address
    return segment


def cluster_view(stub, cluster) -> tuple[Any, ...]:
    status = stub.ClusterStatus(
        pb.ClusterStatusRequest(), metadata=bearer(cluster.admin_token), timeout=10
    )
    return status.nodes, sorted((s.segment_id, s.node_id) for s in status.segments)


def assert_data_path_sound(cluster, client) -> None:
    """A fresh put and get return the exact bytes; so do the objects put before."""
    key = f"sound-{time.monotonic_ns()}"
    value = os.urandom(VALUE_SIZE)
    assert client.put(key, value) == 1
    assert client.get(key) == value
    assert client.get("descriptor-probe") == b"p" * VALUE_SIZE


def refused(call, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == code, caught.value.details()
    return caught.value.details() or ""


def evil_segment(**fields: Any) -> pb.Segment:
    segment = pb.Segment(
        segment_id="evil/dram",
        node_id=EVIL,
        host="evil.local",
        worker_address=ucx_worker_address(),
        base_address=0x7E00_0000_0000,
        size=4096,
        rkey=b"none",
    )
    for name, value in fields.items():
        setattr(segment, name, value)
    return segment


# ---- the lane's node sessions


@contextlib.contextmanager
def lane(cluster) -> Iterator[ssl.SSLSocket]:
    assert cluster.pki is not None
    context = client_ssl_context(TlsFiles(ca=cluster.pki.ca))
    raw = socket.create_connection(("127.0.0.1", cluster.lane_port), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        yield sock


def open_lane_session(sock, token: str, node_id: str, incarnation: str) -> list[lp.Frame]:
    """Sends AUTH and a node's hello; the frames the master answers within half a second
    (AUTH's acceptance, then a refusal if any)."""
    hello = pb.NodeReport(hello=pb.NodeHello(node_id=node_id, incarnation=incarnation))
    sock.sendall(
        lp.encode(1, lp.AUTH, token.encode())
        + lp.encode(2, lp.NODE_SESSION, hello.SerializeToString())
    )
    decoder = lp.FrameDecoder()
    frames: list[lp.Frame] = []
    sock.settimeout(0.5)
    deadline = time.monotonic() + 0.5
    with contextlib.suppress(TimeoutError):
        while time.monotonic() < deadline and len(frames) < 2:
            data = sock.recv(65536)
            if not data:
                break
            frames += decoder.feed(data)
    sock.settimeout(10)
    return frames


def grpc_session(stub, token: str, node_id: str, incarnation: str) -> grpc.RpcError:
    hello = pb.NodeReport(hello=pb.NodeHello(node_id=node_id, incarnation=incarnation))
    with pytest.raises(grpc.RpcError) as caught:
        for _ in stub.NodeSession(iter([hello]), metadata=bearer(token), timeout=10):
            pass
    return caught.value


# ---- the tests


def test_a_node_may_not_act_for_another_node_id(cluster, stub, client, real_segment):
    before = cluster_view(stub, cluster)
    as_evil = bearer(EVIL_TOKEN)
    for node_id in ("node0", "node1"):
        mount = pb.MountSegmentRequest(segment=evil_segment(node_id=node_id))
        details = refused(
            lambda m=mount: stub.MountSegment(m, metadata=as_evil, timeout=10),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        assert repr(node_id) in details and repr(EVIL) in details, details
    unmount = pb.UnmountSegmentRequest(node_id="node0", segment_id=real_segment.segment_id)
    refused(
        lambda: stub.UnmountSegment(unmount, metadata=as_evil, timeout=10),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    beat = pb.HeartbeatRequest(node_id="node0", segment_ids=[], incarnation="evil")
    refused(
        lambda: stub.Heartbeat(beat, metadata=as_evil, timeout=10),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    error = grpc_session(stub, EVIL_TOKEN, "node0", "evil")
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
    with lane(cluster) as sock:
        frames = open_lane_session(sock, EVIL_TOKEN, "node0", "evil")
    assert [f.status for f in frames] == [lp.OK, lp.PERMISSION_DENIED], frames
    assert cluster_view(stub, cluster) == before
    assert_data_path_sound(cluster, client)


def test_a_node_may_not_mount_memory_another_node_registered(cluster, stub, client, real_segment):
    before = cluster_view(stub, cluster)
    as_evil = bearer(EVIL_TOKEN)
    copies = [evil_segment(worker_address=real_segment.worker_address)]
    copy = pb.Segment()
    copy.CopyFrom(real_segment)
    copy.segment_id, copy.node_id, copy.host = "evil/copy", EVIL, "evil.local"
    copies.append(copy)
    if real_segment.HasField("shared_memory"):  # the same mapping behind another worker
        mapped = pb.Segment()
        mapped.CopyFrom(copy)
        mapped.segment_id, mapped.worker_address = "evil/mapped", ucx_worker_address()
        copies.append(mapped)
    for segment in copies:
        mount = pb.MountSegmentRequest(segment=segment)
        details = refused(
            lambda m=mount: stub.MountSegment(m, metadata=as_evil, timeout=10),
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        assert "node0" in details, details
    assert cluster_view(stub, cluster) == before, "no segment and no node was added"
    assert_data_path_sound(cluster, client)


@pytest.mark.parametrize(
    "segment_id",
    ["mounted", "node0/dram-while-node0-is-away", "evil/../node0/dram"],
)
def test_a_node_may_not_take_a_segment_id_of_another_node(
    cluster, stub, client, real_segment, segment_id
):
    """A segment id is its node's id, "/", and a name without "/" (as nodes make them):
    the master keeps what a segment's next mount must refuse (objects removed while its
    node was away) by segment id, and a mount under it by another node would end that."""
    if segment_id == "mounted":
        segment_id = real_segment.segment_id
    before = cluster_view(stub, cluster)
    mount = pb.MountSegmentRequest(segment=evil_segment(segment_id=segment_id), remount=True)
    details = refused(
        lambda: stub.MountSegment(mount, metadata=bearer(EVIL_TOKEN), timeout=10),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert repr(segment_id) in details and "'evil/NAME'" in details, details
    assert cluster_view(stub, cluster) == before
    assert_data_path_sound(cluster, client)


def test_a_second_process_of_an_attached_node_is_refused_its_command_stream(
    cluster, stub, client, real_segment
):
    with lane(cluster) as sock:
        frames = open_lane_session(sock, TWIN_TOKEN, "node0", "a-second-process")
    assert [f.status for f in frames] == [lp.OK, lp.FAILED_PRECONDITION], frames
    details, _ = frames[1].error()
    assert "'node0'" in details and "already attached" in details, details
    error = grpc_session(stub, TWIN_TOKEN, "node0", "a-second-process")
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "'node0'" in (error.details() or "") and "already attached" in (error.details() or "")
    # node0 kept its stream: puts, which wait for its answers, are answered.
    for _ in range(5):
        assert_data_path_sound(cluster, client)


def test_an_answer_to_a_command_sent_to_another_node_does_not_count(
    cluster, stub, client, real_segment
):
    if not client.mapped_segments:
        pytest.skip("needs the client to write node0's memory while node0 is stopped")
    as_evil = bearer(EVIL_TOKEN)
    stub.MountSegment(pb.MountSegmentRequest(segment=evil_segment()), metadata=as_evil)
    node0 = cluster.nodes[0]
    outcome: dict[str, Any] = {}
    try:
        with lane(cluster) as sock:
            frames = open_lane_session(sock, EVIL_TOKEN, EVIL, "evil-process")
            assert [f.status for f in frames] == [lp.OK], "the impostor has its own stream"
            value = os.urandom(VALUE_SIZE)
            node0.signal(signal.SIGSTOP)  # node0 cannot answer the Persist of the put
            try:
                putter = threading.Thread(
                    target=lambda: outcome.update(put=client.put("answered-by-node0", value))
                )
                putter.start()
                time.sleep(1.0)  # the put's PutEnd waits for node0's answer
                assert putter.is_alive(), f"the put ended without node0: {outcome}"
                answers = b"".join(
                    lp.encode(
                        0,
                        lp.NODE_SESSION,
                        pb.NodeReport(
                            result=pb.CommandResult(command_id=i, ok=False, error="impostor")
                        ).SerializeToString(),
                    )
                    for i in range(1, 1000)  # (every command id of this module so far)
                )
                sock.sendall(answers)
                time.sleep(1.0)
                assert putter.is_alive(), "an impostor's answers decided node0's put"
            finally:
                node0.signal(signal.SIGCONT)
            putter.join(15)
    finally:
        node0.signal(signal.SIGCONT)
        unmount = pb.UnmountSegmentRequest(node_id=EVIL, segment_id="evil/dram")
        stub.UnmountSegment(unmount, metadata=as_evil, timeout=10)
    assert outcome.get("put") == 1, outcome
    assert client.get("answered-by-node0") == value
    assert_data_path_sound(cluster, client)


def test_a_node_s_capability_keys_sign_for_no_other_node(cluster, stub, client, real_segment):
    """A node holds the keys its checked stream verifies with. Were they the masters' own,
    one node (or a stolen node token) could sign itself the right to read and overwrite
    every other node's bytes, of every tenant."""
    from kvpool.security import capabilities as caps

    answer = stub.Heartbeat(
        pb.HeartbeatRequest(node_id=EVIL), metadata=bearer(EVIL_TOKEN), timeout=10
    )
    delivered = [(k.key_id, k.secret) for k in answer.capability_keys.keys]
    assert delivered, "a node gets keys to verify with"
    ring = caps.KeyRing(delivered, current=delivered[-1][0])
    forged = ring.grant(
        segment_id=real_segment.segment_id,
        offset=0,
        length=VALUE_SIZE,
        rights=caps.Rights.READ,
        expiry_ms=int(time.time() * 1000) + 60_000,
        term=answer.capability_keys.term,
        tenant="default",
    )
    host, port = real_segment.checked_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frames.encode_request(frames.Op.READ, 1, forged, 0, VALUE_SIZE))
        header = b""
        while len(header) < frames.REPLY_SIZE:
            chunk = sock.recv(frames.REPLY_SIZE - len(header))
            assert chunk, "node0 closed the stream without an answer"
            header += chunk
    reply = frames.parse_reply(header)
    assert reply.status == frames.Status.FORGED and reply.length == 0
    assert_data_path_sound(cluster, client)


@pytest.fixture(scope="module")
def twinned(tmp_path_factory) -> Iterator[tuple[LocalCluster, ManagedProcess]]:
    """A cluster whose node0 has a twin: a second node process started with its node id
    (and a genuine token of it), as a copy-pasted deployment would start one. The twin is
    not waited for: a master may rightly never let it become ready."""
    with LocalCluster(
        1, "64MiB", run_dir=tmp_path_factory.mktemp("twinned"), tokens=[TWIN_RECORD]
    ) as cluster:
        assert cluster.pki is not None
        argv = [
            sys.executable, "-m", "kvpool.cli.main", "node", "--master", cluster.master_address,
            "--dram", "64MiB", "--listen", "127.0.0.1", "--http-port", "0",
            "--node-id", "node0", "--log-format", "json",
        ]  # fmt: skip
        env = {**cluster.env, "KVPOOL_TOKEN": TWIN_TOKEN, "KVPOOL_TLS_CA": str(cluster.pki.ca)}
        env.pop("KVPOOL_TOKEN_FILE", None)
        twin = ManagedProcess("twin", argv, cluster.run_dir, env)
        try:
            assert wait_until(
                lambda: "already attached" in twin.log_path.read_text(errors="replace"), 20
            ), twin.log_tail()
            yield cluster, twin
        finally:
            twin.stop()


def test_a_second_node_process_with_the_same_node_id_is_told_it_is_already_attached(twinned):
    cluster, twin = twinned
    log = twin.log_path.read_text(errors="replace")
    assert "already attached" in log and "--node-id node0" in log, "says what to do"
    assert cluster.nodes[0].alive()


def test_puts_keep_working_beside_a_second_node_process_with_the_same_node_id(twinned):
    cluster, _ = twinned
    with Client(cluster.master_address, **cluster.client_credentials()) as client:
        values = {f"after-twin-{i}": os.urandom(VALUE_SIZE) for i in range(20)}
        outcomes = client.put_many(list(values.items()))
        assert all(not isinstance(outcome, Exception) for outcome in outcomes), outcomes
        assert client.get_many(list(values)) == list(values.values())


def test_a_replaced_node_process_that_resumes_takes_no_segment_from_its_replacement(tmp_path):
    """node0's process is paused past the node TTL and declared dead; a new process of
    node0 starts and mounts. When the old one resumes, it believes its segments mounted and
    heartbeats at once, listing its own: it must not make the master drop the new process's
    segments (those of "an earlier process"), whose objects would be lost."""
    with LocalCluster(
        1,
        "64MiB",
        run_dir=tmp_path,
        tokens=[TWIN_RECORD],
        master_args=["--node-ttl", "3"],  # (a loaded machine may delay a heartbeat 1.5 s)
    ) as cluster:
        assert cluster.pki is not None
        paused = cluster.nodes[0]
        paused.signal(signal.SIGSTOP)
        try:
            argv = [
                sys.executable, "-m", "kvpool.cli.main", "node", "--master",
                cluster.master_address, "--dram", "64MiB", "--listen", "127.0.0.1",
                "--http-port", "0", "--node-id", "node0", "--log-format", "json",
            ]  # fmt: skip
            env = {**cluster.env, "KVPOOL_TOKEN": TWIN_TOKEN, "KVPOOL_TLS_CA": str(cluster.pki.ca)}
            env.pop("KVPOOL_TOKEN_FILE", None)
            replacement = ManagedProcess("replacement", argv, cluster.run_dir, env)
            with Client(cluster.master_address, **cluster.client_credentials()) as client:
                assert wait_until(lambda: _puts(client, "on-the-replacement"), 30)
                value = client.get("on-the-replacement")
                paused.signal(signal.SIGCONT)
                time.sleep(3.0)  # (its heartbeats: every second)
                assert client.get("on-the-replacement") == value
                log = replacement.log_path.read_text(errors="replace")
                assert "master asks to remount" not in log, "its segment dropped for the old one"
                assert "already attached" in paused.log_path.read_text(errors="replace")
                # (a refusal is logged at the 1st, the 10th and every 60th: a second line
                # would mean it asked again 10 times in 3 s)
                refusals = paused.log_path.read_text(errors="replace").count('"master refused"')
                assert refusals == 1, f"the refused process logged {refusals} refusals in 3 s"
        finally:
            paused.signal(signal.SIGCONT)
            with contextlib.suppress(NameError):
                replacement.stop()


def _puts(client: Client, key: str) -> bool:
    try:
        client.put(key, os.urandom(VALUE_SIZE))
    except Exception:  # (no node mounted yet: the replacement is still coming up)
        return False
    return True
