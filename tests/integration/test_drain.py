"""Storage nodes leave without losing objects: drains, and warm restarts.

With real processes, under a workload of one-replica puts and gets:

- a rolling restart of every storage node, one at a time, each stopped with SIGTERM and
  ``--drain-on-term``: the node takes no new object, its objects are copied to the other
  nodes, then it leaves (exit status 0); no object whose put succeeded is lost;
- the same with warm restarts instead: each node keeps its objects in /dev/shm
  (``--dram-shm``), stops and starts again, and reports them; no object is lost;
- ``kvpool drain NODE`` (an admin's): the node is emptied the same way and exits; the
  command follows it until it has left. A client's token may not drain.
"""

from __future__ import annotations

import os
import time

from helpers import cluster_status, kvpool_cli, wait_until
from workload import Workload

from kvpool import Client
from kvpool.local_cluster import LocalCluster

DRAIN_ARGS = ["--drain-on-term", "--drain-timeout", "60"]
MASTER_ARGS = ["--node-ttl", "3", "--rereplication-rate", "128MiB"]


def preload(client: Client, count: int = 40) -> dict[str, bytes]:
    objects = {f"before/{i}": os.urandom(100_000 + i) for i in range(count)}
    assert client.put_many(list(objects.items()), checksum=True) == [1] * count
    return objects


def nodes_holding(client: Client, key: str) -> set[str]:
    return {replica.node_id for replica in client.stat(key).replicas}


def node_count(cluster: LocalCluster) -> int:
    return int(cluster_status(cluster.master_address).nodes)


def assert_nothing_lost(client: Client, objects: dict[str, bytes], load: Workload) -> None:
    everything = {**objects, **{key: data for key, (data, _) in load.published.items()}}
    assert len(load.published) > 10, "the workload kept putting throughout"
    results = client.get_many(list(everything), verify=True)
    lost = [key for key, got in zip(everything, results, strict=True) if got != everything[key]]
    assert not lost, f"{len(lost)} of {len(everything)} published objects lost: {lost[:5]}"


def test_a_rolling_restart_with_drains_loses_no_object(cluster_factory):
    cluster = cluster_factory(3, "128MiB", master_args=MASTER_ARGS, node_args=DRAIN_ARGS)
    with Client(cluster.master_address, timeout=10) as client:
        objects = preload(client)
        with Workload(cluster.master_address, prefix="rolling/") as load:
            for node in list(cluster.nodes):
                node_id = node.ready["node_id"]
                held = [
                    k for k in objects if node_id in {r.node_id for r in client.stat(k).replicas}
                ]
                started = time.monotonic()
                assert node.stop(timeout=60) == 0, f"{node_id} did not drain and exit cleanly"
                drained_in = time.monotonic() - started
                assert drained_in < 60, "it left before its drain deadline"
                for key in held:  # copied away before it left: readable at once
                    assert client.get(key, verify=True) == objects[key]
                node.restart()
                assert wait_until(lambda: node_count(cluster) == 3, 30)
        assert_nothing_lost(client, objects, load)


def test_a_rolling_warm_restart_loses_no_object(cluster_factory, tmp_path):
    cluster = cluster_factory(0, master_args=MASTER_ARGS)
    for i in range(3):
        cluster.add_node(
            "128MiB",
            extra=["--dram-shm", "--shm-dir", str(tmp_path / f"shm{i}"), "--node-id", f"warm{i}"],
        )
    with Client(cluster.master_address, timeout=10) as client:
        objects = preload(client)
        with Workload(cluster.master_address, prefix="warm/") as load:
            for node in list(cluster.nodes):
                assert node.stop(timeout=30) == 0
                node.restart()  # it reports what its /dev/shm segment holds
                assert wait_until(lambda: node_count(cluster) == 3, 30)
                assert wait_until(
                    lambda: all(client.exists_many(list(objects), lease=False)), 10
                ), "objects of the restarted node are back"
        assert_nothing_lost(client, objects, load)


def test_kvpool_drain_empties_a_node_which_then_leaves(cluster_factory):
    cluster = cluster_factory(
        3, "128MiB", master_args=MASTER_ARGS, node_args=["--drain-timeout", "60"]
    )
    with Client(cluster.master_address, timeout=10) as client:
        objects = preload(client)
        victim = cluster.nodes[1]
        node_id = victim.ready["node_id"]
        client_try = kvpool_cli("drain", node_id, "--wait", "0", master=cluster.master_address)
        assert client_try.returncode == 1 and "Drain is an admin's call" in client_try.stderr
        admin = os.environ["KVPOOL_TEST_ADMIN_TOKEN"]
        done = kvpool_cli("drain", node_id, "--token", admin, master=cluster.master_address)
        assert done.returncode == 0, done.stderr
        assert f"node {node_id} drained and left" in done.stderr
        victim.popen.wait(timeout=30)
        assert victim.popen.returncode == 0, "the drained node exits cleanly"
        assert node_count(cluster) == 2
        for key, data in objects.items():
            assert client.get(key, verify=True) == data
        unknown = kvpool_cli("drain", "nobody", "--token", admin, master=cluster.master_address)
        assert unknown.returncode == 1 and "no storage node 'nobody'" in unknown.stderr
