"""Replicas are best effort, and the caller is told.

A put asking for more copies than there are storage nodes with room stores what it can (each
copy on another node) and says how many: ``Client.put`` returns the number, ``put_many`` one
per key, ``kvpool put`` prints "2 of 3 replicas". A count below 1, or above the master's
limit, is refused as a bad argument: InvalidArgument in Python, exit status 2 from the shell.
"""

from __future__ import annotations

import uuid

import pytest
from helpers import kvpool_cli

from kvpool import Client
from kvpool.errors import InvalidArgument
from kvpool.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(2, "32MiB", run_dir=tmp_path_factory.mktemp("replicas")) as cluster:
        yield cluster


def new_key() -> str:
    return f"replicas/{uuid.uuid4().hex}"


def test_a_put_asking_for_more_replicas_than_nodes_stores_fewer_and_returns_how_many(cluster):
    key, batch_key = new_key(), new_key()
    with Client(cluster.master_address) as client:
        assert client.put(key, b"precious", replicas=3) == 2
        assert len({r.node_id for r in client.stat(key).replicas}) == 2
        assert client.put_many({batch_key: b"also"}, replicas=3) == [2]
        assert client.put(new_key(), b"one", replicas=1) == 1
        assert client.get(key) == b"precious"


@pytest.mark.parametrize("replicas", [0, -1, 2.5, True])
def test_a_replica_count_that_is_not_a_positive_whole_number_is_refused(cluster, replicas):
    key = new_key()
    with Client(cluster.master_address) as client:
        with pytest.raises(InvalidArgument, match="replicas must be a whole number") as caught:
            client.put(key, b"x", replicas=replicas)
        assert "at least 1" in str(caught.value)
        with pytest.raises(InvalidArgument, match="at least 1"):
            client.put_many({key: b"x"}, replicas=replicas)
        assert not client.exists(key, lease=False), "nothing was stored"
    with pytest.raises(InvalidArgument, match="at least 1"):
        Client(cluster.master_address, replicas=replicas)


def test_a_replica_count_above_the_masters_limit_is_refused(cluster):
    key = new_key()
    with Client(cluster.master_address) as client:
        with pytest.raises(InvalidArgument, match="between 1 and 8, got 9"):
            client.put(key, b"x", replicas=9)
        assert not client.exists(key, lease=False)


def test_kvpool_put_says_how_many_of_the_replicas_asked_for_it_stored(cluster):
    key = new_key()
    done = kvpool_cli("put", key, "--value", "v", "--replicas", "3", master=cluster.master_address)
    assert done.returncode == 0, done.stderr
    assert "2 of 3 replicas" in done.stderr
    with Client(cluster.master_address) as client:
        assert len(client.stat(key).replicas) == 2

    enough = kvpool_cli(
        "put", new_key(), "--value", "v", "--replicas", "2", master=cluster.master_address
    )
    assert enough.returncode == 0 and " of " not in enough.stderr, enough.stderr


@pytest.mark.parametrize(
    ("count", "says"),
    [("0", "at least 1"), ("-1", "at least 1"), ("two", "whole number"), ("9", "between 1 and 8")],
)
def test_kvpool_put_refuses_a_bad_replica_count_with_exit_status_2(cluster, count, says):
    key = new_key()
    master = cluster.master_address
    done = kvpool_cli("put", key, "--value", "v", "--replicas", count, master=master)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr
    assert kvpool_cli("get", key, master=cluster.master_address).returncode == 1, "not stored"
