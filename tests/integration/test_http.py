"""Every process answers /healthz, /readyz and /metrics."""

from __future__ import annotations

import urllib.request

from kvpool import Client


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_master_and_nodes_serve_health_readiness_and_metrics(shared_cluster):
    with Client(shared_cluster.master_address) as client:
        client.put("metered", b"x" * 1000)
        client.get("metered")
        client.exists("not-there")
    master_port = shared_cluster.master_http_port
    assert fetch(master_port, "/healthz") == (200, "ok\n")
    assert fetch(master_port, "/readyz")[0] == 200
    status, metrics = fetch(master_port, "/metrics")
    assert status == 200
    for name in (
        "kvpool_objects ",
        'kvpool_segment_capacity_bytes{node="node0"',
        "kvpool_segment_used_bytes{",
        'kvpool_master_requests_total{method="PutStart"}',
        'kvpool_master_keys_total{method="Exists",status="not_found"}',
        'kvpool_master_request_seconds_bucket{le="0.001",method="GetReplicas"}',
        "kvpool_hits_total",
    ):
        assert name in metrics, name
    for node in shared_cluster.nodes:
        port = node.ready["http_port"]
        assert fetch(port, "/healthz") == (200, "ok\n")
        assert fetch(port, "/readyz") == (200, "1 segment(s) mounted\n")
        status, metrics = fetch(port, "/metrics")
        assert "kvpool_node_heartbeats_total" in metrics
        assert "kvpool_node_segments_mounted 1.0" in metrics
    assert fetch(master_port, "/nope")[0] == 404
