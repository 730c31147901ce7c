"""A node waits for its master's answers about the master's node TTL (storage_node/node.py
``call_deadline``): a slow link is no reason to leave a master that still hears it. A leader
stopped past its etcd lease must still be left as fast as before, long TTL or not: while a
call waits past the old 2 s deadline, the node asks the other masters who leads (a standby
names the leader; etcd, where the node reads it), and goes to the new leader."""

from __future__ import annotations

import signal
import time

from helpers import wait_until

NODE_TTL = 30.0


def test_a_node_leaves_a_leader_stopped_past_its_lease_at_once_whatever_the_node_ttl(ha_cluster):
    cluster = ha_cluster(masters=2, nodes=1, master_args=["--node-ttl", str(NODE_TTL)])
    old = cluster.leader()
    assert old is not None
    node_log = cluster.nodes[0].log_path
    time.sleep(1.5)  # (a heartbeat answered: the node knows the TTL, and waits that long)
    mounted = node_log.read_text(errors="replace").count("segment mounted")

    old.signal(signal.SIGSTOP)  # (a GC pause, a stopped VM: its lease runs out)
    stopped = time.monotonic()
    try:
        assert wait_until(
            lambda: node_log.read_text(errors="replace").count("segment mounted") > mounted,
            timeout=NODE_TTL / 2,
        ), "the node waited for the stopped leader instead of following the new one"
        moved_after = time.monotonic() - stopped
    finally:
        old.signal(signal.SIGCONT)
    print(f"\nthe node mounted its segment at the new leader {moved_after:.2f}s after the stop")
    # (the lease, 2 s, runs out; a standby is elected; the node, asking a heartbeat interval
    # apart, follows it: as fast as when it gave up after two 2 s heartbeats)
    assert moved_after < 10.0
    new = cluster.wait_for_leader(timeout=10)
    assert new is not old
