"""Prometheus metrics of the master process.

Counters and histograms are updated by the service; gauges are read at scrape time from the
last snapshot the event loop published (the HTTP thread never touches live state).

What a scrape shows stays bounded whatever peers send: a ``method`` label only ever names one
of ``METHODS`` (anything else counts as "other"), and at most ``MAX_SEGMENT_SERIES`` segments
have series of their own (the first to mount; the rest are summed per tier under
``segment="other"``), with longer label values cut to ``MAX_LABEL_CHARS``; at most
``MAX_TENANT_SERIES`` tenants have series of their own (those holding the most bytes; the rest,
and a tenant named "other", are summed under ``tenant="other"``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from kvpool.master.quotas import TenantUsage
from kvpool.master.records import ClusterSnapshot, Counters, SegmentUsage
from kvpool.proto import master_pb2 as pb

#: What a ``method`` label may name: the Master service's calls, and NodeResult (a node's
#: answer to a command). Anything else is counted as ``OTHER``.
METHODS = frozenset(
    [m.name for m in pb.DESCRIPTOR.services_by_name["Master"].methods] + ["NodeResult"]
)
OTHER = "other"
#: Segments exported one by one at most; the others are summed per tier.
MAX_SEGMENT_SERIES = 256
#: Longest segment or node name a label holds (longer ones are cut).
MAX_LABEL_CHARS = 128
#: Tenants exported one by one at most (the largest by bytes held); the others are summed.
MAX_TENANT_SERIES = 64

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
LANE_CLOSED = Counter(
    "kvpool_master_lane_connections_closed_total",
    "Metadata lane connections the master closed: bad_frame (oversized or unparseable), "
    "read_timeout (part of a frame, then silence), slow_frame (a frame trickled in past its "
    "deadline), unread_answers, idle, unauthenticated "
    "(no credentials within the read timeout), over_cap (a new one at the cap, every "
    "connection proven or none unproven for 2 s yet), "
    "evicted and address_cap (one that had proven nothing, for a new one: at the cap, at its "
    "address's cap), identity_cap and client_cap (refused at AUTH: its identity's cap, the "
    "places clients may take), unread_commands (a node's stream).",
    ["reason"],
)
LANE_MEMORY_WAITS = Counter(
    "kvpool_master_lane_request_memory_waits_total",
    "Large lane frames whose reading waited for the lane's request memory "
    "(--lane-request-memory) to be given back by others.",
)
LANE_MEMORY_RESERVED = Gauge(
    "kvpool_master_lane_request_memory_bytes",
    "Bytes of the lane's request memory reserved by large frames being read.",
)
AUTH_REFUSED = Counter(
    "kvpool_master_auth_refused_total",
    "Calls and connections refused for their credentials: missing, bad_token, "
    "bad_certificate (UNAUTHENTICATED); role, other_node (PERMISSION_DENIED).",
    ["reason"],
)
LATENCY = Histogram(
    "kvpool_master_request_seconds",
    "Time the master spent serving an RPC, by method.",
    ["method"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
)
LEADER = Gauge(
    "kvpool_master_leader",
    "1 while this master leads (serves calls: its /readyz answers 200), 0 on a standby; "
    "a master without etcd (the only one) always leads.",
)


#: The metrics whose first label is a method.
_BY_METHOD = (REQUESTS, KEYS, SHED, LANE_REQUESTS, LATENCY)
_SERIES: dict[tuple[Counter | Histogram, tuple[str, ...]], Any] = {}


def labelled(metric: Counter | Histogram, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once: on the hot path a lookup costs a lock and
    a hash of the labels per call. A method outside ``METHODS`` is counted as ``OTHER``."""
    series = _SERIES.get((metric, labels))
    if series is None:
        if metric in _BY_METHOD and labels[0] not in METHODS:
            return metric.labels(OTHER, *labels[1:])  # (not remembered: the table stays small)
        series = _SERIES[metric, labels] = metric.labels(*labels)
    return series


class StateCollector(Collector):
    """Exposes the latest published snapshot and event counters of the metadata core.

    Only a master that leads has them: a standby exports none of these series, whether it
    never led or led once (``clear``), so that a sum over the masters' pods counts the
    cluster once, whichever of them leads."""

    def __init__(self) -> None:
        self.snapshot: ClusterSnapshot | None = None
        self.counters: Counters | None = None
        self.tenants: dict[str, TenantUsage] = {}
        self.refusals: dict[tuple[str, str], int] = {}
        #: When ``tenants`` was last published (time.monotonic()).
        self.tenants_published_at = -math.inf

    def publish(self, snapshot: ClusterSnapshot, counters: Counters) -> None:
        self.snapshot = snapshot
        self.counters = dataclasses.replace(counters)

    def publish_tenants(
        self, usage: dict[str, TenantUsage], refusals: dict[tuple[str, str], int]
    ) -> None:
        """Each tenant's usage (copies) and the keys and calls refused for each of its quotas,
        (tenant, quota) -> count."""
        self.tenants = usage
        self.refusals = refusals

    def clear(self) -> None:
        """Forgets what was published, as the term that published it ends (this master is a
        standby from now on): a scrape shows none of the cluster's series until the next
        term publishes, at its first tick (its tenants' usage too).

        The state's counters (``kvpool_*_total``) go as well, not only the gauges: they count
        the events of one term (the next term's core counts from zero), so a standby would
        export a count frozen at its last term's end, summed with the leader's by any query
        over the pods; and a standby that never led exports none. Prometheus takes the
        counters' disappearance and their return from zero as a reset (``rate`` and
        ``increase`` are right across it)."""
        self.snapshot = None
        self.counters = None
        self.tenants = {}
        self.refusals = {}
        self.tenants_published_at = -math.inf

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        # (read once: ``clear`` may run on the event loop while the HTTP thread scrapes)
        snapshot, counters = self.snapshot, self.counters
        tenants, refusals = self.tenants, self.refusals
        if snapshot is None or counters is None:
            return
        yield GaugeMetricFamily("kvpool_objects", "Published objects.", value=snapshot.objects)
        yield GaugeMetricFamily(
            "kvpool_reservations",
            "Objects reserved and being written.",
            value=snapshot.reservations,
        )
        yield GaugeMetricFamily("kvpool_nodes", "Live storage nodes.", value=snapshot.nodes)
        yield GaugeMetricFamily(
            "kvpool_segments", "Mounted segments.", value=len(snapshot.segments)
        )
        yield GaugeMetricFamily(
            "kvpool_under_replicated_objects",
            "Published objects on fewer live nodes (not draining) than they should be: "
            "re-replication's work left (those no node has room for stay counted).",
            value=snapshot.under_replicated,
        )
        yield GaugeMetricFamily(
            "kvpool_replica_copies_in_flight",
            "Copies between nodes under way (re-replication and drains).",
            value=snapshot.copies_in_flight,
        )
        yield GaugeMetricFamily(
            "kvpool_draining_nodes", "Storage nodes draining.", value=snapshot.draining_nodes
        )
        yield GaugeMetricFamily(
            "kvpool_silent_nodes",
            "Storage nodes that left a command unanswered past its wait lately (a hung disk?): "
            "they get new objects only when no other node has room.",
            value=snapshot.silent_nodes,
        )
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
        for values, (capacity_bytes, used_bytes, count) in _segment_series(snapshot.segments):
            capacity.add_metric(values, capacity_bytes)
            used.add_metric(values, used_bytes)
            objects.add_metric(values, count)
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
            (
                "evictions_for_table",
                "Of those, evicted because the master held --max-objects, not for space: "
                "raise the master's memory and --max-objects if storage has room.",
            ),
            ("demotions", "Replicas moved from DRAM to NVMe on their node instead of evicted."),
            ("promotions", "Objects copied from NVMe to DRAM on their node after a hit."),
            ("objects_adopted", "Replicas re-adopted from what storage nodes reported."),
            ("lease_expiries", "Read leases that ended: ran out, or were released."),
            ("replicas_copied", "Replicas copied between nodes (re-replication, drains)."),
            ("bytes_copied", "Bytes copied between nodes (re-replication, drains)."),
            ("replicas_trimmed", "Surplus replicas dropped (their node came back)."),
            (
                "replicas_unreadable",
                "Replicas dropped because their node's disk could not read them.",
            ),
        ):
            yield CounterMetricFamily(f"kvpool_{name}", help_text, value=getattr(counters, name))
        yield from _tenant_families(tenants, refusals)


def _tenant_families(
    tenants: dict[str, TenantUsage], refusals: dict[tuple[str, str], int]
) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Per tenant: usage gauges and refusals by quota, for the ``MAX_TENANT_SERIES`` tenants
    holding the most bytes, the rest summed under ``tenant="other"``."""
    held = {t: u.total_bytes for t, u in tenants.items()}
    known = (set(tenants) | {t for t, _ in refusals}) - {OTHER}
    largest = sorted(known, key=lambda t: (-held.get(t, 0), t))
    named = set(largest[:MAX_TENANT_SERIES])
    rows: dict[str, TenantUsage] = {}
    for tenant, usage in tenants.items():
        label = tenant if tenant in named else OTHER
        row = rows.setdefault(label, TenantUsage())
        for f in dataclasses.fields(TenantUsage):
            setattr(row, f.name, getattr(row, f.name) + getattr(usage, f.name))
    objects = GaugeMetricFamily(
        "kvpool_tenant_objects", "Live objects of each tenant (any state).", labels=["tenant"]
    )
    stored = GaugeMetricFamily(
        "kvpool_tenant_bytes",
        "Bytes each tenant's replicas (and copies in flight) take, by tier.",
        labels=["tenant", "tier"],
    )
    reserved = GaugeMetricFamily(
        "kvpool_tenant_reserved_bytes",
        "Bytes of each tenant's puts reserved and not yet committed.",
        labels=["tenant"],
    )
    leases = GaugeMetricFamily(
        "kvpool_tenant_leases", "Objects of each tenant under a read lease.", labels=["tenant"]
    )
    for label, row in sorted(rows.items()):
        objects.add_metric([label], row.objects)
        stored.add_metric([label, "dram"], row.dram_bytes)
        stored.add_metric([label, "nvme"], row.nvme_bytes)
        reserved.add_metric([label], row.reserved_bytes)
        leases.add_metric([label], row.leases)
    yield objects
    yield stored
    yield reserved
    yield leases
    refused = CounterMetricFamily(
        "kvpool_tenant_quota_refusals",
        "Keys (puts, leases) and calls (inflight) refused for a tenant's quota, by quota.",
        labels=["tenant", "quota"],
    )
    totals: dict[tuple[str, str], int] = {}
    for (tenant, quota), count in refusals.items():
        key = (tenant if tenant in named else OTHER, quota)
        totals[key] = totals.get(key, 0) + count
    for (label, quota), count in sorted(totals.items()):
        refused.add_metric([label, quota], count)
    yield refused


def _segment_series(
    segments: list[SegmentUsage],
) -> Iterator[tuple[list[str], tuple[int, int, int]]]:
    """(segment, node, tier) labels and (capacity, used, objects) of each of the first
    ``MAX_SEGMENT_SERIES`` segments, then one sum per tier of the rest (and of any whose
    labels would repeat others': a family with a series twice fails the whole scrape)."""
    others: dict[str, list[int]] = {}
    taken = {(OTHER, OTHER)}
    for s in segments:
        tier = s.info.tier.name.lower()
        names = (_label(s.info.segment_id), _label(s.info.node_id))
        if len(taken) <= MAX_SEGMENT_SERIES and names not in taken:
            taken.add(names)
            yield [*names, tier], (s.capacity, s.used, s.objects)
        else:
            total = others.setdefault(tier, [0, 0, 0])
            total[0] += s.capacity
            total[1] += s.used
            total[2] += s.objects
    for tier, (capacity, used, count) in others.items():
        yield [OTHER, OTHER, tier], (capacity, used, count)


def _label(name: str) -> str:
    """``name``, or where it is longer than MAX_LABEL_CHARS its start and a digest of it (two
    long names that start alike stay two series)."""
    if len(name) <= MAX_LABEL_CHARS:
        return name
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{name[: MAX_LABEL_CHARS - len(digest) - 3]}...{digest}"


STATE = StateCollector()
REGISTRY.register(STATE)
