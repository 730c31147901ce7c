"""The master itself stops for a while (its process stopped, its host paused, its event loop
blocked): when it runs again, it holds nobody's silence in that time against them.

A master stopped past the node TTL used to tick first on resume, before reading the
heartbeats waiting in its sockets, and declare every node dead: every object lost at once.
"""

from __future__ import annotations

import os
import signal
import time

from helpers import cluster_status, wait_until

from kvpool import Client

NODE_TTL = 3.0  # (a loaded CI machine may delay a heartbeat past a shorter one)


def test_a_master_stopped_past_the_node_ttl_declares_no_node_dead_when_it_resumes(
    cluster_factory,
):
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", str(NODE_TTL)])
    objects = {f"k{i}": os.urandom(20_000) for i in range(20)}
    with Client(cluster.master_address, timeout=10) as client:
        client.put_many(list(objects.items()))
        assert cluster_status(client.master).nodes == 2

        cluster.master.signal(signal.SIGSTOP)
        time.sleep(2.5 * NODE_TTL)
        cluster.master.signal(signal.SIGCONT)

        assert wait_until(
            lambda: (
                "did not run for a while" in cluster.master.log_path.read_text(errors="replace")
            ),
            10.0,
        )
        time.sleep(NODE_TTL)  # (past the next ticks: any node declared dead would show)
        status = cluster_status(client.master)
        assert status.nodes == 2, "a node was declared dead for the master's own silence"
        assert "storage nodes declared dead" not in cluster.master.log_path.read_text(
            errors="replace"
        )
        assert client.get_many(list(objects)) == list(objects.values())
