"""Storage nodes die or stall: reads fail fast or use another replica, nothing hangs."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from helpers import wait_until

from kvpool import Client
from kvpool.errors import ObjectNotFound, TransferError


def test_a_two_replica_object_survives_a_node_killed_with_sigkill(cluster_factory):
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", "1.5"])
    data = os.urandom(4 << 20)
    with Client(cluster.master_address, timeout=5) as client:
        client.put("precious", data, replicas=2)
        assert {s.objects for s in client.cluster_status().segments} == {1}
        cluster.nodes[0].kill()
        assert client.get("precious") == data  # before the master notices: the other replica
        assert wait_until(lambda: client.cluster_status().nodes == 1, timeout=4.0)
        assert client.get("precious") == data  # after: the master lists only the survivor


def test_the_master_drops_a_dead_nodes_objects_within_the_heartbeat_ttl(cluster_factory):
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", "1.5"])
    with Client(cluster.master_address, timeout=5) as client:
        keys = [f"k{i}" for i in range(20)]
        client.put_many([(k, os.urandom(10_000)) for k in keys])
        victim = cluster.nodes[0].ready["node_id"]
        on_victim = next(s.objects for s in client.cluster_status().segments if s.node_id == victim)
        assert on_victim > 0
        killed_at = time.monotonic()
        cluster.nodes[0].kill()
        # no get hangs while the master has not noticed yet
        for key in keys:
            start = time.monotonic()
            with contextlib.suppress(TransferError, ObjectNotFound):
                client.get(key)
            assert time.monotonic() - start < 5
        assert wait_until(lambda: client.cluster_status().nodes == 1, timeout=4.0)
        assert time.monotonic() - killed_at < 1.5 + 2.0
        results = client.get_many(keys)
        lost = [k for k, r in zip(keys, results, strict=True) if isinstance(r, ObjectNotFound)]
        assert len(lost) == on_victim
        assert all(isinstance(r, bytes) for r in results if not isinstance(r, ObjectNotFound))


def test_a_stalled_node_gives_a_transfer_error_within_the_deadline(cluster_factory):
    """Over TCP a node must progress its UCX worker for a transfer to finish: stop it."""
    cluster = cluster_factory(1, "64MiB")
    with Client(
        cluster.master_address,
        timeout=2.0,
        ucx_config={"TLS": "tcp"},
        same_host_mapping=False,  # a mapping reads a stopped node's memory regardless
    ) as client:
        data = os.urandom(8 << 20)
        client.put("stalled", data)
        assert client.get("stalled") == data
        cluster.nodes[0].signal(signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(TransferError, match="deadline"):
                client.get("stalled")
            assert time.monotonic() - start < 3.0
        finally:
            cluster.nodes[0].signal(signal.SIGCONT)
        assert client.get("stalled") == data  # a fresh endpoint once the node is back
