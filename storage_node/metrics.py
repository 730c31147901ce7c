"""Prometheus metrics of a storage node process: what it holds and the work it does.

A node sees the master's commands (record, forget, prepare, copy), its own disk syncs and its
copies between tiers. Clients' transfers it sees only where they pass through it: the
checked stream counts its own (storage_node/checked_server.py), and the bytes of those it
writes into NVMe past the page cache are counted here; transfers over one-sided UCX
operations or a same-host mapping complete without the node's CPU and leave no trace but
the record of their put (Persist). Payload bytes the node moves itself (a Copy between its
tiers) are counted.

Labels stay bounded: ``segment`` takes this node's own segment ids (a handful), ``kind``,
``outcome``, ``target`` and ``direction`` a few fixed words.

Counters and histograms are updated where the work is done (on the event loop, or on the
worker thread that runs a slow command). The holdings gauges are read at scrape time from a
snapshot the event loop publishes when a scrape asks: the HTTP thread never walks an index
that commands change meanwhile, and a node nobody scrapes never walks one either.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from kvpool.common.status import Tier

if TYPE_CHECKING:
    from kvpool.storage_node.object_index import Entry
    from kvpool.storage_node.segment import Segment

DIRECT_WRITE_BYTES = Counter(
    "kvpool_node_direct_write_bytes_total",
    "Bytes of checked-stream writes into NVMe segments that went past the page cache.",
)
DIRECT_READ_BYTES = Counter(
    "kvpool_node_direct_read_bytes_total",
    "Bytes of checked-stream reads of NVMe segments read past the page cache (not cached).",
)
DISK_ERRORS = Counter(
    "kvpool_node_disk_errors_total",
    "Checked-stream transfers that failed on an NVMe segment's disk (an I/O error, or a full "
    "disk under a sparse segment), by operation; each is answered DISK_ERROR.",
    ["op"],
)
for _op in ("read", "write"):
    DISK_ERRORS.labels(_op)  # (exported from the start, at 0)
STALE_RECORDS = Counter(
    "kvpool_node_stale_records_total",
    "Objects a Persist or copy asked to record that were not: the segment holds a newer "
    "generation of their key (a command sent before the node's last remount, carried out "
    "after it).",
)
RECORD_CHECKSUMS = Counter(
    "kvpool_node_record_checksums_total",
    "Checksums of objects recorded on persistent segments, by source (parts: combined from "
    "those of the parts written directly; writer: the put's own, for a file its client on "
    "this host wrote itself; bytes: read from the object's bytes).",
    ["source"],
)
for _source in ("parts", "writer", "bytes"):
    RECORD_CHECKSUMS.labels(_source)  # (exported from the start, at 0)
SEGMENT_BYTES = Gauge(
    "kvpool_node_segment_bytes", "Size of each segment this node exposes.", ["segment", "tier"]
)
MOUNTED = Gauge(
    "kvpool_node_segments_mounted", "Segments the master currently knows about from this node."
)
CLOCK_OFFSET = Gauge(
    "kvpool_node_clock_offset_seconds",
    "This node's wall clock minus the master's, estimated at each heartbeat (capabilities "
    "are checked against this node's clock: keep it within their allowed skew); NaN until "
    "a master answered one.",
)
CLOCK_OFFSET.set(float("nan"))
SEALS = Gauge(
    "kvpool_node_seals",
    "Places in this node's segments whose forgotten objects' grants the checked stream still "
    "refuses (one entry each, kept until the master says those grants end, at most 30 min).",
)
HEARTBEATS = Counter("kvpool_node_heartbeats_total", "Heartbeats the master answered.")
HEARTBEAT_FAILURES = Counter(
    "kvpool_node_heartbeat_failures_total", "Heartbeats or mounts that failed or timed out."
)

#: The command kinds of NodeCommand; anything else is counted as "unknown".
INDEX_COMPACTIONS = Counter(
    "kvpool_node_index_compactions_total",
    "Index logs of persistent segments rewritten with their live entries alone while the "
    "node ran (storage_node/object_index.py).",
)
COMMAND_KINDS = ("persist", "forget", "prepare", "copy")
COMMANDS = Counter(
    "kvpool_node_commands_total",
    "Master's commands this node carried out, by kind (persist, forget, prepare, copy) and "
    "outcome (ok, failed).",
    ["kind", "outcome"],
)
COMMAND_SECONDS = Histogram(
    "kvpool_node_command_seconds",
    "Time this node spent carrying out a master's command, by kind (not counting a wait "
    "behind the command before it).",
    ["kind"],
    buckets=(
        0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
        0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    ),
)  # fmt: skip
PERSISTED_OBJECTS = Counter(
    "kvpool_node_persisted_objects_total",
    "Objects recorded by Persist, by segment and tier: one per committed put of a replica "
    "here (or more, if the master sends a Persist again after a broken stream); copies "
    "between tiers are counted in kvpool_node_copies_total.",
    ["segment", "tier"],
)
PERSISTED_BYTES = Counter(
    "kvpool_node_persisted_bytes_total",
    "Bytes of the objects recorded by Persist, by segment and tier: what clients' committed "
    "puts wrote here (on NVMe and /dev/shm segments the node checksums them, and syncs them "
    "on NVMe). Clients write and read with one-sided UCX operations the node does not see: "
    "writes show here once recorded; revoked writes and all reads never do.",
    ["segment", "tier"],
)
SYNC_SECONDS = Histogram(
    "kvpool_node_sync_seconds",
    "Waits for the disk on persistent segments, by segment and target: data (an msync of a "
    "run of NVMe objects being recorded) or index (an append to the segment's durable index, "
    "which fdatasyncs); _count counts the syncs.",
    ["segment", "target"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
)
COPIES = Counter(
    "kvpool_node_copies_total",
    "Objects copied between this node's segments by the master's Copy command, by direction: "
    "demotion (DRAM to NVMe, instead of an eviction), promotion (NVMe to DRAM, after a hit) "
    "or same_tier.",
    ["direction"],
)
COPIED_BYTES = Counter(
    "kvpool_node_copied_bytes_total",
    "Bytes this node copied between its segments (Copy commands), by direction: demotion, "
    "promotion or same_tier. The only payload bytes a node moves itself.",
    ["direction"],
)


@functools.cache
def labelled(metric: Counter | Histogram, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once: commands are on every put's path, and a
    lookup costs a lock and a hash of the labels per call."""
    return metric.labels(*labels)


def command_kind(kind: str | None) -> str:
    """The ``kind`` label of a command (a fixed word, whatever arrives)."""
    return kind if kind in COMMAND_KINDS else "unknown"


def command_done(kind: str, ok: bool, seconds: float) -> None:
    labelled(COMMANDS, kind, "ok" if ok else "failed").inc()
    labelled(COMMAND_SECONDS, kind).observe(seconds)


def persisted(segment: Segment, entries: Iterable[Entry]) -> None:
    sizes = [entry.size for entry in entries]
    tier = tier_label(segment.tier)
    labelled(PERSISTED_OBJECTS, segment.segment_id, tier).inc(len(sizes))
    labelled(PERSISTED_BYTES, segment.segment_id, tier).inc(sum(sizes))


def synced(segment: Segment, target: str, seconds: float) -> None:
    labelled(SYNC_SECONDS, segment.segment_id, target).observe(seconds)


def copied(source: Tier, target: Tier, size: int) -> None:
    if (source, target) == (Tier.DRAM, Tier.NVME):
        direction = "demotion"
    elif (source, target) == (Tier.NVME, Tier.DRAM):
        direction = "promotion"
    else:
        direction = "same_tier"
    labelled(COPIES, direction).inc()
    labelled(COPIED_BYTES, direction).inc(size)


def tier_label(tier: Tier) -> str:
    return tier.name.lower()


#: How long a scrape waits for the event loop to count what changed; past it, the scrape
#: serves the last count (a busy loop must not hold a scrape up).
PUBLISH_WAIT = 1.0


@dataclass(frozen=True)
class Holding:
    """What one segment held when the event loop last counted it."""

    segment: str
    tier: str
    objects: int
    bytes: int
    #: Persistent segments: bytes of the index log (records and zeros written ahead end
    #: there), and bytes free to the node on the file system that holds the segment's files.
    index_log_bytes: int | None = None
    disk_free_bytes: int | None = None


class HoldingsCollector(Collector):
    """Objects and bytes each segment of this node holds.

    Counting walks a segment's index (one pass over its objects), so it runs only when a
    scrape asks, on the event loop, and only for segments that changed since the last count
    (``Segment.changes``).
    """

    def __init__(self) -> None:
        self.holdings: tuple[Holding, ...] = ()
        self._source: tuple[asyncio.AbstractEventLoop, Sequence[Segment]] | None = None
        self._counted: dict[str, tuple[int, Holding]] = {}  # on the event loop only

    def watch(self, segments: Sequence[Segment], loop: asyncio.AbstractEventLoop) -> None:
        """Counts ``segments`` on ``loop`` from now on (called on that loop)."""
        self._source = (loop, segments)
        self._counted.clear()
        self.publish()

    def stop_watching(self) -> None:
        """The segments are being closed: scrapes serve the last count from now on."""
        self._source = None

    def publish(self) -> None:
        """On the event loop: counts the segments that changed, publishes all."""
        source = self._source
        if source is None:
            return
        holdings = []
        for segment in source[1]:
            # Read the change count before the index: a change that lands in between is
            # counted now and again next time, never missed (changes follow the index).
            changes = segment.changes
            known = self._counted.get(segment.segment_id)
            if known is None or known[0] != changes:
                entries = segment.index.entries()
                holding = Holding(
                    segment.segment_id,
                    tier_label(segment.tier),
                    len(entries),
                    sum(entry.size for entry in entries),
                )
                known = self._counted[segment.segment_id] = (changes, holding)
            holdings.append(_with_disk(known[1], segment))
        self.holdings = tuple(holdings)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self._refresh()
        labels = ["segment", "tier"]
        objects = GaugeMetricFamily(
            "kvpool_node_objects",
            "Objects recorded in each segment of this node (what it reports when it mounts).",
            labels=labels,
        )
        stored = GaugeMetricFamily(
            "kvpool_node_object_bytes",
            "Bytes of the objects recorded in each segment of this node.",
            labels=labels,
        )
        index_log = GaugeMetricFamily(
            "kvpool_node_index_log_bytes",
            "Bytes of each persistent segment's index log (compacted as it grows: "
            'docs/reliability.md, "A full disk").',
            labels=labels,
        )
        disk_free = GaugeMetricFamily(
            "kvpool_node_disk_free_bytes",
            "Bytes free to the node on the file system of each persistent segment. An NVMe "
            "segment's data blocks are all allocated at start; its index log needs some.",
            labels=labels,
        )
        for holding in self.holdings:
            where = [holding.segment, holding.tier]
            objects.add_metric(where, holding.objects)
            stored.add_metric(where, holding.bytes)
            if holding.index_log_bytes is not None:
                index_log.add_metric(where, holding.index_log_bytes)
            if holding.disk_free_bytes is not None:
                disk_free.add_metric(where, holding.disk_free_bytes)
        yield objects
        yield stored
        yield index_log
        yield disk_free

    def _refresh(self) -> None:
        """Has the event loop publish a fresh count, waiting ``PUBLISH_WAIT`` at most."""
        source = self._source
        if source is None:
            return
        loop = source[0]
        try:
            on_the_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_the_loop = False
        if on_the_loop:
            self.publish()
            return
        done = threading.Event()

        def publish() -> None:
            try:
                self.publish()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(publish)
        except RuntimeError:  # the loop is closed: the node has stopped
            return
        done.wait(PUBLISH_WAIT)


def _with_disk(holding: Holding, segment: Segment) -> Holding:
    """``holding`` with its segment's index log and file system as they are now."""
    if not segment.persistent or segment.path is None:
        return holding
    try:
        stat = os.statvfs(segment.path.parent)
    except OSError:  # (the file system went away: the node's own errors say more)
        return holding
    return Holding(
        holding.segment,
        holding.tier,
        holding.objects,
        holding.bytes,
        getattr(segment.index, "log_bytes", None),
        stat.f_bavail * stat.f_frsize,
    )


HOLDINGS = HoldingsCollector()
REGISTRY.register(HOLDINGS)
