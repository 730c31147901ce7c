"""A storage node that silently stops answering (its packets dropped: a partition before the
master's node TTL, a one-way cut, heavy loss) costs a get of a 2-replica object only the
share of the timeout its replica was given: the other replica serves within the timeout, and
the silent node is tried last by the next reads (client/get_path.py, attempt_deadline).

A stopped process (SIGSTOP) is such a node: the kernel keeps its connections open and takes
what is sent to it, but nothing answers, over the checked stream as over UCX on TCP. (A
mapping reads a stopped node's memory regardless: these clients map nothing.)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections.abc import Iterator

import pytest
from helpers import wait_until

from kvpool import Client
from kvpool.client.unreachable_nodes import REMEMBER_FOR
from kvpool.errors import TransferError
from kvpool.local_cluster import LocalCluster, ManagedProcess

TIMEOUT = 4.0
_keys = itertools.count()
PATHS = ["checked stream", "ucx"]


def start(cluster_factory, monkeypatch, path: str) -> LocalCluster:
    node_args: tuple[str, ...] = ()
    if path == "ucx":  # a client that opts out, nodes that offer UCX over TCP
        monkeypatch.setenv("KVPOOL_CHECKED_STREAM", "0")
        node_args = ("--ucx-tcp",)
    # the master keeps listing a stopped node throughout (the time before its node TTL)
    return cluster_factory(2, "64MiB", node_args=node_args, master_args=["--node-ttl", "60"])


def client_of(cluster: LocalCluster) -> Client:
    return Client(
        cluster.master_address,
        timeout=TIMEOUT,
        ucx_config={"TLS": "tcp"},  # over TCP a node must progress for a transfer to finish
        same_host_mapping=False,
    )


def node_id(node: ManagedProcess) -> str:
    return node.ready["node_id"]


def key_read_first_from(client: Client, node: ManagedProcess, data: bytes) -> str:
    """A key put on both nodes whose replica on ``node`` is the one a get tries first (the
    first one Stat lists, every node being on this host: see test_node_failure.py,
    node_read_first), read once so that connections to both nodes exist."""
    for _ in range(64):
        key = f"on-{node_id(node)}-{next(_keys)}"
        assert client.put(key, data, replicas=2) == 2
        replicas = client.stat(key).replicas
        assert len({r.node_id for r in replicas}) == 2
        if replicas[0].node_id == node_id(node):
            assert client.get(key) == data
            return key
    raise AssertionError(f"no key of 64 is read first from {node_id(node)}")


def key_only_on(client: Client, node: ManagedProcess, data: bytes) -> str:
    """A key put with one replica, which placement gave to ``node``."""
    for _ in range(64):
        key = f"only-on-{node_id(node)}-{next(_keys)}"
        assert client.put(key, data, replicas=1) == 1
        if client.stat(key).replicas[0].node_id == node_id(node):
            return key
        client.remove(key)
    raise AssertionError(f"no key of 64 was placed on {node_id(node)}")


@contextlib.contextmanager
def stopped(node: ManagedProcess) -> Iterator[None]:
    node.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        node.signal(signal.SIGCONT)


def timed_get(client: Client, key: str) -> tuple[bytes, float]:
    start = time.monotonic()
    value = client.get(key)
    return value, time.monotonic() - start


@pytest.mark.parametrize("path", PATHS)
def test_a_get_reads_the_other_replica_when_the_first_ones_node_is_silent(
    cluster_factory, monkeypatch, path
):
    """Each node in turn is the silent one, and the one read first: the get still returns the
    bytes, from the other node, well within the timeout (it used to wait the whole timeout
    out on the silent node and fail). The silent node is then avoided: the next get of
    another key read first from it goes to the healthy node straight away."""
    cluster = start(cluster_factory, monkeypatch, path)
    data = os.urandom(1 << 20)
    for victim in cluster.nodes:
        with client_of(cluster) as client:  # (a client that has not avoided any node yet)
            first = key_read_first_from(client, victim, data)
            second = key_read_first_from(client, victim, data)
            with stopped(victim):
                value, took = timed_get(client, first)
                assert value == data
                assert took < TIMEOUT * 0.75, f"the get took {took:.1f}s of {TIMEOUT}s"
                assert node_id(victim) in client._session.data.unreachable
                value, took = timed_get(client, second)
                assert value == data
                assert took < 1.0, f"the next get tried the silent node first ({took:.1f}s)"


@pytest.mark.parametrize("path", PATHS)
def test_in_a_batch_of_objects_on_fewer_and_more_replicas_each_still_falls_over(
    cluster_factory, monkeypatch, path
):
    """A batch of an object on two replicas, read first from the silent node, and objects on
    one replica each, on either node: the first is read from the other node (it used to wait
    the whole timeout on the silent one, as the objects on their last replica do, and fail),
    the one on the healthy node is read, and only the one held by the silent node alone
    fails, within the timeout."""
    cluster = start(cluster_factory, monkeypatch, path)
    victim, healthy = cluster.nodes
    data = os.urandom(1 << 20)
    with client_of(cluster) as client:
        both = key_read_first_from(client, victim, data)
        there = key_only_on(client, healthy, data)
        gone = key_only_on(client, victim, data)
        with stopped(victim):
            start_at = time.monotonic()
            results = client.get_many([both, there, gone])
            took = time.monotonic() - start_at
        assert results[0] == data, results[0]
        assert results[1] == data, results[1]
        assert isinstance(results[2], TransferError), results[2]
        assert f"[{node_id(victim)}]" in str(results[2])
        assert took < TIMEOUT + 1.0, f"the batch took {took:.1f}s"


@pytest.mark.parametrize("path", PATHS)
def test_a_silent_node_that_runs_again_is_used_again(cluster_factory, monkeypatch, path):
    """Once its time as unreachable is up (or a transfer with it succeeds), the node is read
    from and written to again: a put of 2 replicas stores both."""
    cluster = start(cluster_factory, monkeypatch, path)
    victim = cluster.nodes[0]
    data = os.urandom(64 << 10)
    with client_of(cluster) as client:
        key = key_read_first_from(client, victim, data)
        with stopped(victim):
            assert client.get(key) == data
            assert node_id(victim) in client._session.data.unreachable
            # (puts avoid it meanwhile: one replica, on the healthy node)
            assert client.put("while-silent", data, replicas=2) == 1
        assert wait_until(
            lambda: node_id(victim) not in client._session.data.unreachable,
            timeout=REMEMBER_FOR + 1.0,
        )
        assert client.put("after", data, replicas=2) == 2
        value, took = timed_get(client, key)  # read from the node that is back, first
        assert value == data
        assert took < 1.0


@pytest.mark.parametrize("path", PATHS)
def test_a_get_whose_every_replica_is_silent_says_what_it_tried(cluster_factory, monkeypatch, path):
    """Both nodes stopped: the get fails within its timeout, and its error names the two
    replicas it tried, their nodes and why each failed."""
    cluster = start(cluster_factory, monkeypatch, path)
    data = os.urandom(64 << 10)
    with client_of(cluster) as client:
        key = key_read_first_from(client, cluster.nodes[0], data)
        with stopped(cluster.nodes[0]), stopped(cluster.nodes[1]):
            start_at = time.monotonic()
            with pytest.raises(TransferError) as caught:
                client.get(key)
            took = time.monotonic() - start_at
        assert took < TIMEOUT + 1.0, f"the get took {took:.1f}s"
        message = str(caught.value)
        assert "from any of its 2 replica(s)" in message, message
        assert message.count("missed its deadline") == 2, message
        assert f"[{node_id(cluster.nodes[0])}]" in message, message
        assert f"[{node_id(cluster.nodes[1])}]" in message, message
        assert "not done within the" in message, message  # the first one's share
