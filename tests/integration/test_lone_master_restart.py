"""Right after a lone master restarts, clients are told it is rebuilding, not that their
objects are gone or that there is no space.

A lone master keeps its index in memory: after a restart it learns what exists from the
storage nodes, which remount within a couple of seconds. Until they have, it knows no object
and no segment; answering NOT_FOUND ("never put, was removed, or lost its last replica") or
NO_SPACE ("no storage node has mounted a segment yet") would be false. It answers UNAVAILABLE
(rebuilding), which clients retry within their deadline: a get issued at once returns the
bytes, a put issued at once is stored. With ``--tombstone-file`` a removal answered while a
node was away sticks across the restart (master/tombstone_file.py).
"""

from __future__ import annotations

import os
import signal

import grpc
from helpers import bearer, holders, master_channel, wait_until

from kvpool import Client
from kvpool.common import lane_protocol as lp
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


def test_with_a_tombstone_file_a_removal_sticks_across_the_restart(cluster_factory, tmp_path):
    """A node paused past its TTL misses the removals of objects it holds; the master is
    restarted before the node comes back, and the node then reports them all. The restarted
    master read from its --tombstone-file what it must refuse (without the file it adopts the
    removed objects again: this test fails)."""
    node_ttl = 2.0
    cluster = cluster_factory(
        2,
        "64MiB",
        master_args=["--node-ttl", str(node_ttl), "--tombstone-file", str(tmp_path / "ts.json")],
    )
    away, other = cluster.nodes
    away_id, other_id = away.ready["node_id"], other.ready["node_id"]
    removed = {f"removed/{i}": os.urandom(4096 + i) for i in range(8)}
    kept = {f"kept/{i}": os.urandom(4096 + i) for i in range(8)}
    with Client(cluster.master_address, timeout=20) as client:
        both = list(removed.items()) + list(kept.items())
        assert client.put_many(both, replicas=2) == [2] * len(both)
        away.signal(signal.SIGSTOP)
        try:
            assert wait_until(
                lambda: all(holders(client, k) == {other_id} for k in removed),
                timeout=10 * node_ttl,
            ), "the paused node was never declared dead"
            for key in removed:
                client.remove(key)
            assert (tmp_path / "ts.json").stat().st_size > 0
            cluster.master.kill()
            cluster.start_master()  # same ports, empty memory, the same file
        finally:
            away.signal(signal.SIGCONT)
        assert wait_until(
            lambda: all(away_id in holders(client, key) for key in kept), timeout=60
        ), "the node that was away did not bring back what it holds"

        assert client.exists_many(list(removed), lease=False) == [False] * len(removed)
        assert not client.list_keys("removed/").keys
        for key, value in kept.items():
            assert client.get(key) == value


def test_a_segment_holding_more_objects_than_one_call_carries_comes_back_whole(cluster_factory):
    """A node reports a segment's objects when it mounts it; one MountSegment carries at most
    the batch limit (lane_protocol.MAX_BATCH_KEYS), so a node holding more reports them in
    parts. Before, the master refused the whole mount ("a batch holds at most 65536 keys"),
    the node retried it forever, and every object it held was out of reach."""
    count = lp.MAX_BATCH_KEYS + 1000
    cluster = cluster_factory(1, "512MiB")
    keys = [f"many/{i}" for i in range(count)]
    with Client(cluster.master_address, timeout=60) as client:
        for start in range(0, count, 4096):
            batch = [(key, key.encode()) for key in keys[start : start + 4096]]
            assert client.put_many(batch) == [1] * len(batch)
    cluster.master.kill()
    cluster.start_master()
    with Client(cluster.master_address, timeout=60) as client:
        present = []
        for start in range(0, count, 4096):
            present += client.exists_many(keys[start : start + 4096], lease=False)
        assert present == [True] * count
        for key in (keys[0], keys[count // 2], keys[-1]):
            assert client.get(key) == key.encode()
        client.put("after", b"new")  # (the segment takes new objects again)
        assert client.get("after") == b"new"
