"""The metadata lane: clients' hot calls and nodes' command streams skip gRPC where the master
offers the lane, and everything still works over gRPC where it does not or cannot be reached.
"""

from __future__ import annotations

import socket
import time

import pytest
from helpers import cluster_status, metric

from kvpool import Client
from kvpool.client import batch_split
from kvpool.client.lane_client import LaneClient
from kvpool.client.master_link import MasterLink
from kvpool.common import lane_protocol as lp
from kvpool.errors import InvalidArgument, MasterUnavailable
from kvpool.proto import master_pb2 as pb

HOT_CALLS = ("PutStart", "PutEnd", "GetReplicas", "Exists", "Remove")


def lane_requests(cluster, method: str) -> float:
    try:
        return metric(
            cluster.master_http_port, f'kvpool_master_lane_requests_total{{method="{method}"}}'
        )
    except AssertionError:  # a labelled counter is exported from its first increment
        return 0.0


def grpc_requests(cluster, method: str) -> float:
    """Calls that came over gRPC (every call counts in requests_total, whichever door)."""
    name = f'kvpool_master_requests_total{{method="{method}"}}'
    try:
        total = metric(cluster.master_http_port, name)
    except AssertionError:  # a labelled counter is exported from its first increment
        return 0.0
    return total - lane_requests(cluster, method)


def round_trip(client: Client, prefix: str) -> None:
    items = {f"{prefix}-{i}": bytes([i]) * (1000 + i) for i in range(20)}
    assert client.put_many(items) == [1] * 20
    assert client.get_many(list(items)) == list(items.values())
    assert client.exists_many(list(items)) == [True] * 20
    assert client.remove_many(list(items), force=True) == [None] * 20


def test_hot_calls_and_node_command_streams_take_the_lane(cluster_factory):
    cluster = cluster_factory(1, "64MiB")
    with Client(cluster.master_address) as client:
        round_trip(client, "lane")
    for method in HOT_CALLS:
        assert lane_requests(cluster, method) > 0, method
    # every put above waited for the node to record it: that answer came over the lane too
    assert metric(cluster.master_http_port, "kvpool_master_lane_node_sessions_total") == 1


def test_a_master_without_a_lane_serves_everything_over_grpc(cluster_factory):
    cluster = cluster_factory(1, "64MiB", master_args=["--lane-port", "-1"])
    with Client(cluster.master_address) as client:
        round_trip(client, "grpc")
    assert [lane_requests(cluster, method) for method in HOT_CALLS] == [0] * len(HOT_CALLS)
    assert metric(cluster.master_http_port, "kvpool_master_lane_node_sessions_total") == 0
    assert grpc_requests(cluster, "PutEnd") > 0


def test_a_client_told_not_to_use_the_lane_calls_over_grpc(cluster_factory):
    cluster = cluster_factory(1, "64MiB")
    with Client(cluster.master_address, metadata_lane=False) as client:
        round_trip(client, "by-grpc")
    assert [lane_requests(cluster, method) for method in HOT_CALLS] == [0] * len(HOT_CALLS)
    assert grpc_requests(cluster, "PutStart") > 0


def test_a_client_that_cannot_reach_the_lane_carries_on_over_grpc(cluster_factory):
    cluster = cluster_factory(1, "64MiB")
    link = MasterLink(cluster.master_address)
    exists = pb.ExistsRequest(keys=["nothing-here"])
    link.call("Exists", exists, time.monotonic() + 5)  # learns the lane
    # The lane is now behind a wall: a port where nothing listens (the refusal is what a
    # firewall's reject looks like to the client).
    with socket.socket() as wall:
        wall.bind(("127.0.0.1", 0))
        link._lanes[cluster.master_address] = LaneClient("127.0.0.1", wall.getsockname()[1])
        before = grpc_requests(cluster, "Exists")
        started = time.monotonic()
        response = link.call("Exists", exists, time.monotonic() + 5)
        assert list(response.statuses) == [pb.NOT_FOUND]
        assert time.monotonic() - started < 1.0, "no backoff: the same call went over gRPC"
        assert grpc_requests(cluster, "Exists") == before + 1
        link.call("Exists", exists, time.monotonic() + 5)  # and later calls stay on gRPC
        assert grpc_requests(cluster, "Exists") == before + 2
    link.close()


def test_errors_over_the_lane_are_the_same_typed_errors(cluster_factory, monkeypatch):
    cluster = cluster_factory(1, "64MiB")
    # (the client splits a batch the master would refuse: here it is made to send it whole)
    monkeypatch.setattr(batch_split, "too_many_keys", lambda method, request: False)
    monkeypatch.setattr(batch_split, "each_part", lambda count, most=0: iter([range(count)]))
    with Client(cluster.master_address) as client, pytest.raises(InvalidArgument, match="split"):
        client.exists_many([f"k{i}" for i in range(lp.MAX_BATCH_KEYS + 1)])
    assert lane_requests(cluster, "Exists") == 1


def test_clients_and_nodes_find_the_lane_again_after_a_master_restart(cluster_factory):
    cluster = cluster_factory(1, "64MiB")
    with Client(cluster.master_address, timeout=3.0) as client:
        round_trip(client, "before")
        cluster.master.kill()
        # While the master is down its lane refuses connections, and so does gRPC: the
        # client blames the master, not the lane, and keeps the lane for when it is back.
        with pytest.raises(MasterUnavailable):
            client.exists("during")
        cluster.start_master()  # same ports, empty memory: the node remounts by itself

        def serving() -> bool:
            status = cluster_status(client.master)  # (answered while it rebuilds, too)
            return status.nodes >= 1 and not status.clients_refused

        deadline = time.monotonic() + 10
        while not serving() and time.monotonic() < deadline:
            time.sleep(0.05)
        # (its space is fenced a write window after a master change: the puts wait it out)
        client.timeout = 10.0
        round_trip(client, "after")
    assert lane_requests(cluster, "PutEnd") > 0
    assert [grpc_requests(cluster, method) for method in HOT_CALLS] == [0] * len(HOT_CALLS)
    assert metric(cluster.master_http_port, "kvpool_master_lane_node_sessions_total") == 1
