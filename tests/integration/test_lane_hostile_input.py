"""A real ``kvpool master``'s metadata lane against what issue 18 sent it from one connection:
a header announcing 255 MiB, then a body. The master closes the connection at the header,
holds none of the body, and goes on serving. (Sent before any credentials, on a TLS
connection: what anyone who reaches the port can send.)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from helpers import lane_socket, metric

from kvpool import Client
from kvpool.common import lane_protocol as lp


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_header_announcing_255_mib_is_refused_before_its_body(cluster_factory):
    cluster = cluster_factory(0)
    resident = resident_bytes(cluster.master.pid)
    sock = lane_socket(cluster.lane_port)
    with contextlib.suppress(OSError):  # (closed while the body was still going)
        sock.sendall(lp.HEADER.pack(255 << 20, 1, lp.METHOD_IDS["PutStart"], lp.OK))
        for _ in range(64):
            sock.sendall(bytes(1 << 20))
    sock.settimeout(5)
    with contextlib.suppress(ConnectionError):
        assert sock.recv(1) == b"", "closed"

    assert resident_bytes(cluster.master.pid) - resident < 16 << 20, "the body was kept"
    closed = 'kvpool_master_lane_connections_closed_total{reason="bad_frame"}'
    assert metric(cluster.master_http_port, closed) == 1
    with Client(cluster.master_address) as client:
        assert client.exists_many(["k"]) == [False], "still serving"
