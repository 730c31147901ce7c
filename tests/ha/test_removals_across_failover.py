"""A removal that was answered sticks at the next leader, though a node that held the object
was away when it was removed (found by the chaos suite, seed 7: a new leader adopted removed
objects again from a node that had been paused past its TTL).

A new leader rebuilds its index from what the nodes report; the leader that answered the
removal wrote what its successor must refuse to etcd first (master/tombstone_store.py).
"""

from __future__ import annotations

import os
import signal

from helpers import holders, wait_until

from kvpool import Client

NODE_TTL = 2.0
MASTER_ARGS = ("--node-ttl", str(NODE_TTL))


def test_an_object_removed_while_its_node_was_away_stays_removed_at_a_new_leader(ha_cluster):
    cluster = ha_cluster(masters=2, nodes=2, master_args=MASTER_ARGS)
    away, other = cluster.nodes
    away_id = away.ready["node_id"]
    removed = {f"removed/{i}": os.urandom(4096 + i) for i in range(8)}
    kept = {f"kept/{i}": os.urandom(4096 + i) for i in range(8)}
    with Client(cluster.master_address, timeout=20) as client:
        both = list(removed.items()) + list(kept.items())
        assert client.put_many(both, replicas=2) == [2] * len(both)
        assert all(away_id in holders(client, key) for key in removed)

        # The node is paused past its TTL: the leader drops its replicas (they serve from
        # the other node) and the removals are answered without it.
        away.signal(signal.SIGSTOP)
        try:
            assert wait_until(
                lambda: all(holders(client, k) == {other.ready["node_id"]} for k in removed),
                timeout=10 * NODE_TTL,
            ), "the paused node was never declared dead"
            for key in removed:
                client.remove(key)
            assert not any(client.exists_many(list(removed), lease=False))

            # The leader dies before the node comes back; the node remounts at the next one,
            # reporting everything its index lists, the removed objects too.
            old = cluster.leader()
            assert old is not None
            old.kill()
        finally:
            away.signal(signal.SIGCONT)
        cluster.wait_for_leader(timeout=60)
        back_without_the_removed(client, away_id, kept, removed)


def test_an_object_removed_at_a_new_leader_stays_removed_when_a_node_dead_before_returns(
    ha_cluster,
):
    """The node is declared dead under one leader, and the objects are removed at the next:
    that leader never heard from the node, so it must learn from etcd that the node is away
    (it was once dropped from etcd's list of nodes, and the removal was answered while the
    node still held the bytes: they came back with it)."""
    cluster = ha_cluster(masters=2, nodes=2, master_args=MASTER_ARGS)
    away, other = cluster.nodes
    away_id, other_id = away.ready["node_id"], other.ready["node_id"]
    removed = {f"removed/{i}": os.urandom(4096 + i) for i in range(8)}
    kept = {f"kept/{i}": os.urandom(4096 + i) for i in range(8)}
    with Client(cluster.master_address, timeout=30) as client:
        both = [*removed, *kept]
        assert client.put_many([*removed.items(), *kept.items()], replicas=2) == [2] * len(both)
        assert all(away_id in holders(client, key) for key in both)

        # The node is paused past its TTL: the leader drops its replicas (they serve from the
        # other node). Then the leader dies, and the objects are removed at the next one.
        away.signal(signal.SIGSTOP)
        try:
            assert wait_until(
                lambda: all(holders(client, k) == {other_id} for k in both),
                timeout=10 * NODE_TTL,
            ), "the paused node was never declared dead"
            old = cluster.leader()
            assert old is not None
            old.kill()
            cluster.wait_for_leader(timeout=60)
            assert wait_until(
                lambda: all(holders(client, k) == {other_id} for k in both), timeout=60
            ), "the new leader did not rebuild its index from the other node"
            for key in removed:
                client.remove(key, force=True)  # (holders() leased them just now)
            assert not any(client.exists_many(list(removed), lease=False))
        finally:
            away.signal(signal.SIGCONT)

        # The node comes back, reporting everything its index lists, the removed objects too.
        back_without_the_removed(client, away_id, kept, removed)


def back_without_the_removed(
    client: Client, away_id: str, kept: dict[str, bytes], removed: dict[str, bytes]
) -> None:
    """The node that was away brought back what it holds, but for the removed objects."""
    assert wait_until(lambda: all(away_id in holders(client, key) for key in kept), timeout=60), (
        "the node that was away did not bring back what it holds"
    )
    assert client.exists_many(list(removed), lease=False) == [False] * len(removed)
    assert not client.list_keys("removed/").keys
    for key, value in kept.items():
        assert client.get(key) == value
