"""Right after a lone master restarts, clients are told it is rebuilding, not that their
objects are gone or that there is no space.

A lone master keeps its index in memory: after a restart it learns what exists from the
storage nodes, which remount within a couple of seconds. Until they have, it knows no object
and no segment; answering NOT_FOUND ("never put, was removed, or lost its last replica") or
NO_SPACE ("no storage node has mounted a segment yet") would be false. It answers UNAVAILABLE
(rebuilding), which clients retry within their deadline: a get issued at once returns the
bytes, a put issued at once is stored.
"""

from __future__ import annotations

import os

import grpc
from helpers import bearer, master_channel

from kvpool import Client
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc


def test_gets_and_puts_right_after_a_restart_wait_for_the_rebuild_and_succeed(cluster_factory):
    cluster = cluster_factory(2, "64MiB")
    value = os.urandom(200_000)
    with Client(cluster.master_address) as client:
        client.put("before", value)
    cluster.master.kill()
    cluster.start_master()  # same port, empty memory

    with master_channel(cluster.master_address) as channel:  # what a client hears first
        stub = master_pb2_grpc.MasterStub(channel)
        try:
            answer = stub.GetReplicas(
                pb.GetReplicasRequest(keys=["before"]), timeout=5, metadata=bearer()
            )
            statuses = [o.status for o in answer.objects]
            assert statuses == [pb.KeyStatus.OK], "answered only once the nodes were back"
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert "rebuilding" in (error.details() or "")

    with Client(cluster.master_address) as client:  # retries until the rebuild is over
        assert client.get("before") == value
        client.put("after", b"2")
        assert client.get("after") == b"2"


def test_a_fresh_cluster_takes_clients_as_soon_as_a_node_has_mounted(cluster_factory):
    """Nodes that mount for the first time bring nothing to rebuild: no wait."""
    cluster = cluster_factory(1, "64MiB")
    with master_channel(cluster.master_address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        answer = stub.Exists(
            pb.ExistsRequest(keys=["nothing"], no_lease=True), timeout=5, metadata=bearer()
        )
        assert list(answer.statuses) == [pb.KeyStatus.NOT_FOUND]
