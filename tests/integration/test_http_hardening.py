"""The HTTP side door (common/http_server.py) holds what idle or slow peers open to a bound:
idle connections cost no thread and are closed after the request timeout, probes are
answered meanwhile, and beyond the connection cap a new connection is closed at once.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import closed_within, wait_until
from prometheus_client import CollectorRegistry

from kvpool.common.http_server import HealthServer


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def idle_connections(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


@pytest.fixture
def server() -> Iterator[HealthServer]:
    started = HealthServer("127.0.0.1", 0, lambda: (True, ""), timeout=0.5)
    started.start()
    yield started
    started.stop()


def test_idle_connections_cost_no_thread_and_are_closed_after_the_timeout(server):
    threads = set(threading.enumerate())
    peers = idle_connections(server.port, 300)
    opened = time.monotonic()
    assert get(server.port, "/healthz") == (200, b"ok\n"), "answered beside 300 idle ones"
    # (threads of earlier tests in this worker may end meanwhile: only new ones count)
    assert set(threading.enumerate()) - threads == set(), "a thread per idle connection"
    assert all(closed_within(peer, 5) for peer in peers)
    assert time.monotonic() - opened >= 0.5
    assert wait_until(lambda: server.open_connections == 0, 5)


def test_a_request_sent_too_slowly_is_cut_off_at_the_timeout(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    started = time.monotonic()
    with contextlib.suppress(OSError):  # (cut off while still sending)
        for piece in b"GET /healthz HTTP/1.1\r\nUser-Agent: a-byte-every-tenth-of-a-second\r\n":
            sock.sendall(bytes([piece]))
            time.sleep(0.1)
    assert closed_within(sock, 5)
    assert time.monotonic() - started < 3, "kept for as long as the peer kept sending"


def test_connections_beyond_the_cap_are_closed_at_once():
    server = HealthServer("127.0.0.1", 0, lambda: (True, ""), timeout=30, max_connections=5)
    server.start()
    try:
        peers = idle_connections(server.port, 5)
        assert wait_until(lambda: server.open_connections == 5, 5)
        assert closed_within(socket.create_connection(("127.0.0.1", server.port)), 2)
        peers.pop().close()
        assert wait_until(lambda: server.open_connections == 4, 5)
        assert get(server.port, "/healthz") == (200, b"ok\n")
    finally:
        server.stop()


def test_requests_that_are_not_a_probe_get_a_precise_answer(server):
    assert get(server.port, "/readyz") == (200, b"ready\n")
    assert get(server.port, "/nope")[0] == 404
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert sock.recv(1 << 16).startswith(b"HTTP/1.1 405 ")
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(b"GET /" + b"x" * 20000)  # a head longer than any probe's
    assert sock.recv(1 << 16).startswith(b"HTTP/1.1 431 ")


def test_a_master_serves_300_idle_connections_without_300_threads(cluster_factory):
    cluster = cluster_factory(0)
    pid, port = cluster.master.pid, cluster.master_http_port
    threads = threads_of(pid)
    peers = idle_connections(port, 300)
    assert get(port, "/healthz") == (200, b"ok\n")
    assert threads_of(pid) <= threads + 2, "a thread per connection"
    assert all(closed_within(peer, 15) for peer in peers), "closed after the request timeout"


class SizedMetrics:
    """A collector whose /metrics body is about ``size`` bytes (set between requests)."""

    def __init__(self) -> None:
        self.size = 0

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily("padding", "x" * self.size, value=0.0)  # (in its help text)


def server_sockets(port: int) -> int:
    """This process's TCP sockets on the server's side of ``port``, still established."""
    wanted = f":{port:04X}"
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[1].endswith(wanted) and fields[3] == "01":  # local port, ESTABLISHED
                    count += 1
    return count


def test_an_answer_left_unread_does_not_keep_its_socket_open_past_the_timeout():
    """(A close waits until what is still buffered has gone: with the answer unread it never
    ended, and the server no longer counted the socket against its cap.) Answers of many
    sizes, so that some end just within what the kernel and the transport take."""
    metrics = SizedMetrics()
    registry = CollectorRegistry()
    registry.register(metrics)
    server = HealthServer("127.0.0.1", 0, lambda: (True, ""), registry, timeout=0.5)
    server.start()
    peers = []
    try:
        for size in range(200_000, 4_000_000, 20_000):
            metrics.size = size
            peer = socket.create_connection(("127.0.0.1", server.port))
            peer.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            peers.append(peer)  # and never read
            time.sleep(0.02)
        assert wait_until(lambda: server_sockets(server.port) == 0, 10), (
            f"{server_sockets(server.port)} of {len(peers)} still open on the server's side"
        )
        assert server.open_connections == 0
    finally:
        for peer in peers:
            peer.close()
        server.stop()
