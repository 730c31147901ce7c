"""A leader that hears from no storage node any more steps down (``Election.
step_down_reason``, ``MasterCore.step_down_reason``).

It cannot tell whether the nodes died or whether it is cut off from them while the other
masters are not. Keeping the term, it would answer every get "not found" and every put "no
space" for as long as its etcd lease holds, which a partition between it and the nodes
alone never ends. Stepping down hands the term to a master that may reach them. The nodes it
declared dead stay listed as serving in etcd for one node TTL (master/main.py's
``_NodesLeaving``), so the successor waits for them in its rebuild window, answering clients
"rebuilding" (they retry), rather than "not found" from an empty index.
"""

from __future__ import annotations

import os
import signal

from helpers import get_in_background, wait_until

from kvpool import Client

NODE_TTL = 4.0


def test_a_leader_that_hears_from_no_node_hands_its_term_on_and_a_get_meanwhile_waits(
    ha_cluster,
):
    cluster = ha_cluster(masters=2, nodes=1, master_args=["--node-ttl", str(NODE_TTL)])
    old = cluster.leader()
    assert old is not None
    (node,) = cluster.nodes
    value = os.urandom(200_000)
    with Client(cluster.master_address, timeout=30) as client:
        client.put("kept", value)
        reader, got = get_in_background(client, "kept")
        node.signal(signal.SIGSTOP)  # (silent to every master alike)
        try:
            assert wait_until(
                lambda: "stepping down" in old.log_path.read_text(errors="replace"),
                timeout=10 * NODE_TTL,
            ), "the leader kept its term while it heard from no node"
            reader.start()  # (at the old leader stepping down, or the new one rebuilding)
            reader.join(1.0)
            assert reader.is_alive(), f"the get did not wait for the node: {got}"
            new = cluster.wait_for_leader(timeout=20)
            assert new is not old, "the term went back to the master that stepped down"
        finally:
            node.signal(signal.SIGCONT)
        reader.join(30)
        assert not reader.is_alive()
        assert got == [value], "the get was answered before the node was heard again"
        log = old.log_path.read_text(errors="replace")
        assert "hears from no storage node" in log
        assert log.count("stepping down") == 1, "stepped down once, not again and again"
