"""A node that serves the checked stream offers its UCX worker over shared memory only.

UCX over TCP lets any peer that reaches a worker read and write its registered memory
unchecked (docs/security.md). Every transfer from another host, other nodes' copies
included, goes over the checked stream, so a node does not offer UCX over TCP unless told
to (``--ucx-tcp``): a peer elsewhere cannot even make an endpoint to it. Clients on its host
still use shared memory and CMA.
"""

from __future__ import annotations

import os

import pytest
from helpers import bearer, master_channel

from kvpool import Client
from kvpool.errors import TransferError
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.transport import ucp


def node_worker_address(cluster) -> bytes:
    """The worker address the master hands clients for node0's segment."""
    with Client(cluster.master_address, timeout=10) as client:
        client.put("probe", b"p" * 4096)
    with master_channel(cluster.master_address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        request = pb.GetReplicasRequest(client_id="probe", keys=["probe"])
        answer = stub.GetReplicas(
            request, metadata=bearer(cluster.tenant_tokens["default"]), timeout=10
        )
    [segment] = answer.segments
    return segment.worker_address


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
