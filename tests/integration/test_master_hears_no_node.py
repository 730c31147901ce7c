"""A master that hears from no storage node tells clients to retry, not that their objects
are gone.

When every node it had goes silent, the master cannot tell whether they died or whether it
is cut off from them (a partition around it). Until this change it answered every get
NOT_FOUND and every put NO_SPACE ("no storage node has mounted a segment yet") from the
moment it declared them dead: a reader concluded its object was lost while the node still
held it. For one node TTL it now answers UNAVAILABLE, which clients retry within their
deadline: a node heard again within that time serves the get.
"""

from __future__ import annotations

import os
import signal

import grpc
from helpers import bearer, cluster_status, get_in_background, master_channel, wait_until

from kvpool import Client
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc

NODE_TTL = 4.0


def refusal(address: str) -> str:
    """What the master answers one Exists (no retry): '' when it answers, else the
    refusal's details."""
    with master_channel(address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        try:
            stub.Exists(pb.ExistsRequest(keys=["k"], no_lease=True), timeout=2, metadata=bearer())
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return error.details() or "?"
    return ""


def test_a_get_while_the_only_node_is_silent_waits_for_it_and_returns_the_bytes(
    cluster_factory,
):
    cluster = cluster_factory(1, "64MiB", master_args=["--node-ttl", str(NODE_TTL)])
    (node,) = cluster.nodes
    value = os.urandom(300_000)
    with Client(cluster.master_address, timeout=30) as client:
        client.put("kept", value)
        node.signal(signal.SIGSTOP)
        try:
            told = ""

            def declared_dead() -> bool:
                nonlocal told
                told = refusal(cluster.master_address)
                return "hears from no storage node" in told

            assert wait_until(declared_dead, timeout=10 * NODE_TTL, interval=0.2), told
            assert node.ready["node_id"] in told
            # the status an operator asks for meanwhile is answered, and says why
            assert node.ready["node_id"] in cluster_status(cluster.master_address).clients_refused
            assert "hears from no storage node" in client.cluster_status().clients_refused
            reader, got = get_in_background(client, "kept")
            reader.start()
            reader.join(0.5)
            assert reader.is_alive(), f"the get did not wait for the node: {got}"
        finally:
            node.signal(signal.SIGCONT)
        reader.join(30)
        assert not reader.is_alive()
        assert got == [value], "the get was answered before the node was heard again"
        assert client.cluster_status().clients_refused == ""
