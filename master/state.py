"""The master's metadata core: a synchronous state machine with an injected clock.

No gRPC, threads, sleeps or wall-clock reads live here: each public method is one event (a
node mounts a segment, a client starts a put, time passes), applies the rules of the object
life cycle and returns its result as plain data. The gRPC service in ``service.py`` is a thin
adapter around it. This is what lets the tests drive every rule deterministically with a fake
clock.

Life cycle of an object::

    put_start ──> RESERVED ──put_end──> PUBLISHED ──remove / node loss──> gone
                     │ put_revoke, reservation timeout, all replicas lost
                     v
                    gone (space freed, or quarantined when a writer may still be copying)

Space is never reused while a reader may still be copying out of it (lease) or a writer that
lost its reservation may still be copying into it (reclaim delay): such buffers wait in
``_deferred`` until their release time.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from sortedcontainers import SortedList

from kvpool.common.keys import key_problem
from kvpool.common.sizes import format_size
from kvpool.common.status import KeyStatus
from kvpool.master.allocator import Allocator
from kvpool.master.config import MasterConfig
from kvpool.master.records import (
    ClusterSnapshot,
    Commit,
    Counters,
    KeyPage,
    Location,
    NodeRecord,
    ObjectRecord,
    ObjectState,
    PlacedReplica,
    PutSlot,
    Replica,
    SegmentInfo,
    SegmentRecord,
    SegmentUsage,
    TickReport,
)

Clock = Callable[[], float]


class MasterState:
    def __init__(
        self, config: MasterConfig | None = None, *, clock: Clock, rng: random.Random | None = None
    ) -> None:
        self.config = config or MasterConfig()
        self.clock = clock
        self.rng = rng or random.Random()
        self.nodes: dict[str, NodeRecord] = {}
        self.segments: dict[str, SegmentRecord] = {}
        self.objects: dict[str, ObjectRecord] = {}
        self.counters = Counters()
        self._published_keys: SortedList = SortedList()
        #: Reservations by creation time (oldest first): timeouts pop from the front.
        self._reservations: OrderedDict[str, ObjectRecord] = OrderedDict()
        #: (release_at, seq, segment, offset): buffers waiting to be freed. The record itself,
        #: not its id, so that a buffer of a dropped and remounted segment is never freed twice.
        self._deferred: list[tuple[float, int, SegmentRecord, int]] = []
        self._seq = itertools.count()
        self._put_ids = itertools.count(1)

    # ------------------------------------------------------------------ node side

    def mount_segment(self, info: SegmentInfo) -> None:
        """A node offers a segment. Mounting the same segment again is a no-op; a changed
        segment under a known id replaces the old one (whose objects are dropped)."""
        now = self.clock()
        node = self.nodes.get(info.node_id)
        if node is None:
            node = self.nodes[info.node_id] = NodeRecord(info.node_id, info.host, now)
        node.last_seen = now
        existing = self.segments.get(info.segment_id)
        if existing is not None:
            if existing.info == info:
                return
            self._drop_segment(existing.segment_id)
        self.segments[info.segment_id] = SegmentRecord(
            info, Allocator(info.size, self.config.alignment)
        )
        node.segment_ids.add(info.segment_id)

    def unmount_segment(self, node_id: str, segment_id: str) -> int:
        """A node withdraws a segment; returns how many objects lost their last replica."""
        segment = self.segments.get(segment_id)
        if segment is None or segment.node_id != node_id:
            return 0
        lost = self._drop_segment(segment_id)
        node = self.nodes.get(node_id)
        if node is not None and not node.segment_ids:
            del self.nodes[node_id]
        return lost

    def heartbeat(self, node_id: str, segment_ids: Iterable[str]) -> list[str]:
        """Records that a node is alive; returns the segments it must mount again."""
        node = self.nodes.get(node_id)
        if node is not None:
            node.last_seen = self.clock()
        known = node.segment_ids if node is not None else set()
        return [s for s in segment_ids if s not in known]

    # ------------------------------------------------------------------ client side

    def put_start(
        self, client_id: str, keys: Sequence[str], sizes: Sequence[int], replicas: int = 0
    ) -> list[PutSlot]:
        """Reserves one buffer per replica, on distinct nodes, for each key."""
        wanted = replicas or self.config.default_replicas
        if not 1 <= wanted <= self.config.max_replicas:
            message = f"replicas must be between 1 and {self.config.max_replicas}, got {wanted}"
            return [PutSlot(KeyStatus.INVALID_ARGUMENT, message=message) for _ in keys]
        now = self.clock()
        slots = []
        for key, size in zip(keys, sizes, strict=True):
            slots.append(self._put_start_one(client_id, key, size, wanted, now))
        return slots

    def put_end(self, commits: Sequence[Commit]) -> list[KeyStatus]:
        """Commits writes: publishes each object whose writer completed at least one replica."""
        return [self._put_end_one(commit) for commit in commits]

    def put_revoke(self, keys: Sequence[str], put_ids: Sequence[int]) -> list[KeyStatus]:
        """A writer gives up its reservations; their space returns at once (it stopped writing)."""
        statuses = []
        for key, put_id in zip(keys, put_ids, strict=True):
            record = self.objects.get(key)
            if (
                record is None
                or record.put_id != put_id
                or record.state is not ObjectState.RESERVED
            ):
                statuses.append(KeyStatus.STALE_PUT)
                continue
            self._forget(record)
            self._free_now(record.replicas)
            self.counters.puts_revoked += 1
            statuses.append(KeyStatus.OK)
        return statuses

    def get_replicas(
        self, keys: Sequence[str], lease_ttl: float = 0.0
    ) -> tuple[list[Location], float]:
        """Where each published object lives; grants (or extends) a read lease on each."""
        ttl = self._lease_ttl(lease_ttl)
        lease_until = self.clock() + ttl
        locations = []
        for key in keys:
            record = self.objects.get(key)
            if record is None or record.state is not ObjectState.PUBLISHED:
                self.counters.misses += 1
                status = KeyStatus.NOT_FOUND if record is None else KeyStatus.NOT_READY
                locations.append(Location(status))
                continue
            self.counters.hits += 1
            record.lease_until = max(record.lease_until, lease_until)
            locations.append(Location(KeyStatus.OK, record.size, self._placed(record)))
        return locations, ttl

    def exists(self, keys: Sequence[str]) -> list[KeyStatus]:
        statuses = []
        for key in keys:
            record = self.objects.get(key)
            if record is None:
                statuses.append(KeyStatus.NOT_FOUND)
            elif record.state is ObjectState.PUBLISHED:
                statuses.append(KeyStatus.OK)
            else:
                statuses.append(KeyStatus.NOT_READY)
        return statuses

    def remove(self, keys: Sequence[str], force: bool = False) -> list[KeyStatus]:
        """Removes published objects. A leased object is kept unless ``force``; even then its
        space is not reused before the lease ends. A reservation is only removed by force."""
        now = self.clock()
        statuses = []
        for key in keys:
            record = self.objects.get(key)
            if record is None:
                statuses.append(KeyStatus.NOT_FOUND)
            elif record.state is ObjectState.RESERVED and not force:
                statuses.append(KeyStatus.NOT_READY)
            elif record.lease_until > now and not force:
                statuses.append(KeyStatus.HAS_LEASE)
            else:
                self._forget(record)
                if record.state is ObjectState.RESERVED:
                    release_at = now + self.config.reclaim_delay
                else:
                    release_at = max(now, record.lease_until)
                self._free_at(record.replicas, release_at)
                self.counters.objects_removed += 1
                statuses.append(KeyStatus.OK)
        return statuses

    def list_keys(self, prefix: str = "", limit: int = 0, start_after: str = "") -> KeyPage:
        """Published keys starting with ``prefix``, in order, after ``start_after``."""
        limit = limit or self.config.list_page_size
        lower = max(prefix, start_after)
        include_lower = not start_after or lower != start_after  # start_after is exclusive
        keys: list[str] = []
        for key in self._published_keys.irange(minimum=lower, inclusive=(include_lower, True)):
            if not key.startswith(prefix):
                break
            keys.append(key)
            if len(keys) == limit:
                break
        more = len(keys) == limit and self._has_key_after(keys[-1], prefix)
        return KeyPage(keys, [self.objects[k].size for k in keys], keys[-1] if more else "")

    def snapshot(self) -> ClusterSnapshot:
        usages = [
            SegmentUsage(
                s.info,
                s.allocator.capacity,
                s.allocator.used,
                len(s.owners),
                s.allocator.largest_free,
            )
            for s in self.segments.values()
        ]
        return ClusterSnapshot(
            usages,
            len(self.objects) - len(self._reservations),
            len(self._reservations),
            len(self.nodes),
        )

    # ------------------------------------------------------------------ time

    def tick(self) -> TickReport:
        """Applies everything that is due: reservation timeouts, dead nodes, deferred frees."""
        now = self.clock()
        report = TickReport()
        deadline = now - self.config.reservation_timeout
        while self._reservations:
            record = next(iter(self._reservations.values()))
            if record.created_at > deadline:
                break
            self._forget(record)
            self._free_at(record.replicas, now + self.config.reclaim_delay)
            self.counters.reservations_reclaimed += 1
            report.reservations_reclaimed.append(record.key)
        silent_since = now - self.config.node_ttl
        for node in [n for n in self.nodes.values() if n.last_seen < silent_since]:
            report.dead_nodes.append(node.node_id)
            for segment_id in list(node.segment_ids):
                report.objects_lost += self._drop_segment(segment_id)
            del self.nodes[node.node_id]
            self.counters.nodes_died += 1
        while self._deferred and self._deferred[0][0] <= now:
            _, _, segment, offset = heapq.heappop(self._deferred)
            if self.segments.get(segment.segment_id) is segment:
                segment.allocator.free(offset)
                report.buffers_released += 1
        return report

    # ------------------------------------------------------------------ internals

    def _put_start_one(
        self, client_id: str, key: str, size: int, wanted: int, now: float
    ) -> PutSlot:
        problem = key_problem(key)
        if problem is not None:
            return PutSlot(KeyStatus.INVALID_KEY, message=problem)
        if size < 0:
            return PutSlot(
                KeyStatus.INVALID_ARGUMENT, message=f"size must not be negative, got {size}"
            )
        existing = self.objects.get(key)
        if existing is not None:
            what = "is being written" if existing.state is ObjectState.RESERVED else "exists"
            return PutSlot(KeyStatus.ALREADY_EXISTS, message=f"object {key!r} {what}")
        replicas = self._allocate(key, size, wanted)
        if not replicas:
            return PutSlot(KeyStatus.NO_SPACE, message=self._no_space_message(size))
        record = ObjectRecord(
            key, size, ObjectState.RESERVED, next(self._put_ids), client_id, now, list(replicas)
        )
        self.objects[key] = record
        self._reservations[key] = record
        self.counters.puts_started += 1
        return PutSlot(KeyStatus.OK, record.put_id, self._placed(record))

    def _put_end_one(self, commit: Commit) -> KeyStatus:
        record = self.objects.get(commit.key)
        if record is None or record.put_id != commit.put_id:
            return KeyStatus.STALE_PUT
        if record.state is ObjectState.PUBLISHED:
            return KeyStatus.OK  # a retried commit
        if len(commit.replica_ok) != len(record.replicas):
            return KeyStatus.INVALID_ARGUMENT
        kept: list[Replica | None] = []
        failed: list[Replica | None] = []
        for replica, ok in zip(record.replicas, commit.replica_ok, strict=True):
            (kept if ok and replica is not None else failed).append(replica)
        self._free_now(failed)
        del self._reservations[record.key]
        if not kept:
            del self.objects[record.key]
            return KeyStatus.NO_REPLICA
        record.replicas = kept
        record.state = ObjectState.PUBLISHED
        self._published_keys.add(record.key)
        self.counters.puts_published += 1
        return KeyStatus.OK

    def _allocate(self, key: str, size: int, wanted: int) -> list[Replica]:
        """One buffer on each of up to ``wanted`` distinct nodes, in the configured order:
        random nodes (spreads objects and load evenly) or most-free first; within a node, its
        segment with the largest free extent."""
        candidates = []
        for node in self.nodes.values():
            best = None
            for segment_id in node.segment_ids:
                segment = self.segments[segment_id]
                free = segment.allocator.largest_free
                if free >= size and (best is None or free > best[0]):
                    best = (free, segment)
            if best is not None:
                candidates.append(best)
        if self.config.placement == "most-free":
            candidates.sort(key=lambda c: c[0], reverse=True)
        else:
            self.rng.shuffle(candidates)
        replicas = []
        for _, segment in candidates[:wanted]:
            offset = segment.allocator.allocate(size)
            if offset is None:  # largest_free counts alignment slack: try the next node
                continue
            segment.owners[offset] = key
            replicas.append(Replica(segment.segment_id, offset))
        return replicas

    def _no_space_message(self, size: int) -> str:
        if not self.segments:
            return (
                "no storage node has mounted a segment yet: start one with "
                "`kvpool node --master HOST:PORT --dram 4GiB`"
            )
        largest = max(s.allocator.largest_free for s in self.segments.values())
        free = sum(s.allocator.free_bytes for s in self.segments.values())
        capacity = sum(s.allocator.capacity for s in self.segments.values())
        return (
            f"no segment can hold {format_size(size)} ({size} bytes): the largest free extent is "
            f"{format_size(largest)} ({largest} bytes); {format_size(free)} free of "
            f"{format_size(capacity)} in {len(self.segments)} segments. Remove objects, add "
            "storage nodes, or store smaller objects."
        )

    def _placed(self, record: ObjectRecord) -> tuple[PlacedReplica, ...]:
        placed = []
        for replica in record.replicas:
            if replica is None:
                continue
            info = self.segments[replica.segment_id].info
            placed.append(PlacedReplica(info, info.base_address + replica.offset))
        return tuple(placed)

    def _lease_ttl(self, requested: float) -> float:
        if requested <= 0:
            return self.config.lease_ttl
        return min(requested, self.config.max_lease_ttl)

    def _forget(self, record: ObjectRecord) -> None:
        """Removes an object from every index (its buffers are the caller's business)."""
        del self.objects[record.key]
        if record.state is ObjectState.PUBLISHED:
            self._published_keys.remove(record.key)
        else:
            del self._reservations[record.key]

    def _free_now(self, replicas: Iterable[Replica | None]) -> None:
        for replica in replicas:
            if replica is None:
                continue
            segment = self.segments.get(replica.segment_id)
            if segment is not None:
                del segment.owners[replica.offset]
                segment.allocator.free(replica.offset)

    def _free_at(self, replicas: Iterable[Replica | None], release_at: float) -> None:
        """Detaches buffers from their object now; the space returns at ``release_at``."""
        for replica in replicas:
            if replica is None:
                continue
            segment = self.segments.get(replica.segment_id)
            if segment is None:
                continue
            del segment.owners[replica.offset]
            if release_at <= self.clock():
                segment.allocator.free(replica.offset)
            else:
                entry = (release_at, next(self._seq), segment, replica.offset)
                heapq.heappush(self._deferred, entry)

    def _drop_segment(self, segment_id: str) -> int:
        """Forgets a segment and every replica in it; returns objects left with none."""
        segment = self.segments.pop(segment_id)
        node = self.nodes.get(segment.node_id)
        if node is not None:
            node.segment_ids.discard(segment_id)
        lost = 0
        for key in set(segment.owners.values()):
            record = self.objects[key]
            record.replicas = [
                None if r is not None and r.segment_id == segment_id else r for r in record.replicas
            ]
            if record.state is ObjectState.PUBLISHED:
                record.replicas = [r for r in record.replicas if r is not None]
            if not any(r is not None for r in record.replicas):
                self._forget(record)
                lost += 1
        self.counters.objects_lost += lost
        return lost

    def _has_key_after(self, key: str, prefix: str) -> bool:
        for following in self._published_keys.irange(minimum=key, inclusive=(False, True)):
            return following.startswith(prefix)
        return False
