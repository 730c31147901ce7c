"""A real secure ``kvpool master``'s gRPC port against connections that never call.

Anyone who reaches the port may open a connection: no token is asked before a call. So the
master bounds them (common/grpc_tuning.py): a connection that has not finished its TLS and
HTTP/2 handshakes within the handshake timeout is closed, so is one with no call on it for
the idle time, and past the cap a new one is closed as it comes. Plain TCP connections held
open took the master to its descriptor limit (20,000 in 6 s), after which no new client got
in; TLS connections that said nothing were kept for ever.

The master runs with the bounds lowered (their environment variables), to keep the test
short and light.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
import uuid
from collections.abc import Iterator

import pytest
from helpers import closed_within, wait_until

from kvpool import Client
from kvpool.local_cluster import LocalCluster

CAP = 48
HANDSHAKE_S = 2.0
IDLE_S = 3.0
BOUNDS = {
    "KVPOOL_MASTER_GRPC_MAX_CONNECTIONS": str(CAP),
    "KVPOOL_MASTER_GRPC_HANDSHAKE_TIMEOUT_MS": str(int(HANDSHAKE_S * 1000)),
    "KVPOOL_MASTER_GRPC_IDLE_MS": str(int(IDLE_S * 1000)),
}
#: Descriptors the master may open or close meanwhile for reasons of its own.
SLACK = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    run_dir = tmp_path_factory.mktemp("grpc-connections")
    # (no node: a master rebuilding for the nodes of an earlier run waits --node-ttl for
    # them before it serves clients, so one second, not five)
    with LocalCluster(
        0, "64MiB", run_dir=run_dir, env=BOUNDS, master_args=("--node-ttl", "1")
    ) as cluster:
        with grpc_client(cluster) as client:
            assert not client.exists("nothing"), "the master serves clients"
        yield cluster


def grpc_client(cluster: LocalCluster, timeout: float = 10.0) -> Client:
    """A client whose calls all go over gRPC (no metadata lane)."""
    return Client(cluster.master_address, timeout=timeout, metadata_lane=False)


def address(cluster: LocalCluster) -> tuple[str, int]:
    host, _, port = cluster.master_address.rpartition(":")
    return host, int(port)


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_connection_that_never_starts_tls_is_closed_after_the_handshake_timeout(cluster):
    with socket.create_connection(address(cluster), timeout=5) as silent:
        started = time.monotonic()
        assert closed_within(silent, HANDSHAKE_S + 3), "gRPC's own timeout is two minutes"
        assert time.monotonic() - started >= HANDSHAKE_S / 2, "closed for its silence"


def test_a_connection_that_calls_nothing_is_closed_after_the_idle_time(cluster):
    """Past both handshakes (TLS with the cluster's CA, HTTP/2's preface and settings), a
    connection with no call on it is closed once idle; a client's channel connects again at
    its next call, unseen by the caller."""
    context = ssl.create_default_context(cafile=os.environ["KVPOOL_TLS_CA"])
    context.set_alpn_protocols(["h2"])
    host, port = address(cluster)
    with grpc_client(cluster) as client:
        assert not client.exists(f"idle-{uuid.uuid4().hex[:8]}")
        with context.wrap_socket(
            socket.create_connection((host, port), timeout=5), server_hostname=host
        ) as quiet:
            assert quiet.selected_alpn_protocol() == "h2"
            quiet.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            started = time.monotonic()
            assert closed_within(quiet, IDLE_S + 5), "kept for ever"
            assert time.monotonic() - started >= IDLE_S / 2, "closed as idle"
        assert not client.exists(f"idle-{uuid.uuid4().hex[:8]}"), "its channel connects again"


def test_connections_past_the_cap_are_closed_and_the_master_serves_on(cluster):
    """Three times the cap in plain TCP connections that never start TLS: the master holds
    no more than the cap (its descriptors say so), a client connected before them is
    answered, a new client gets in once the handshake timeout has closed them, and none of
    them is left open."""
    pid = cluster.master.pid
    with grpc_client(cluster) as before:
        assert not before.exists("nothing")  # (its connection is open: counted in the cap)
        baseline = descriptors(pid)
        held = [socket.create_connection(address(cluster), timeout=5) for _ in range(3 * CAP)]
        try:
            assert wait_until(lambda: descriptors(pid) >= baseline + CAP // 2, 5)
            time.sleep(0.3)  # (the master has taken what it takes of them)
            assert descriptors(pid) <= baseline + CAP + SLACK, "connections past the cap kept"
            assert not before.exists("nothing"), "a client connected before is answered"
            started = time.monotonic()
            with grpc_client(cluster, timeout=HANDSHAKE_S + 8) as newcomer:
                assert not newcomer.exists("nothing")
            assert time.monotonic() - started < HANDSHAKE_S + 8
            assert all(closed_within(connection, HANDSHAKE_S + 3) for connection in held)
        finally:
            for connection in held:
                connection.close()
    assert cluster.master.alive()
