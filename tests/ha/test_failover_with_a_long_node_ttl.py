"""A node waits for its master's answers about the master's node TTL (storage_node/node.py
``call_deadline``): a slow link is no reason to leave a master that still hears it. A leader
stopped past its etcd lease must still be left as fast as before, long TTL or not: while a
call waits past the old 2 s deadline, the node asks the other masters who leads (a standby
names the leader; etcd, where the node reads it), and goes to the new leader."""

from __future__ import annotations

import signal
import time

from helpers import wait_until
from tcp_proxy import TcpProxy

NODE_TTL = 30.0


def test_a_node_leaves_a_leader_stopped_past_its_lease_at_once_whatever_the_node_ttl(ha_cluster):
    cluster = ha_cluster(masters=2, nodes=1, master_args=["--node-ttl", str(NODE_TTL)])
    old = cluster.leader()
    assert old is not None
    time.sleep(1.5)  # (a heartbeat answered: the node knows the TTL, and waits that long)
    moved_after = seconds_to_follow(old, cluster.nodes[0].log_path)
    print(f"\nthe node mounted its segment at the new leader {moved_after:.2f}s after the stop")
    # (the lease, 2 s, runs out; a standby is elected; the node, asking a heartbeat interval
    # apart, follows it: as fast as when it gave up after two 2 s heartbeats)
    assert moved_after < 10.0
    new = cluster.wait_for_leader(timeout=10)
    assert new is not old


def test_a_node_given_one_address_leaves_a_stopped_leader_as_fast_as_before(ha_cluster):
    """Behind one address (the chart's secure nodes go through the master Service) the node
    has nobody else to ask who leads, and cannot tell a stopped leader from a slow one: it
    keeps the 2 s waits (the master says it is one of several), and so finds the new leader
    within seconds, not a node TTL (the new leader refuses clients until it has)."""
    cluster = ha_cluster(masters=2, nodes=0, master_args=["--node-ttl", str(NODE_TTL)])
    old = cluster.leader()
    assert old is not None
    addresses = [f"{m.host}:{m.ready['grpc_port']}" for m in cluster.masters]
    first = cluster.masters.index(old)
    # (a Service: each new connection to the next master, the first to the leader)
    with TcpProxy(*addresses[first:], *addresses[:first]) as service:
        node = cluster.add_node(extra=["--master", service.address])
        time.sleep(2.5)  # (heartbeats answered)
        assert seconds_to_follow(old, node.log_path) < 12.0


def seconds_to_follow(leader, node_log) -> float:
    """Stops ``leader`` (a GC pause, a stopped VM: its lease runs out) until the node whose
    log is ``node_log`` mounts its segment at another master; how long that took."""
    mounted = node_log.read_text(errors="replace").count("segment mounted")
    leader.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert wait_until(
            lambda: node_log.read_text(errors="replace").count("segment mounted") > mounted,
            timeout=NODE_TTL / 2,
        ), "the node waited for the stopped leader instead of following the new one"
        return time.monotonic() - stopped
    finally:
        leader.signal(signal.SIGCONT)
