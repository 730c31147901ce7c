"""Prometheus metrics of the master process.

Counters and histograms are updated by the service; gauges are read at scrape time from the
last snapshot the event loop published (the HTTP thread never touches live state).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from kvpool.master.records import ClusterSnapshot, Counters

REQUESTS = Counter(
    "kvpool_master_requests_total", "RPCs served by the master, by method.", ["method"]
)
KEYS = Counter(
    "kvpool_master_keys_total",
    "Per-key outcomes of batch RPCs, by method and status.",
    ["method", "status"],
)
SHED = Counter(
    "kvpool_master_shed_total",
    "Calls refused with RESOURCE_EXHAUSTED because the master was saturated, by method.",
    ["method"],
)
LANE_REQUESTS = Counter(
    "kvpool_master_lane_requests_total",
    "Client calls that came over the metadata lane rather than gRPC, by method.",
    ["method"],
)
LANE_SESSIONS = Counter(
    "kvpool_master_lane_node_sessions_total",
    "Storage nodes' command streams opened over the metadata lane rather than gRPC.",
)
LATENCY = Histogram(
    "kvpool_master_request_seconds",
    "Time the master spent serving an RPC, by method.",
    ["method"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
)


@functools.cache
def labelled(metric: Counter | Histogram, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once: on the hot path a lookup costs a lock and
    a hash of the labels per call."""
    return metric.labels(*labels)


class StateCollector(Collector):
    """Exposes the latest published snapshot and event counters of the metadata core."""

    def __init__(self) -> None:
        self.snapshot: ClusterSnapshot | None = None
        self.counters: Counters | None = None

    def publish(self, snapshot: ClusterSnapshot, counters: Counters) -> None:
        self.snapshot = snapshot
        self.counters = dataclasses.replace(counters)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snapshot, counters = self.snapshot, self.counters
        if snapshot is None or counters is None:
            return
        yield GaugeMetricFamily("kvpool_objects", "Published objects.", value=snapshot.objects)
        yield GaugeMetricFamily(
            "kvpool_reservations",
            "Objects reserved and being written.",
            value=snapshot.reservations,
        )
        yield GaugeMetricFamily("kvpool_nodes", "Live storage nodes.", value=snapshot.nodes)
        labels = ["segment", "node", "tier"]
        capacity = GaugeMetricFamily(
            "kvpool_segment_capacity_bytes", "Capacity of each mounted segment.", labels=labels
        )
        used = GaugeMetricFamily(
            "kvpool_segment_used_bytes", "Allocated bytes in each segment.", labels=labels
        )
        objects = GaugeMetricFamily(
            "kvpool_segment_objects", "Replicas stored in each segment.", labels=labels
        )
        for s in snapshot.segments:
            values = [s.info.segment_id, s.info.node_id, s.info.tier.name.lower()]
            capacity.add_metric(values, s.capacity)
            used.add_metric(values, s.used)
            objects.add_metric(values, s.objects)
        yield capacity
        yield used
        yield objects
        for name, help_text in (
            ("hits", "GetReplicas lookups that found a published object."),
            ("misses", "GetReplicas lookups that found nothing readable."),
            ("puts_started", "Reservations granted."),
            ("puts_published", "Objects published."),
            ("puts_revoked", "Reservations revoked by their writer."),
            ("reservations_reclaimed", "Reservations reclaimed after their timeout."),
            ("objects_removed", "Objects removed by clients."),
            ("objects_lost", "Objects dropped because their last replica was lost."),
            ("nodes_died", "Storage nodes declared dead after missing heartbeats."),
            ("clients_died", "Clients declared dead (their reservations were revoked)."),
            ("evictions", "Objects evicted to make room (LRU)."),
            ("demotions", "Replicas moved from DRAM to NVMe on their node instead of evicted."),
            ("promotions", "Objects copied from NVMe to DRAM on their node after a hit."),
            ("objects_adopted", "Replicas re-adopted from what storage nodes reported."),
            ("lease_expiries", "Read leases that ran out."),
        ):
            yield CounterMetricFamily(f"kvpool_{name}", help_text, value=getattr(counters, name))


STATE = StateCollector()
REGISTRY.register(STATE)
