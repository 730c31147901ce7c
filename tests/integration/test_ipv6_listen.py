"""kvpool listens and advertises on IPv6 as on IPv4 (an IPv6-only pod network runs the
master with ``--host ::`` and the nodes with ``--listen ::``). With real processes on ::1: a
secure master (gRPC and lane), a node's HTTP side door and checked stream, and a client that
reaches the master at ``[::1]:PORT`` and the node's bytes over the checked stream."""

from __future__ import annotations

import os
import socket
import urllib.request

from kvpool import Client
from kvpool.common.listen_address import bare, family_of, host_port
from kvpool.local_cluster import LocalCluster


def test_addresses_are_written_with_brackets_and_bound_bare():
    assert host_port("::1", 50051) == "[::1]:50051"
    assert host_port("[::]", 7) == "[::]:7"
    assert host_port("10.0.0.1", 7) == "10.0.0.1:7"
    assert host_port("master.svc", 7) == "master.svc:7"
    assert bare("[fd00::2]") == "fd00::2" and bare("node-0") == "node-0"
    assert family_of("::") is socket.AF_INET6 and family_of("0.0.0.0") is socket.AF_INET


def test_a_cluster_on_ipv6_loopback_serves_puts_and_gets(tmp_path):
    with LocalCluster(
        nodes=0, run_dir=tmp_path, same_host=False, master_args=["--host", "::1"]
    ) as cluster:
        cluster.master_address = host_port("::1", cluster.port)
        node = cluster.add_node("64MiB", extra=["--listen", "::1", "--data-advertise", "::1"])
        with urllib.request.urlopen(f"http://[::1]:{node.ready['http_port']}/healthz") as answer:
            assert answer.status == 200
        env = cluster.client_credentials()
        with Client(cluster.master_address, timeout=10, **env) as client:
            data = os.urandom(3 << 20)
            client.put("over-six", data, checksum=True)
            assert client.get("over-six", verify=True) == data
            assert client.mapped_segments == [], "the bytes went over the checked stream"
