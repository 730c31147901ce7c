"""A master that answers a node slowly, but within the node TTL, keeps the node.

A node's heartbeats and mounts used to wait 2 s for the master's answer whatever the TTL,
and after two missed heartbeats the node dropped its channel and its session and went
looking for the leading master: a node whose round trip to the master took over 2 s was
declared dead (its mount could not succeed either), even with a long ``--node-ttl``. Now the
master says its TTL in its answers, and the node waits about that long (storage_node/node.py
``call_deadline``, ``gives_up``).

Without network namespaces: the master is stopped (SIGSTOP) for longer than two of the old
heartbeat deadlines, but well within its node TTL, and the node's calls wait for it; and a
node reaches its master through a proxy that delays every byte 1.2 s each way (the audit's
case): it is not declared dead.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request

from helpers import cluster_status, wait_until
from tcp_proxy import TcpProxy

from kvpool import Client

NODE_TTL = 12.0
#: Seconds the proxy delays each byte one way: a round trip above the old 2 s deadline.
ONE_WAY = 1.2
#: Longer than two of the old 2 s heartbeat deadlines and the pause between them (about
#: 5 s): the old node gave up on the master; well within NODE_TTL.
STOPPED_FOR = 6.0


def test_a_node_whose_master_answers_late_but_within_the_ttl_keeps_its_session(
    cluster_factory,
):
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", str(NODE_TTL)])
    objects = {f"k{i}": os.urandom(20_000) for i in range(10)}
    with Client(cluster.master_address, timeout=20) as client:
        client.put_many(list(objects.items()), replicas=2)
        assert cluster_status(client.master).nodes == 2
        node_logs = [node.log_path for node in cluster.nodes]
        # (a heartbeat answered, the TTL is known: the nodes wait for the master that long)
        time.sleep(1.5)
        before = [_said(path) for path in node_logs]

        cluster.master.signal(signal.SIGSTOP)
        time.sleep(STOPPED_FOR)
        cluster.master.signal(signal.SIGCONT)

        # the nodes' calls waiting across the stop are answered, and the next ones too
        time.sleep(3.0)
        assert wait_until(lambda: cluster_status(client.master).nodes == 2, 5.0)
        for path, said in zip(node_logs, before, strict=True):
            # (a node that gave up on the master says why, looks for the leader, and
            # mounts its segments again)
            assert _said(path) == said, f"{path.name} gave up on a master within its TTL"
        master_log = cluster.master.log_path.read_text(errors="replace")
        assert "storage nodes declared dead" not in master_log
        assert client.get_many(list(objects)) == list(objects.values())


def _said(path) -> dict[str, int]:
    """How often the node's log says each of the lines of a node that gives up on its master
    (the first ``cannot reach master`` may come as the node starts: its token is new)."""
    text = path.read_text(errors="replace")
    lines = ("cannot reach master", "looking for the leading master", "segment mounted")
    return {line: text.count(line) for line in lines}


def test_a_node_whose_round_trip_to_the_master_exceeds_two_seconds_is_not_declared_dead(
    cluster_factory,
):
    ttl = 8.0
    cluster = cluster_factory(1, "64MiB", master_args=["--node-ttl", str(ttl)])
    with TcpProxy(cluster.master_address) as proxy:
        slow = cluster.add_node(extra=["--master", proxy.address])  # (the last --master wins)
        objects = {f"k{i}": os.urandom(20_000) for i in range(10)}
        with Client(cluster.master_address, timeout=20) as client:
            assert wait_until(lambda: cluster_status(client.master).nodes == 2, 10.0)
            client.put_many(list(objects.items()), replicas=2)
            time.sleep(1.5)  # (a heartbeat answered: the node knows the master's TTL)
            before = _said(slow.log_path)

            proxy.delay = ONE_WAY
            # the old node gave up on the master after two heartbeats (about 5 s) and could
            # not mount again within 2 s: not ready, no command stream (and where its mounts
            # did not reach the master either, declared dead a TTL after its last heartbeat)
            unready = []
            end = time.monotonic() + ttl + 8.0
            while time.monotonic() < end:
                if (status := readyz(slow.ready["http_port"])) != 200:
                    unready.append(status)
                time.sleep(0.5)
            master_log = cluster.master.log_path.read_text(errors="replace")
            assert "storage nodes declared dead" not in master_log
            assert cluster_status(client.master).nodes == 2
            assert unready == [], "the node's segments were not mounted for a while"
            assert _said(slow.log_path) == before, "the node gave up on its master"
            assert client.get_many(list(objects)) == list(objects.values())


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0
