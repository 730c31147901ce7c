"""The master's metadata core: a synchronous state machine with an injected clock.

No gRPC, threads, sleeps or wall-clock reads live here: each public method is one event (a
node mounts a segment, a client starts a put, time passes), applies the rules of the object
life cycle and returns its result as plain data. The gRPC service in ``service.py`` is a thin
adapter around it. This is what lets the tests drive every rule deterministically with a fake
clock.

Life cycle of an object::

    put_start ──> RESERVED ──put_end──> PUBLISHED ──remove / eviction / node loss──> gone
                     │ put_revoke, reservation timeout, writer declared dead, replicas lost
                     v
                    gone (space freed, or quarantined when a writer may still be copying)

The rules that keep bytes safe:

* Space is never reused while a reader may still be copying out of it (its lease) or a writer
  that lost its reservation may still be copying into it (``reclaim_delay`` after the
  reservation ends). Such buffers wait in ``_deferred`` until their release time.
* A leased object is never removed (unless forced, and then its space still waits for the
  lease), never evicted. Unpublished objects are never evicted.
* Eviction is least-recently-used; soft-pinned objects go only after all unpinned ones,
  hard-pinned objects never.
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
from kvpool.common.status import KeyStatus, Pin
from kvpool.master.allocator import Allocator
from kvpool.master.config import MasterConfig
from kvpool.master.lru import LruIndex
from kvpool.master.records import (
    ClusterSnapshot,
    Commit,
    Counters,
    KeyPage,
    Location,
    NodeRecord,
    ObjectInfo,
    ObjectRecord,
    ObjectState,
    PlacedReplica,
    PrefixRemoval,
    PutOptions,
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
        #: client id -> last time it was heard from (clients that hold reservations).
        self.clients: dict[str, float] = {}
        self._published_keys: SortedList = SortedList()
        self._lru = LruIndex()
        #: Reservations by creation time (oldest first): timeouts pop from the front.
        self._reservations: OrderedDict[str, ObjectRecord] = OrderedDict()
        self._reservations_of: dict[str, set[str]] = {}
        #: (release_at, seq, segment, offset): buffers waiting to be freed. The record itself,
        #: not its id, so that a buffer of a dropped and remounted segment is never freed twice.
        self._deferred: list[tuple[float, int, SegmentRecord, int]] = []
        #: (time, seq, key) of soft pins and leases that may end then (checked when due).
        self._pin_ends: list[tuple[float, int, str]] = []
        self._lease_ends: list[tuple[float, int, str]] = []
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

    def unmount_segment(self, node_id: str, segment_id: str) -> tuple[int, float]:
        """A node withdraws a segment (graceful drain).

        Its objects are removed at once so no new reader finds them. Returns how many objects
        lost their last replica, and how many seconds the node must keep the memory for
        readers that still hold leases on what was there.
        """
        segment = self.segments.get(segment_id)
        if segment is None or segment.node_id != node_id:
            return 0, 0.0
        now = self.clock()
        drain_until = now
        for key in segment.owners.values():
            drain_until = max(drain_until, self.objects[key].lease_until)
        for release_at, _, deferred, _ in self._deferred:
            if deferred is segment:
                drain_until = max(drain_until, release_at)
        lost = self._drop_segment(segment_id)
        node = self.nodes.get(node_id)
        if node is not None and not node.segment_ids:
            del self.nodes[node_id]
        return lost, drain_until - now

    def heartbeat(self, node_id: str, segment_ids: Iterable[str]) -> list[str]:
        """Records that a node is alive; returns the segments it must mount again."""
        node = self.nodes.get(node_id)
        if node is not None:
            node.last_seen = self.clock()
        known = node.segment_ids if node is not None else set()
        return [s for s in segment_ids if s not in known]

    # ------------------------------------------------------------------ client side

    def client_heartbeat(self, client_id: str) -> None:
        if client_id:
            self.clients[client_id] = self.clock()

    def put_start(
        self,
        client_id: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        options: PutOptions | int | None = None,
    ) -> list[PutSlot]:
        """Reserves one buffer per replica, on distinct nodes, for each key. ``options`` may
        be just a replica count."""
        if not isinstance(options, PutOptions):
            options = PutOptions(replicas=options or 0)
        wanted = options.replicas or self.config.default_replicas
        if not 1 <= wanted <= self.config.max_replicas:
            message = f"replicas must be between 1 and {self.config.max_replicas}, got {wanted}"
            return [PutSlot(KeyStatus.INVALID_ARGUMENT, message=message) for _ in keys]
        now = self.clock()
        self.client_heartbeat(client_id)
        return [
            self._put_start_one(client_id, key, size, wanted, options, now)
            for key, size in zip(keys, sizes, strict=True)
        ]

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
        now = self.clock()
        locations = []
        for key in keys:
            record = self.objects.get(key)
            if record is None or record.state is not ObjectState.PUBLISHED:
                self.counters.misses += 1
                status = KeyStatus.NOT_FOUND if record is None else KeyStatus.NOT_READY
                locations.append(Location(status))
                continue
            self.counters.hits += 1
            self._lease(record, now, ttl)
            locations.append(
                Location(KeyStatus.OK, record.size, self._placed(record), record.crc32)
            )
        return locations, ttl

    def exists(
        self, keys: Sequence[str], lease_ttl: float = 0.0, *, grant_lease: bool = True
    ) -> list[KeyStatus]:
        """Whether each key is published; grants a lease on those that are, unless told not to."""
        ttl = self._lease_ttl(lease_ttl)
        now = self.clock()
        statuses = []
        for key in keys:
            record = self.objects.get(key)
            if record is None:
                statuses.append(KeyStatus.NOT_FOUND)
            elif record.state is ObjectState.PUBLISHED:
                if grant_lease:
                    self._lease(record, now, ttl)
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
            status = self._removal_status(record, now, force)
            if status is KeyStatus.OK:
                assert record is not None
                self._remove(record, now)
            statuses.append(status)
        return statuses

    def remove_prefix(self, prefix: str, force: bool = False) -> PrefixRemoval:
        """Removes every object whose key starts with ``prefix`` ("" removes all), under the
        same rules as ``remove``; says how many were removed and why others were kept."""
        now = self.clock()
        published = list(
            itertools.takewhile(
                lambda k: k.startswith(prefix), self._published_keys.irange(minimum=prefix)
            )
        )
        reserved = [k for k in self._reservations if k.startswith(prefix)]
        removed = leased = not_ready = 0
        for key in published + reserved:
            record = self.objects[key]
            status = self._removal_status(record, now, force)
            if status is KeyStatus.OK:
                self._remove(record, now)
                removed += 1
            elif status is KeyStatus.HAS_LEASE:
                leased += 1
            else:
                not_ready += 1
        return PrefixRemoval(removed, leased, not_ready)

    def stat(self, key: str) -> ObjectInfo:
        record = self.objects.get(key)
        if record is None:
            return ObjectInfo(KeyStatus.NOT_FOUND)
        now = self.clock()
        return ObjectInfo(
            status=KeyStatus.OK,
            size=record.size,
            state=record.state.value,
            replicas=self._placed(record),
            lease_remaining=max(0.0, record.lease_until - now),
            pin=record.pin,
            pin_remaining=max(0.0, record.pin_until - now) if record.pin is Pin.SOFT else 0.0,
            crc32=record.crc32,
            age=now - record.created_at,
            idle=now - record.last_access,
        )

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
        """Applies everything that is due: timeouts, dead nodes and clients, deferred frees,
        ended pins and leases, and eviction above the high watermark."""
        now = self.clock()
        report = TickReport()
        self._reclaim_reservations(now, report)
        self._bury_dead_clients(now, report)
        self._bury_dead_nodes(now, report)
        while self._deferred and self._deferred[0][0] <= now:
            _, _, segment, offset = heapq.heappop(self._deferred)
            if self.segments.get(segment.segment_id) is segment:
                segment.allocator.free(offset)
                report.buffers_released += 1
        self._end_soft_pins(now)
        self._count_ended_leases(now)
        report.objects_evicted = self._evict_above_watermark(now)
        return report

    # ------------------------------------------------------------------ internals: puts

    def _put_start_one(
        self,
        client_id: str,
        key: str,
        size: int,
        wanted: int,
        options: PutOptions,
        now: float,
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
        replicas = self._allocate(key, size, wanted, options.preferred_hosts)
        if not replicas:
            self._evict_to_fit(size, now)
            replicas = self._allocate(key, size, wanted, options.preferred_hosts)
        if not replicas:
            return PutSlot(KeyStatus.NO_SPACE, message=self._no_space_message(size))
        record = ObjectRecord(
            key,
            size,
            ObjectState.RESERVED,
            next(self._put_ids),
            client_id,
            now,
            list(replicas),
            last_access=now,
            pin=options.pin,
        )
        if options.pin is Pin.SOFT:
            record.pin_until = now + (options.pin_ttl or self.config.soft_pin_ttl)
        self.objects[key] = record
        self._reservations[key] = record
        self._reservations_of.setdefault(client_id, set()).add(key)
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
        self._end_reservation(record)
        if not kept:
            del self.objects[record.key]
            return KeyStatus.NO_REPLICA
        record.replicas = kept
        record.state = ObjectState.PUBLISHED
        record.crc32 = commit.crc32
        record.last_access = self.clock()
        self._index_published(record)
        if record.pin is Pin.SOFT:
            heapq.heappush(self._pin_ends, (record.pin_until, next(self._seq), record.key))
        self.counters.puts_published += 1
        return KeyStatus.OK

    def _allocate(
        self, key: str, size: int, wanted: int, preferred_hosts: Sequence[str] = ()
    ) -> list[Replica]:
        """One buffer on each of up to ``wanted`` distinct nodes. Nodes on a preferred host
        come first; then the configured order: random (spreads objects and load evenly) or
        most-free first. Within a node, its segment with the largest free extent."""
        candidates = []
        for node in self.nodes.values():
            best = None
            for segment_id in node.segment_ids:
                segment = self.segments[segment_id]
                free = segment.allocator.largest_free
                if free >= segment.allocator.rounded(size) and (best is None or free > best[0]):
                    best = (free, segment)
            if best is not None:
                candidates.append((node.host in preferred_hosts, best[0], best[1]))
        if self.config.placement == "most-free":
            candidates.sort(key=lambda c: c[1], reverse=True)
        else:
            self.rng.shuffle(candidates)
        candidates.sort(key=lambda c: not c[0])  # stable: preferred hosts first
        replicas = []
        for _, _, segment in candidates:
            if len(replicas) == wanted:
                break
            offset = segment.allocator.allocate(size)
            assert offset is not None, "largest_free said it fits"
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
            f"no segment can hold {format_size(size)} ({size} bytes), even after evicting what "
            f"may be evicted: the largest free extent is {format_size(largest)} ({largest} "
            f"bytes); {format_size(free)} free of {format_size(capacity)} in "
            f"{len(self.segments)} segments. Remove objects, add storage nodes, or store "
            "smaller objects."
        )

    # ------------------------------------------------------------------ internals: reads

    def _lease(self, record: ObjectRecord, now: float, ttl: float) -> None:
        if record.lease_until <= now:  # a new lease, not an extension: count its end
            heapq.heappush(self._lease_ends, (now + ttl, next(self._seq), record.key))
        record.lease_until = max(record.lease_until, now + ttl)
        record.last_access = now
        self._lru.touch(record.key)
        for replica in record.replicas:
            if replica is not None:
                self.segments[replica.segment_id].lru.touch(record.key)

    def _lease_ttl(self, requested: float) -> float:
        if requested <= 0:
            return self.config.lease_ttl
        return min(requested, self.config.max_lease_ttl)

    def _placed(self, record: ObjectRecord) -> tuple[PlacedReplica, ...]:
        placed = []
        for replica in record.replicas:
            if replica is None:
                continue
            info = self.segments[replica.segment_id].info
            placed.append(PlacedReplica(info, info.base_address + replica.offset))
        return tuple(placed)

    # ------------------------------------------------------------------ internals: removal

    def _removal_status(self, record: ObjectRecord | None, now: float, force: bool) -> KeyStatus:
        if record is None:
            return KeyStatus.NOT_FOUND
        if record.state is ObjectState.RESERVED and not force:
            return KeyStatus.NOT_READY
        if record.lease_until > now and not force:
            return KeyStatus.HAS_LEASE
        return KeyStatus.OK

    def _remove(self, record: ObjectRecord, now: float) -> None:
        self._forget(record)
        if record.state is ObjectState.RESERVED:
            release_at = now + self.config.reclaim_delay  # its writer may still be copying
        else:
            release_at = max(now, record.lease_until)  # its readers may still be copying
        self._free_at(record.replicas, release_at)
        self.counters.objects_removed += 1

    def _index_published(self, record: ObjectRecord) -> None:
        self._published_keys.add(record.key)
        self._lru.add(record.key, record.pin)
        for replica in record.replicas:
            if replica is not None:
                self.segments[replica.segment_id].lru.add(record.key, record.pin)

    def _forget(self, record: ObjectRecord) -> None:
        """Removes an object from every index (its buffers are the caller's business)."""
        if record.state is ObjectState.PUBLISHED:
            del self.objects[record.key]
            self._published_keys.remove(record.key)
            self._lru.discard(record.key)
            for replica in record.replicas:
                segment = self.segments.get(replica.segment_id) if replica else None
                if segment is not None:
                    segment.lru.discard(record.key)
        else:
            del self.objects[record.key]
            self._end_reservation(record)

    def _end_reservation(self, record: ObjectRecord) -> None:
        del self._reservations[record.key]
        keys = self._reservations_of[record.client_id]
        keys.discard(record.key)
        if not keys:
            del self._reservations_of[record.client_id]

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

    # ------------------------------------------------------------------ internals: time

    def _reclaim_reservations(self, now: float, report: TickReport) -> None:
        deadline = now - self.config.reservation_timeout
        while self._reservations:
            record = next(iter(self._reservations.values()))
            if record.created_at > deadline:
                break
            self._reclaim(record, now)
            report.reservations_reclaimed.append(record.key)

    def _reclaim(self, record: ObjectRecord, now: float) -> None:
        """Ends a reservation whose writer may still be copying: the key is free at once, the
        space only after the reclaim delay."""
        self._forget(record)
        self._free_at(record.replicas, now + self.config.reclaim_delay)
        self.counters.reservations_reclaimed += 1

    def _bury_dead_clients(self, now: float, report: TickReport) -> None:
        silent_since = now - self.config.client_ttl
        for client_id in [c for c, seen in self.clients.items() if seen < silent_since]:
            del self.clients[client_id]
            for key in list(self._reservations_of.get(client_id, ())):
                self._reclaim(self.objects[key], now)
                report.reservations_reclaimed.append(key)
            report.dead_clients.append(client_id)
            self.counters.clients_died += 1

    def _bury_dead_nodes(self, now: float, report: TickReport) -> None:
        silent_since = now - self.config.node_ttl
        for node in [n for n in self.nodes.values() if n.last_seen < silent_since]:
            report.dead_nodes.append(node.node_id)
            for segment_id in list(node.segment_ids):
                report.objects_lost += self._drop_segment(segment_id)
            del self.nodes[node.node_id]
            self.counters.nodes_died += 1

    def _end_soft_pins(self, now: float) -> None:
        while self._pin_ends and self._pin_ends[0][0] <= now:
            _, _, key = heapq.heappop(self._pin_ends)
            record = self.objects.get(key)
            if record is None or record.pin is not Pin.SOFT or record.pin_until > now:
                continue
            record.pin = Pin.NONE
            self._lru.unpin(key)
            for replica in record.replicas:
                if replica is not None:
                    self.segments[replica.segment_id].lru.unpin(key)

    def _count_ended_leases(self, now: float) -> None:
        while self._lease_ends and self._lease_ends[0][0] <= now:
            _, _, key = heapq.heappop(self._lease_ends)
            record = self.objects.get(key)
            if record is None:
                continue
            if record.lease_until > now:  # extended meanwhile: check again when it ends
                heapq.heappush(self._lease_ends, (record.lease_until, next(self._seq), key))
            else:
                self.counters.lease_expiries += 1

    # ------------------------------------------------------------------ internals: eviction

    def _evict_above_watermark(self, now: float) -> int:
        """Brings every segment, and the pool, back to ``eviction_ratio`` below the high
        watermark once it passed it."""
        high = self.config.high_watermark
        low = high - self.config.eviction_ratio
        evicted = 0
        for segment in list(self.segments.values()):
            allocator = segment.allocator
            if allocator.capacity and allocator.used > high * allocator.capacity:
                target = low * allocator.capacity
                evicted += self._evict_from(
                    segment.lru, now, lambda a=allocator, t=target: a.used <= t
                )
        capacity = sum(s.allocator.capacity for s in self.segments.values())
        if capacity and self._pool_used() > high * capacity:
            target = low * capacity
            evicted += self._evict_from(self._lru, now, lambda: self._pool_used() <= target)
        return evicted

    def _evict_to_fit(self, size: int, now: float) -> None:
        """Evicts least recently used objects until some segment has a free extent of
        ``size`` bytes (or nothing more may be evicted)."""
        if not self.segments or size > max(s.allocator.capacity for s in self.segments.values()):
            return
        budget = [self.config.max_evictions_per_put]

        def fits() -> bool:
            budget[0] -= 1
            return budget[0] < 0 or any(
                s.allocator.largest_free >= size for s in self.segments.values()
            )

        if not fits():
            self._evict_from(self._lru, now, fits)

    def _evict_from(self, index: LruIndex, now: float, done: Callable[[], bool]) -> int:
        """Evicts objects in ``index`` order, skipping leased ones, until ``done()``."""
        evicted = 0
        while True:
            victims = []
            for key in index.candidates():
                record = self.objects[key]
                if record.lease_until <= now:
                    victims.append(record)
                    if len(victims) == 64:
                        break
            if not victims:
                return evicted
            for record in victims:
                self._forget(record)
                self._free_now(record.replicas)
                self.counters.evictions += 1
                evicted += 1
                if done():
                    return evicted

    def _pool_used(self) -> int:
        return sum(s.allocator.used for s in self.segments.values())
