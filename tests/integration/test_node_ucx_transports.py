"""A node that serves the checked stream offers its UCX worker over shared memory only, and
serves no peer's one-sided operations on it.

UCX over TCP lets any peer that reaches a worker read and write its registered memory
unchecked (docs/security.md), and so does UCX over shared memory where it runs a peer's
operations in software. Every transfer, other nodes' copies included, goes over the checked
stream (clients on the node's host: the stream, or a mapping the node hands over), so a node
does not offer UCX over TCP unless told to (``--ucx-tcp``): a peer elsewhere cannot even make
an endpoint to it, and a peer on its host that makes one over shared memory reaches nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import bearer, master_channel

from kvpool import Client
from kvpool.errors import TransferError
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security.dev_pki import make_dev_pki
from kvpool.security.identity import Role
from kvpool.security.tokens import new_token
from kvpool.transport import ucp


def node_worker_address(cluster) -> bytes:
    """The worker address the master hands clients for node0's segment."""
    with Client(cluster.master_address, timeout=10) as client:
        client.put("probe", b"p" * 4096)
    return located(cluster, "probe")[0].worker_address


def located(cluster, key: str) -> tuple[pb.Segment, int]:
    """The segment descriptor and replica address the master hands a client for ``key``."""
    with master_channel(cluster.master_address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        request = pb.GetReplicasRequest(client_id="probe", keys=[key])
        answer = stub.GetReplicas(
            request, metadata=bearer(cluster.tenant_tokens["default"]), timeout=10
        )
    [segment] = answer.segments
    [location] = answer.objects
    return segment, location.replicas[0].address


def connects_over_tcp(worker_address: bytes) -> int:
    """The status of making an endpoint to it from a worker that has TCP only."""
    context = ucp.Context({"TLS": "tcp"})
    worker = ucp.Worker(context)
    try:
        endpoint = worker.connect(worker_address)
    except ucp.UcxError as error:
        return error.status
    else:
        endpoint.close(timeout=0.5)
        return ucp.UCS_OK
    finally:
        worker.close()
        context.close()


def test_no_peer_reaches_a_checked_nodes_worker_over_tcp(cluster_factory):
    cluster = cluster_factory(1, "64MiB")
    assert connects_over_tcp(node_worker_address(cluster)) == ucp.UCS_ERR_UNREACHABLE


def test_ucx_tcp_is_the_operators_choice(cluster_factory):
    cluster = cluster_factory(1, "64MiB", node_args=("--ucx-tcp",))
    assert connects_over_tcp(node_worker_address(cluster)) == ucp.UCS_OK


def test_a_ucx_tls_that_would_open_tcp_stops_the_node_unless_ucx_tcp_is_given(tmp_path):
    """A tuning variable (a chart's example said UCX_TLS=tcp,sm,self) once quietly opened
    the unchecked path on a secure node: the node now says so and does not start."""
    pki = make_dev_pki(tmp_path / "pki")
    token, _ = new_token("node0", Role.NODE, node_id="node0")
    env = {**os.environ, "UCX_TLS": "tcp,sm,self", "KVPOOL_TOKEN": token}
    started = subprocess.run(
        [sys.executable, "-m", "kvpool.cli.main", "node", "--master", "127.0.0.1:1",
         "--tls-ca", str(pki.ca), "--node-id", "node0", "--dram", "16MiB",
         "--listen", "127.0.0.1", "--http-port", "0"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert started.returncode == 2, started.stderr
    assert "UCX_TLS='tcp,sm,self'" in started.stderr, started.stderr
    assert "--ucx-tcp" in started.stderr and "Traceback" not in started.stderr


def test_a_client_that_opts_out_of_the_checked_stream_is_told_what_to_do(
    cluster_factory, monkeypatch
):
    cluster = cluster_factory(1, "64MiB")
    with Client(cluster.master_address, timeout=10) as client:
        value = os.urandom(64 << 10)
        client.put("kept", value)
        assert client.get("kept") == value  # (clients on its host: shared memory)
    monkeypatch.setenv("KVPOOL_CHECKED_STREAM", "0")
    options = {"ucx_config": {"TLS": "tcp"}, "same_host_mapping": False}
    with (
        Client(cluster.master_address, timeout=10, **options) as opted_out,
        pytest.raises(TransferError, match="--ucx-tcp"),
    ):
        opted_out.get("kept")


def test_a_peer_on_the_nodes_host_reaches_none_of_its_memory_over_shared_memory(
    cluster_factory,
):
    """Without CMA (the node is not dumpable), UCX over shared memory runs a peer's one-sided
    operations in software on the node's own worker, at whatever address the peer names,
    with a key the peer packs itself: any process on the host that reached the worker read
    and wrote every tenant's objects. The node's UCX now serves no peer's RMA (and hands out
    no remote key): the peer's get and put end unserved, the object unchanged."""
    cluster = cluster_factory(1, "64MiB")
    secret = os.urandom(4096)
    with Client(cluster.master_address, timeout=10) as client:
        client.put("secret", secret)
    segment, address = located(cluster, "secret")
    assert segment.rkey == b""
    mine = bytearray(4096)
    assert one_sided_over_shared_memory(segment, address, mine, is_get=True) != ucp.UCS_OK
    assert bytes(mine) != secret
    mine[:] = b"w" * len(mine)
    assert one_sided_over_shared_memory(segment, address, mine, is_get=False) != ucp.UCS_OK
    with Client(cluster.master_address, timeout=10) as client:
        assert client.get("secret") == secret


def one_sided_over_shared_memory(
    segment: pb.Segment, address: int, mine: bytearray, *, is_get: bool
) -> int:
    """A get into (or put from) ``mine`` at ``address`` of the node, over UCX's shared memory
    without CMA, with a remote key packed here; its status."""
    context = ucp.Context({"TLS": "sysv,self"})
    worker = ucp.Worker(context)
    try:
        endpoint = worker.connect(segment.worker_address)
        assert not endpoint.uses_transport("cma")
        region = context.register(mine)
        forged = endpoint.unpack_rkey(region.rkey)  # (names no memory of the node)
        local = ucp.address_of(mine, writable=True)[0]
        op = ucp.Op(endpoint, forged, local, address, len(mine), region.memh)
        [status] = worker.transfer([op], is_get=is_get, timeout=1.0, grace=0.5)
        return status
    finally:
        if not worker.tainted:  # (a tainted worker is never touched again)
            worker.close()
