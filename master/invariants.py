"""The invariants of the master's metadata core, checked on demand (``MasterState.validate``).

``MasterState`` keeps the same facts in several places for speed: an object's replicas and
its segments' owners, published objects and the ordered key index, reservations and their
queue, allocations and the buffers waiting to be freed. A change that updates one and forgets
another corrupts the index silently, and the damage shows much later (a buffer handed out
twice, a key listed that cannot be read). This check compares them all, in time linear in
what the master holds: tests call it after every step, and a master started with
``validate_each_event`` after every event, so that a bug is caught at the event that made it.

A friend of ``MasterState``: it reads its private indexes, and changes nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from kvpool.common.status import Pin, Tier
from kvpool.master.quotas import TenantUsage
from kvpool.master.records import ObjectRecord, ObjectState
from kvpool.master.tombstones import DurableRecord
from kvpool.security.identity import split_key, tenant_of

if TYPE_CHECKING:
    from kvpool.master.state import MasterState

RESERVED, COMMITTED, PUBLISHED = ObjectState.RESERVED, ObjectState.COMMITTED, ObjectState.PUBLISHED


class InvariantViolation(AssertionError):
    """The core's indexes disagree: a bug in the master. ``invariant`` names the rule."""

    def __init__(self, invariant: str, detail: str) -> None:
        self.invariant = invariant
        self.detail = detail
        super().__init__(f"invariant broken: {invariant}: {detail}")


def check_invariants(state: MasterState) -> None:
    """Raises InvariantViolation, naming the first broken invariant, unless every one holds."""
    _check_nodes(state)
    owned = _check_objects(state)
    _check_segments(state, owned)
    _check_indexes(state)
    _check_reservations(state)
    _check_commands(state)
    _check_tenant_usage(state)
    _check_tenant_objects(state)
    _check_replication(state)
    _check_adoptable(state)


def _check_nodes(state: MasterState) -> None:
    rule = "nodes and segments name each other"
    for node_id, node in state.nodes.items():
        if node.node_id != node_id:
            raise InvariantViolation(rule, f"node {node_id!r} is filed as {node.node_id!r}")
        for segment_id in node.segment_ids:
            segment = state.segments.get(segment_id)
            if segment is None or segment.node_id != node_id:
                raise InvariantViolation(
                    rule,
                    f"node {node_id!r} lists segment {segment_id!r}, which is not mounted by it",
                )
    for segment_id, segment in state.segments.items():
        if segment.segment_id != segment_id:
            raise InvariantViolation(
                rule, f"segment {segment_id!r} is filed as {segment.segment_id!r}"
            )
        owner = state.nodes.get(segment.node_id)
        if owner is None or segment_id not in owner.segment_ids:
            raise InvariantViolation(
                rule, f"segment {segment_id!r} is not listed by its node {segment.node_id!r}"
            )
        if segment_id in state._away_since:
            raise InvariantViolation(rule, f"segment {segment_id!r} is mounted yet noted away")
    for node_id in state._silent_until:
        if node_id not in state.nodes:
            raise InvariantViolation(rule, f"node {node_id!r}, gone, is still noted silent")


def _check_objects(state: MasterState) -> dict[tuple[str, int], str]:
    """Checks each object on its own; returns (segment, offset) -> key of every buffer an
    object holds (its replicas and the targets of its copies in flight)."""
    owned: dict[tuple[str, int], str] = {}
    for key, record in state.objects.items():
        if record.key != key:
            raise InvariantViolation("objects are filed under their key", f"{key!r}: {record}")
        replicas = [r for r in record.replicas if r is not None]
        if not replicas:
            raise InvariantViolation(
                "a live object has a replica", f"{key!r} ({record.state.value})"
            )
        if record.state is PUBLISHED and len(replicas) != len(record.replicas):
            raise InvariantViolation(
                "a published object's replicas are all there", f"{key!r}: {record.replicas}"
            )
        if len(set(replicas)) != len(replicas):
            raise InvariantViolation(
                "an object's replicas are distinct", f"{key!r}: {record.replicas}"
            )
        for replica in replicas:
            _check_buffer(state, record, replica.segment_id, replica.offset, "replica", owned)
        for command_id, move in record.moving.items():
            if record.state is not PUBLISHED:
                raise InvariantViolation(
                    "only published objects are copied",
                    f"{key!r} ({record.state.value}) has copy {command_id} in flight",
                )
            _check_buffer(
                state, record, move.target.segment_id, move.target.offset, "copy target", owned
            )
        if record.state is COMMITTED:
            segments = {r.segment_id for r in replicas}
            if not record.unacked or not record.unacked <= segments:
                raise InvariantViolation(
                    "a committed object awaits nodes that hold its replicas",
                    f"{key!r}: awaits {sorted(record.unacked)}, replicas in {sorted(segments)}",
                )
        elif record.unacked:
            raise InvariantViolation(
                "only committed objects await their nodes",
                f"{key!r} ({record.state.value}) awaits {sorted(record.unacked)}",
            )
    return owned


def _check_buffer(
    state: MasterState,
    record: ObjectRecord,
    segment_id: str,
    offset: int,
    what: str,
    owned: dict[tuple[str, int], str],
) -> None:
    key = record.key
    segment = state.segments.get(segment_id)
    if segment is None:
        raise InvariantViolation(
            "replicas lie in mounted segments",
            f"{key!r} ({record.state.value}) has a {what} in unmounted segment {segment_id!r}",
        )
    if segment.owners.get(offset) != key:
        raise InvariantViolation(
            "a segment owns each replica at its offset",
            f"{key!r}'s {what} at {segment_id!r}@{offset:#x} is owned by "
            f"{segment.owners.get(offset)!r}",
        )
    try:
        allocated: int | None = segment.allocator.size_of(offset)
    except KeyError:
        allocated = None
    if allocated is None or allocated < segment.allocator.rounded(record.size):
        raise InvariantViolation(
            "a replica's buffer is allocated, at the object's size",
            f"{key!r}'s {what} at {segment_id!r}@{offset:#x}: {allocated} bytes allocated for "
            f"{record.size}",
        )
    if (segment_id, offset) in owned:
        raise InvariantViolation(
            "no buffer is held twice",
            f"{segment_id!r}@{offset:#x}: {key!r} and {owned.get((segment_id, offset))!r}",
        )
    owned[(segment_id, offset)] = key


def _check_segments(state: MasterState, owned: dict[tuple[str, int], str]) -> None:
    waiting: dict[str, Counter[int]] = {}  # buffers to be freed, per mounted segment
    for _, _, segment, offset in state._deferred:
        if state.segments.get(segment.segment_id) is segment:
            waiting.setdefault(segment.segment_id, Counter())[offset] += 1
    for segment, offset, _, _ in state._parked.values():
        if state.segments.get(segment.segment_id) is segment:
            waiting.setdefault(segment.segment_id, Counter())[offset] += 1
    for segment, offset in state._quarantine.buffers():
        if state.segments.get(segment.segment_id) is segment:
            waiting.setdefault(segment.segment_id, Counter())[offset] += 1
    leaving = _leaving(state)
    for segment_id, segment in state.segments.items():
        for offset, key in segment.owners.items():
            if owned.get((segment_id, offset)) != key:
                raise InvariantViolation(
                    "segment owners are the replicas and copy targets of live objects",
                    f"{segment_id!r}@{offset:#x} is owned by {key!r}, which holds no buffer there",
                )
        allocator = segment.allocator
        allocations = allocator.allocations()
        if allocator.used != sum(allocations.values()):
            raise InvariantViolation(
                "allocator used bytes = sum of allocations",
                f"{segment_id!r}: used {allocator.used}, allocations {sum(allocations.values())}",
            )
        free = sum(size for _, size in allocator.free_extents())
        if allocator.used + free != allocator.capacity:
            raise InvariantViolation(
                "allocated and free bytes make the capacity",
                f"{segment_id!r}: {allocator.used} used + {free} free != {allocator.capacity}",
            )
        pending = waiting.get(segment_id, Counter())
        doubled = [offset for offset, n in pending.items() if n > 1 or offset in segment.owners]
        if doubled:
            raise InvariantViolation(
                "a buffer waiting to be freed is neither owned nor waiting twice",
                f"{segment_id!r} at {[hex(o) for o in doubled]}",
            )
        accounted = set(segment.owners) | set(pending)
        if accounted != set(allocations):
            raise InvariantViolation(
                "every allocated buffer is owned or waiting to be freed",
                f"{segment_id!r}: allocated but unaccounted for "
                f"{[hex(o) for o in sorted(set(allocations) - accounted)]}, accounted for but "
                f"not allocated {[hex(o) for o in sorted(accounted - set(allocations))]}",
            )
        if segment.leaving != leaving.get(segment_id, 0):
            raise InvariantViolation(
                "a segment's leaving bytes are its replicas being demoted",
                f"{segment_id!r}: leaving {segment.leaving}, demotions in flight "
                f"{leaving.get(segment_id, 0)}",
            )


def _leaving(state: MasterState) -> dict[str, int]:
    leaving: dict[str, int] = {}
    for record in state.objects.values():
        for move in record.moving.values():
            source = state.segments.get(move.source.segment_id)
            if source is None:
                raise InvariantViolation(
                    "copies in flight come from mounted segments",
                    f"{record.key!r} is copied out of unmounted {move.source.segment_id!r}",
                )
            if move.demotion:
                size = source.allocator.rounded(record.size)
                leaving[source.segment_id] = leaving.get(source.segment_id, 0) + size
    return leaving


def _check_indexes(state: MasterState) -> None:
    published = [r for r in state.objects.values() if r.state is PUBLISHED]
    index = state._published_keys
    missing = [r.key for r in published if r.key not in index]
    if missing or len(index) != len(published):
        raise InvariantViolation(
            "published keys index == published objects",
            f"{len(index)} keys indexed, {len(published)} objects published; not indexed: "
            f"{missing[:10]}",
        )
    evictable = [r for r in published if r.pin is not Pin.HARD]
    lru_keys = set(state._lru.candidates())
    if lru_keys != {r.key for r in evictable} or len(state._lru) != len(evictable):
        raise InvariantViolation(
            "the eviction order holds the published objects that are not hard-pinned",
            f"not in it: {sorted({r.key for r in evictable} - lru_keys)[:10]}, in it wrongly: "
            f"{sorted(lru_keys - {r.key for r in evictable})[:10]}",
        )
    per_segment: dict[str, set[str]] = {segment_id: set() for segment_id in state.segments}
    for record in evictable:
        for replica in record.replicas:
            if replica is not None:
                per_segment[replica.segment_id].add(record.key)
    for segment_id, keys in per_segment.items():
        lru = state.segments[segment_id].lru
        found = set(lru.candidates())
        if found != keys or len(lru) != len(keys):
            raise InvariantViolation(
                "a segment's eviction order holds the evictable objects with a replica there",
                f"{segment_id!r}: not in it {sorted(keys - found)[:10]}, in it wrongly "
                f"{sorted(found - keys)[:10]}",
            )


def _check_reservations(state: MasterState) -> None:
    reserved = {k: r for k, r in state.objects.items() if r.state is RESERVED}
    queue = state._reservations
    if queue.keys() != reserved.keys() or any(queue[k] is not r for k, r in reserved.items()):
        raise InvariantViolation(
            "reservations index == reserved objects",
            f"queued but not reserved: {sorted(queue.keys() - reserved.keys())[:10]}; reserved "
            f"but not queued: {sorted(reserved.keys() - queue.keys())[:10]}",
        )
    times = [r.created_at for r in queue.values()]
    if times != sorted(times):
        raise InvariantViolation(
            "reservations queue in the order they were made", f"creation times {times[:10]}..."
        )
    by_client: dict[str, set[str]] = {}
    for key, record in reserved.items():
        by_client.setdefault(record.client_id, set()).add(key)
    if state._reservations_of != by_client:
        raise InvariantViolation(
            "reservations by writer == reserved objects by writer",
            f"indexed {_sample(state._reservations_of)}, reserved {_sample(by_client)}",
        )
    if state.clients.keys() != by_client.keys():
        raise InvariantViolation(
            "writers tracked == writers holding reservations",
            f"tracked {sorted(state.clients)[:10]}, holding {sorted(by_client)[:10]}",
        )


def _check_commands(state: MasterState) -> None:
    awaited: set[tuple[int, str, int]] = set()
    for command_id, (segment_id, records) in state._awaiting.items():
        for record in records:
            awaited.add((command_id, segment_id, id(record)))
    persists = {(segment_id, r) for _, segment_id, r in awaited}
    for key, record in state.objects.items():
        for segment_id in record.unacked:
            if (segment_id, id(record)) not in persists:
                raise InvariantViolation(
                    "a committed object awaits a Persist command for each node it waits for",
                    f"{key!r} awaits {segment_id!r} without a command",
                )
        for command_id, move in record.moving.items():
            if (command_id, move.target.segment_id, id(record)) not in awaited:
                raise InvariantViolation(
                    "a copy in flight awaits its Copy command",
                    f"{key!r}: copy {command_id} to {move.target.segment_id!r}",
                )


def _sample(index: dict[str, set[str]]) -> str:
    return str({client: sorted(keys)[:5] for client, keys in sorted(index.items())[:5]})


def _check_tenant_usage(state: MasterState) -> None:
    """Each tenant's usage, kept up to date event by event, is what its objects hold:
    recomputed here from scratch."""
    expected: dict[str, TenantUsage] = {}

    def usage_of(key: str) -> TenantUsage:
        return expected.setdefault(tenant_of(key), TenantUsage())

    for key, record in state.objects.items():
        usage = usage_of(key)
        usage.objects += 1
        if record.state is RESERVED:
            usage.reserved_bytes += state._need(record.size)
            usage.reservations += 1
        if record.lease_open:
            usage.leases += 1
    for segment in state.segments.values():
        allocator = segment.allocator
        for offset, key in segment.owners.items():
            usage = usage_of(key)
            if segment.info.tier is Tier.NVME:
                usage.nvme_bytes += allocator.size_of(offset)
            else:
                usage.dram_bytes += allocator.size_of(offset)
    actual = state._usage
    if actual != expected:
        wrong = sorted(
            t for t in actual.keys() | expected.keys() if actual.get(t) != expected.get(t)
        )
        raise InvariantViolation(
            "each tenant's usage is what its objects hold",
            "; ".join(
                f"tenant {t!r}: kept {actual.get(t)}, held {expected.get(t)}" for t in wrong[:5]
            ),
        )


def _check_tenant_objects(state: MasterState) -> None:
    """The objects by tenant are the objects: each under its tenant and key, no other."""
    rule = "the objects by tenant are the objects"
    filed = 0
    for tenant, table in state._tenant_objects.items():
        if not table:
            raise InvariantViolation(rule, f"tenant {tenant!r} is kept with no objects")
        filed += len(table)
    if filed != len(state.objects):
        raise InvariantViolation(rule, f"{filed} filed by tenant, {len(state.objects)} objects")
    for key, record in state.objects.items():
        tenant, bare = split_key(key)
        if state._tenant_objects.get(tenant, {}).get(bare) is not record:
            raise InvariantViolation(rule, f"{key!r} is not filed as {bare!r} of {tenant!r}")


def _check_replication(state: MasterState) -> None:
    """Re-replication's tables agree with the objects: its copies in flight are the copies
    between nodes the objects have in flight, the keys it counts as under-replicated are
    published objects, and the count of draining nodes is theirs."""
    replication = state._replication
    copies = {
        command_id
        for record in state.objects.values()
        for command_id, move in record.moving.items()
        if move.replication
    }
    if set(replication.in_flight) != copies:
        raise InvariantViolation(
            "copies in flight between nodes are counted once each",
            f"counted {sorted(replication.in_flight)[:10]}, in flight {sorted(copies)[:10]}",
        )
    stray = [
        key
        for key in replication.under
        if key not in state.objects or state.objects[key].state is not PUBLISHED
    ]
    if stray:
        raise InvariantViolation(
            "under-replicated keys are published objects", f"not published: {stray[:10]}"
        )
    draining = sum(1 for node in state.nodes.values() if node.draining)
    if state._draining != draining:
        raise InvariantViolation(
            "draining nodes are counted", f"counted {state._draining}, draining {draining}"
        )


def _check_adoptable(state: MasterState) -> None:
    """A live object's replicas, and the targets of its copies, lie where their segment's
    next mount would adopt them: a refused one would have its node told to forget it."""
    writes: Counter[tuple[str, str, int]] = Counter()
    for segment_id, awaited in state._awaiting.values():
        writes.update((segment_id, r.key, r.generation) for r in awaited)
    if writes != Counter(state._awaited_writes):
        raise InvariantViolation(
            "awaited writes are counted by place", f"{len(writes)} awaited, counted otherwise"
        )
    stray = state._copy_places.keys() - state._awaiting.keys()
    if stray:
        raise InvariantViolation(
            "copy places are kept while their copy is awaited", f"commands {sorted(stray)}"
        )
    tombstones = state._tombstones
    if not len(tombstones):
        return
    records: dict[str, DurableRecord | None] = {}
    for key, record in state.objects.items():
        places = [r for r in record.replicas if r is not None]
        places.extend(move.target for move in record.moving.values())
        for place in places:
            segment = state.segments.get(place.segment_id)
            if segment is None:
                continue
            if tombstones.refuses(
                segment.segment_id, key, record.generation, True, segment.node_id, place.offset
            ):
                raise InvariantViolation(
                    "live copies lie where a remount adopts them",
                    f"{key!r} (generation {record.generation}) at {place.segment_id!r}"
                    f"@{place.offset:#x} would be refused at the segment's next mount",
                )
            if segment.segment_id not in records:
                records[segment.segment_id] = tombstones.record(segment.segment_id)
            kept = records[segment.segment_id]
            if (
                kept is not None
                and not kept.distrusted
                and (
                    kept.keys.get(key, 0) >= record.generation
                    or (key, record.generation) in kept.exact
                )
            ):
                raise InvariantViolation(
                    "live copies lie where a new leader's remount adopts them",
                    f"{key!r} (generation {record.generation}) at {place.segment_id!r}"
                    f"@{place.offset:#x} would be refused by the segment's durable record",
                )
