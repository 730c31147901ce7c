"""Replica counts survive a master failover: a new leader restores what the old one would.

With a real etcd, several masters and storage nodes, clients moving bytes over UCX: each
node records with every object the replica count its put got, and reports it when it
mounts at a new leader, so that

- objects put with ``replicas=2``, the leader killed, then a node holding copies killed:
  the new leader copies every object it held to another node, node to node, until every
  object is on two live nodes again;
- the leader and a node killed together (the node gone before the new leader learns of
  it): the new leader hears of each object from its surviving replica alone, and still
  brings it back to two (a master that counted only the replicas reported would keep one);
- the copies hold the objects' bytes: each object is read back, checksum verified;
- every node but one killed at last: the master keeps answering, every object is found on
  the last node and reads back exact.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from helpers import wait_until

from kvpool import Client
from kvpool.errors import KVPoolError
from kvpool.local_cluster import LocalCluster, ManagedProcess

NODE_TTL = 1.5
RATE = 64 << 20  # --rereplication-rate, bytes per second
#: Seconds to wait for a new leader, every node remounted, and the copies: generous, on two
#: shared cores.
RECOVERY = 60.0


#: The masters' arguments: re-replication on, and a short node TTL.
MASTER_ARGS = ("--node-ttl", str(NODE_TTL), "--rereplication-rate", str(RATE))


def node_ids(nodes: list[ManagedProcess]) -> set[str]:
    return {node.ready["node_id"] for node in nodes if node.alive()}


def holders(client: Client, key: str) -> list[str]:
    return [replica.node_id for replica in client.stat(key).replicas]


def on_live_nodes_only(client: Client, keys: list[str], live: set[str]) -> bool:
    try:
        held = [holders(client, key) for key in keys]
    except KVPoolError:
        return False
    return all(nodes and set(nodes) <= live for nodes in held)


def on_two_live_nodes(client: Client, keys: list[str], live: set[str]) -> bool:
    try:
        for key in keys:
            nodes = holders(client, key)
            if len(set(nodes)) != 2 or len(nodes) != 2 or not set(nodes) <= live:
                return False
    except KVPoolError:
        return False  # (the new leader may still turn clients away while it rebuilds)
    return True


def fail_over(cluster: LocalCluster, then: Callable[[], None] = lambda: None) -> None:
    old = cluster.leader()
    assert old is not None
    old.kill()
    then()
    new = cluster.wait_for_leader(timeout=RECOVERY)
    assert new is not old


def test_a_new_leader_restores_two_replicas_of_what_a_lost_node_held(ha_cluster):
    cluster = ha_cluster(masters=3, nodes=4, master_args=MASTER_ARGS)
    objects = {f"twice/{i}": os.urandom(256 * 1024 + i) for i in range(24)}
    keys = list(objects)
    with Client(cluster.master_address, timeout=20) as client:
        assert client.put_many(list(objects.items()), replicas=2, checksum=True) == [2] * 24

        # 1. Failover, every node remounts at the new leader; then a node with copies dies.
        fail_over(cluster)
        assert wait_until(lambda: on_two_live_nodes(client, keys, node_ids(cluster.nodes)), 30)
        first = next(
            n for n in cluster.nodes if any(n.ready["node_id"] in holders(client, k) for k in keys)
        )
        first.kill()
        assert wait_until(
            lambda: on_two_live_nodes(client, keys, node_ids(cluster.nodes)), RECOVERY
        ), {key: holders(client, key) for key in keys}
        for key, data in objects.items():
            assert client.get(key, verify=True) == data, key

        # 2. The leader and a node die together: the new leader hears of the objects that
        # node held from one replica each.
        second = next(n for n in cluster.nodes if n.alive())
        second_id = second.ready["node_id"]
        lone = [key for key in keys if second_id in holders(client, key)]
        assert lone, "the second node held some objects"
        fail_over(cluster, then=second.kill)
        live = node_ids(cluster.nodes)
        assert len(live) == 2
        assert wait_until(lambda: on_two_live_nodes(client, keys, live), RECOVERY), {
            key: holders(client, key) for key in lone
        }

        for key, data in objects.items():  # the copies hold the bytes
            assert client.get(key, verify=True) == data, key

        # 3. Every node but one dies: one copy of each object is left, and served.
        next(n for n in cluster.nodes if n.alive()).kill()
        last = node_ids(cluster.nodes)
        assert len(last) == 1
        assert wait_until(lambda: on_live_nodes_only(client, keys, last), RECOVERY), {
            key: holders(client, key) for key in keys
        }
        for key, data in objects.items():
            assert client.get(key, verify=True) == data, key
