"""Prometheus metrics of a storage node process."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

SEGMENT_BYTES = Gauge(
    "kvpool_node_segment_bytes", "Size of each segment this node exposes.", ["segment", "tier"]
)
MOUNTED = Gauge(
    "kvpool_node_segments_mounted", "Segments the master currently knows about from this node."
)
HEARTBEATS = Counter("kvpool_node_heartbeats_total", "Heartbeats the master answered.")
HEARTBEAT_FAILURES = Counter(
    "kvpool_node_heartbeat_failures_total", "Heartbeats or mounts that failed or timed out."
)
