"""A client that gives up on a transfer leaves nothing queued towards the node.

The chaos suite (seed 7, round 42) caught a put cut off from its node whose bytes sat in the
client's TCP send queue: the put failed, the master later gave the space to another object,
and when the link healed the queued bytes landed over it. A worker the client gives up on
now has its TCP connections reset, not closed: the kernel drops what they hold.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from kvpool import Client
from kvpool.errors import KVPoolError
from kvpool.transport import connection_reset

TCP_ONLY = {"UCX_TLS": "tcp"}


def _client_sockets_towards(port_peers: set[tuple[str, int]]) -> list[str]:
    """Lines of ``/proc/net/tcp`` for this process's side of connections to ``port_peers``
    that are not yet closed, with their send queues."""
    lines = []
    with open("/proc/net/tcp") as table:
        for row in list(table)[1:]:
            fields = row.split()
            remote, state, queues = fields[2], fields[3], fields[4]
            ip_hex, port_hex = remote.split(":")
            ip = socket.inet_ntoa(bytes.fromhex(ip_hex)[::-1])
            if (ip, int(port_hex, 16)) in port_peers and state != "07":  # 07: CLOSE
                lines.append(f"{state} {queues}")
    return lines


def test_a_worker_given_up_mid_put_is_reset_and_the_node_lives_on(cluster_factory, monkeypatch):
    for name, value in TCP_ONLY.items():
        monkeypatch.setenv(name, value)
    cluster = cluster_factory(1, "128MiB", master_args=["--node-ttl", "60"], env=TCP_ONLY)
    node = cluster.nodes[0]
    payload = b"\xaa" * (32 << 20)
    with Client(cluster.master_address, timeout=1.0, same_host_mapping=False) as client:
        client.put("warm-up", b"w" * 4096)  # (connects the worker to the node)
        lane = client._session.data._lanes[0]
        worker = lane.worker
        found = connection_reset.worker_sockets(worker.efd)
        assert found, "the worker's epoll set leads to its sockets"
        node.signal(signal.SIGSTOP)
        try:
            with pytest.raises(KVPoolError):
                client.put("cut-off", payload)
            assert lane.worker is not worker, "a worker past its deadline is given up"
            for fd in found:
                with socket.socket(fileno=os.dup(fd)) as placeholder, pytest.raises(OSError):
                    placeholder.getpeername()  # (reset: an unconnected placeholder now)
        finally:
            node.signal(signal.SIGCONT)
        time.sleep(0.5)
        assert node.alive(), node.log_tail()
        client.put("after", b"a" * 65536)
        assert client.get("after") == b"a" * 65536
        assert not client.exists("cut-off")
