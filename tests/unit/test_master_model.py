"""Model check of the master's metadata core (``master/state.py``).

A hypothesis state machine drives ``MasterState`` (fake clock, seeded placement) through random
sequences of what happens to a small cluster: storage nodes of two to four small segments come,
go away gracefully or die; clients put batches of objects of random sizes, replica counts and
pins, commit them with random replica failures, revoke them or go silent; readers take leases
with ``get_replicas`` and ``exists``; objects are removed one by one or by prefix, with or
without force; time passes in small steps and in large jumps; the master ticks.

Beside the master, the machine keeps a small model of its own: which reservations are open,
which leases it was granted and until when, which buffers must not be reused yet (leases on
removed objects, quarantined reservations), which nodes and clients are alive. After every step
the invariants below compare the two:

1. no two live buffers of a segment overlap;
2. every byte of a segment is either allocated or free, never both, never neither;
3. every published object has at least one complete replica (one its writer reported written),
   in a mounted segment that owns it, of at least the object's size;
4. a leased object is never evicted, removed without force or overwritten, and its bytes are
   not handed out again before the lease ends, even after a forced removal (likewise the bytes
   of a revoked reservation during the reclaim delay);
5. every reservation ends published or reclaimed: reservations agree with the model, and once
   everything has timed out (``settle``, also run at the end of every example) none is left and
   every allocated byte belongs to a live object.

Each event is also checked against the model as it happens: every status a call returns (the
model predicts HAS_LEASE, NOT_READY, STALE_PUT, NO_REPLICA...); a tick declares dead exactly the
clients and nodes that went silent, reclaims exactly the reservations due, ends exactly the
soft pins due, and leaves no segment (nor the pool) above the watermark while something there
may still be evicted; eviction, at a tick or to make room for a put, goes in least-recently-used
order (the model keeps its own recency), unpinned objects before soft-pinned ones; NO_SPACE
only once nothing evictable is left; unmounting a segment reports a drain time exactly as long
as the longest guard on its bytes.
"""

from __future__ import annotations

import itertools
import random
import sys
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from state_helpers import FakeClock, end_puts, rounded, segment_info

from kvpool.common.status import KeyStatus, Pin
from kvpool.master.config import MasterConfig
from kvpool.master.records import (
    Commit,
    ObjectRecord,
    ObjectState,
    PutOptions,
    SegmentRecord,
    TickReport,
)
from kvpool.master.state import MasterState

# Production timings (lease 10 s, client TTL 10 s, node TTL 5 s, ...) but for reservations, which
# time out and leave quarantine sooner: so that space turns over within one example.
CONFIG = MasterConfig(reservation_timeout=8.0, reclaim_delay=12.0, max_lease_ttl=120.0)
NODES = ("n0", "n1", "n2", "n3")
CLIENTS = ("c0", "c1", "c2")
KEYS = ("a0", "a1", "a2", "a3", "a/0", "a/1", "a/2", "a/3", "ab", "b", "b/0", "b/1", "c0", "c1")
PREFIXES = ("", "a", "a/", "ab", "b", "b/", "c", "zz")
SEGMENT_SIZES = (1000, 2048, 4096)  # 1000 rounds down to 960 usable bytes
LEASES = (-1.0, 0.0, 1.0, 7.5, 30.0, 1e4)  # <= 0: the default (10 s); 1e4: capped at 120 s
STEPS = (0.0, 0.5, 2.0, 4.0, 6.0, 11.0, 31.0, 75.0, 700.0)  # a bare tick, steps and jumps
PINS = st.sampled_from(
    [
        *[PutOptions()] * 9,
        PutOptions(pin=Pin.SOFT),  # the default pin TTL (1800 s)
        PutOptions(pin=Pin.SOFT, pin_ttl=4.0),
        *[PutOptions(pin=Pin.SOFT, pin_ttl=40.0)] * 2,
        PutOptions(pin=Pin.HARD),  # rare: hard-pinned objects stay for good
    ]
)
BATCH = st.lists(
    st.tuples(st.sampled_from(KEYS), st.integers(0, 1500) | st.integers(500, 1400)),
    min_size=1,
    max_size=4,
)
REPLICAS = st.integers(0, 3)
PREFER = st.sampled_from([None, *NODES])
HIGH = CONFIG.high_watermark


def host_of(node: str) -> str:
    return f"{node}.cluster.local"  # what segment_info says


@dataclass
class Buffer:
    """One replica's bytes: a segment (the record itself: a remounted segment is another
    one), an offset and the bytes allocated there."""

    segment: SegmentRecord
    offset: int
    size: int

    @property
    def segment_id(self) -> str:
        return self.segment.segment_id

    def mounted(self, state: MasterState) -> bool:
        return state.segments.get(self.segment_id) is self.segment

    def overlaps(self, other: Buffer) -> bool:
        return (
            self.segment is other.segment
            and self.offset < other.offset + other.size
            and other.offset < self.offset + self.size
        )


@dataclass
class Reservation:
    key: str
    put_id: int
    client: str
    size: int
    created_at: float
    buffers: list[Buffer]  # in the order of the PutSlot's replicas
    ended: bool = False  # committed, revoked, removed or reclaimed, as far as the model knows


@dataclass
class Guard:
    """Bytes that must stay allocated (never handed out again) until ``until``: those of a
    leased object (``attached``: the object must still own them), of a leased object removed by
    force, or of a revoked reservation whose writer may still be copying."""

    why: str
    key: str
    put_id: int
    buffer: Buffer
    until: float
    attached: bool


class MasterModel(RuleBasedStateMachine):
    """A small cluster under random events, and what the master should make of them."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.state = MasterState(CONFIG, clock=self.clock, rng=random.Random(0))
        #: alive node -> its mounted segments (those the master must keep).
        self.nodes: dict[str, dict[str, SegmentRecord]] = {}
        self.node_seen: dict[str, float] = {}
        #: clients that keep heartbeating, and when the master last heard of each it knows.
        self.alive_clients: set[str] = set()
        self.client_seen: dict[str, float] = {}
        self.reservations: dict[str, Reservation] = {}  # key -> its latest reservation
        self.completed: dict[tuple[str, int], set[tuple[str, int]]] = {}  # replicas written
        self.pins: dict[tuple[str, int], tuple[Pin, float]] = {}  # (pin, pin_until)
        self.lease_until: dict[tuple[str, int], float] = {}
        self.guards: dict[tuple, Guard] = {}
        #: When each object was last used (published, read, or its soft pin ended): the master
        #: evicts in this order, unpinned objects first.
        self.used_at: dict[tuple[str, int], int] = {}
        self.uses = itertools.count()

    # ------------------------------------------------------------------ model helpers

    @property
    def now(self) -> float:
        return self.clock()

    def open(self, reservation: Reservation) -> bool:
        """Still a reservation at the master: not ended, and not every replica lost."""
        return not reservation.ended and any(b.mounted(self.state) for b in reservation.buffers)

    def leased(self, key: str, put_id: int) -> bool:
        return self.lease_until.get((key, put_id), 0.0) > self.now

    def evictable(self, record: ObjectRecord) -> bool:
        return (
            record.state is ObjectState.PUBLISHED
            and self.pins[record.key, record.put_id][0] is not Pin.HARD
            and not self.leased(record.key, record.put_id)
        )

    def last_use(self, record: ObjectRecord) -> int:
        return self.used_at[record.key, record.put_id]

    def buffer_of(self, segment_id: str, offset: int) -> Buffer:
        segment = self.state.segments[segment_id]
        return Buffer(segment, offset, segment.allocator.size_of(offset))

    def live_guards(self) -> list[Guard]:
        return [g for g in self.guards.values() if g.until > self.now]

    def grant(self, key: str, ttl: float) -> None:
        """The master granted (or extended) a lease of ``ttl`` seconds on ``key``."""
        record = self.state.objects[key]
        ident = (key, record.put_id)
        until = max(self.lease_until.get(ident, 0.0), self.now + ttl)
        self.lease_until[ident] = until
        self.used_at[ident] = next(self.uses)
        for replica in record.replicas:
            assert replica is not None
            buffer = self.buffer_of(replica.segment_id, replica.offset)
            guard_key = ("lease", key, record.put_id, id(buffer.segment), replica.offset)
            self.guards[guard_key] = Guard("lease", key, record.put_id, buffer, until, True)
        info = self.state.stat(key)
        assert info.lease_remaining == pytest.approx(until - self.now), (
            f"{key}: lease should last {until - self.now} s more, stat says {info}"
        )

    def detach(self, key: str, put_id: int) -> None:
        """The object is gone (removed by force): its leased bytes stay guarded, unowned."""
        for guard in self.guards.values():
            if (guard.key, guard.put_id) == (key, put_id):
                guard.attached = False

    def quarantine(self, reservation: Reservation) -> None:
        """A reservation was taken from its writer, who may still be copying into it."""
        reservation.ended = True
        until = self.now + CONFIG.reclaim_delay
        for buffer in reservation.buffers:
            if buffer.mounted(self.state):
                guard_key = ("quarantine", reservation.put_id, id(buffer.segment), buffer.offset)
                self.guards[guard_key] = Guard(
                    "quarantine", reservation.key, reservation.put_id, buffer, until, False
                )

    def forget_segments(self, segments: list[SegmentRecord]) -> None:
        """These segments are gone (their node died or withdrew them): so are their guards."""
        gone = {id(s) for s in segments}
        self.guards = {k: g for k, g in self.guards.items() if id(g.buffer.segment) not in gone}

    def removed(self, record: ObjectRecord, force: bool) -> None:
        """The master removed ``record`` (status OK from remove or remove_prefix)."""
        if record.state is ObjectState.RESERVED:
            assert force, f"{record.key}: a reservation removed without force"
            reservation = self.reservations[record.key]
            assert reservation.put_id == record.put_id
            self.quarantine(reservation)
        else:
            assert force or not self.leased(record.key, record.put_id)
            self.detach(record.key, record.put_id)

    def expected_removal(self, key: str, force: bool) -> KeyStatus:
        record = self.state.objects.get(key)
        if record is None:
            return KeyStatus.NOT_FOUND
        if record.state is ObjectState.RESERVED and not force:
            return KeyStatus.NOT_READY
        if self.leased(key, record.put_id) and not force:
            return KeyStatus.HAS_LEASE
        return KeyStatus.OK

    def heartbeat(self, silent_nodes=(), silent_clients=()) -> None:
        for node, segments in self.nodes.items():
            if node not in silent_nodes:
                assert self.state.heartbeat(node, sorted(segments)) == [], f"{node} must remount"
                self.node_seen[node] = self.now
        for client in self.alive_clients - set(silent_clients):
            self.state.client_heartbeat(client)
            self.client_seen[client] = self.now

    def pass_time(self, seconds: float, silent_nodes=(), silent_clients=()) -> TickReport:
        """``seconds`` pass, everyone alive (but the silent) heartbeats, the master ticks; the
        tick must do exactly what the model expects."""
        self.clock.advance(seconds)
        self.heartbeat(silent_nodes, silent_clients)
        now = self.now
        writing = {r.client for r in self.reservations.values() if self.open(r)}
        dying_clients = {  # only writers holding reservations are watched
            c
            for c, seen in self.client_seen.items()
            if seen < now - CONFIG.client_ttl and c in writing
        }
        due = {
            key
            for key, r in self.reservations.items()
            if self.open(r)
            and (r.created_at <= now - CONFIG.reservation_timeout or r.client in dying_clients)
        }
        dying_nodes = {n for n in self.nodes if self.node_seen[n] < now - CONFIG.node_ttl}
        before = dict(self.state.objects)
        pins_before = {key: record.pin for key, record in before.items()}
        counters = _counts(self.state)

        report = self.state.tick()

        unpinned = next(self.uses)  # soft pins ended now: these objects count as just used
        for key, record in self.state.objects.items():
            if record.state is not ObjectState.PUBLISHED:
                continue
            pin, pin_until = self.pins[key, record.put_id]
            if pin is Pin.SOFT and pin_until <= now:
                pin = Pin.NONE
            assert record.pin is pin, f"{key}: pin {record.pin!r}, expected {pin!r}"
            if pins_before.get(key) is Pin.SOFT and pin is Pin.NONE:
                self.used_at[key, record.put_id] = unpinned

        assert set(report.dead_clients) == dying_clients, (report.dead_clients, dying_clients)
        assert sorted(report.reservations_reclaimed) == sorted(due), report
        assert sorted(report.dead_nodes) == sorted(dying_nodes), report
        for client in dying_clients:
            del self.client_seen[client]
            self.alive_clients.discard(client)
        for key in due:
            self.quarantine(self.reservations[key])
        for node in dying_nodes:
            self.forget_segments(list(self.nodes.pop(node).values()))
            del self.node_seen[node]
        after = _counts(self.state)
        assert after["evictions"] - counters["evictions"] == report.objects_evicted
        assert after["nodes_died"] - counters["nodes_died"] == len(report.dead_nodes)
        assert after["clients_died"] - counters["clients_died"] == len(report.dead_clients)
        assert after["reservations_reclaimed"] - counters["reservations_reclaimed"] == len(due)
        self.check_eviction(before, report)
        self.guards = {k: g for k, g in self.guards.items() if g.until > now}
        return report

    def check_eviction(self, before: dict[str, ObjectRecord], report: TickReport) -> None:
        state = self.state
        evicted = [
            r
            for key, r in before.items()
            if r.state is ObjectState.PUBLISHED
            and state.objects.get(key) is not r
            and any(x is not None and x.segment_id in state.segments for x in r.replicas)
        ]
        assert len(evicted) == report.objects_evicted, (evicted, report)
        evictable = [r for r in state.objects.values() if self.evictable(r)]
        self.check_eviction_order(evicted, evictable, by_segment=True)
        for segment in state.segments.values():
            allocator = segment.allocator
            if allocator.used > HIGH * allocator.capacity:
                assert not [r.key for r in evictable if _on(r, segment.segment_id)], (
                    f"{segment.segment_id} stays above the watermark with evictable objects"
                )
        capacity = sum(s.allocator.capacity for s in state.segments.values())
        if sum(s.allocator.used for s in state.segments.values()) > HIGH * capacity:
            assert not evictable, "the pool stays above the watermark with evictable objects"

    def check_eviction_order(
        self, evicted: list[ObjectRecord], survivors: list[ObjectRecord], by_segment: bool
    ) -> None:
        """Each evicted object was, in the index it was evicted from (the pool's or, above a
        segment's watermark, one of its segments'), never leased nor hard-pinned, and no more
        recently used than an evictable object of its class that survived; soft-pinned objects
        went only once no unpinned one was left to go."""
        for gone in evicted:
            assert self.evictable(gone), f"{gone.key} was evicted: leased or hard-pinned"
            indexes: list[str | None] = [None]  # None: the pool
            if by_segment:
                indexes += [r.segment_id for r in gone.replicas if r is not None]

            def in_order(index: str | None, gone: ObjectRecord = gone) -> bool:
                rivals = [s for s in survivors if index is None or _on(s, index)]
                if gone.pin is Pin.SOFT and any(s.pin is Pin.NONE for s in rivals):
                    return False
                return all(
                    self.last_use(gone) <= self.last_use(s) for s in rivals if s.pin is gone.pin
                )

            assert any(in_order(index) for index in indexes), (
                f"{gone.key} ({gone.pin!r}) evicted out of order; evictable survivors: "
                f"{[(s.key, s.pin.name, self.last_use(s)) for s in survivors]}, "
                f"it was last used at {self.last_use(gone)}"
            )

    # ------------------------------------------------------------------ nodes

    def mount_node(self, node: str, sizes: list[int]) -> None:
        for i, size in enumerate(sizes):
            info = segment_info(node, size, f"{node}/s{i}", base=0x1000_0000 * (i + 1))
            self.state.mount_segment(info)
            self.nodes.setdefault(node, {})[info.segment_id] = self.state.segments[info.segment_id]
        self.node_seen[node] = self.now

    @initialize(
        sizes=st.lists(
            st.lists(st.sampled_from(SEGMENT_SIZES), min_size=1, max_size=2), min_size=2, max_size=2
        )
    )
    def start_cluster(self, sizes):
        for node, node_sizes in zip(NODES, sizes, strict=False):
            self.mount_node(node, node_sizes)

    @rule(data=st.data())
    def node_event(self, data):
        """A node comes (a new one, or one that died or withdrew, with fresh segments), dies
        or withdraws a segment: one rule, so that nodes change less often than objects."""
        events = ["dies"] if len(self.nodes) >= 2 else []
        events += ["unmounts"] if self.nodes else []
        events += ["mounts"] if len(self.nodes) < len(NODES) else []
        event = data.draw(st.sampled_from(events))
        if event == "mounts":
            node = data.draw(st.sampled_from([n for n in NODES if n not in self.nodes]))
            sizes = data.draw(st.lists(st.sampled_from(SEGMENT_SIZES), min_size=1, max_size=2))
            self.mount_node(node, sizes)
        elif event == "dies":
            self.node_dies(data.draw(st.sampled_from(sorted(self.nodes))))
        else:
            node = data.draw(st.sampled_from(sorted(self.nodes)))
            self.node_unmounts(node, data.draw(st.sampled_from(sorted(self.nodes[node]))))

    def node_dies(self, node: str) -> None:
        """A node stops heartbeating: after node_ttl the next tick drops it and its replicas."""
        report = self.pass_time(CONFIG.node_ttl + 0.5, silent_nodes=(node,))
        assert node in report.dead_nodes
        assert node not in self.state.nodes

    def node_unmounts(self, node: str, segment_id: str) -> None:
        """A node withdraws a segment: it must keep the memory as long as anyone may read it."""
        segment = self.nodes[node][segment_id]
        waits = [g.until - self.now for g in self.live_guards() if g.buffer.segment is segment]
        lost = [
            key
            for key, record in self.state.objects.items()
            if {r.segment_id for r in record.replicas if r is not None} == {segment_id}
        ]

        removed, drain = self.state.unmount_segment(node, segment_id)

        assert removed == len(lost)
        assert drain == pytest.approx(max([0.0, *waits])), (drain, waits)
        del self.nodes[node][segment_id]
        if not self.nodes[node]:
            del self.nodes[node]
            del self.node_seen[node]
        self.forget_segments([segment])

    # ------------------------------------------------------------------ writers

    def start_puts(self, client, batch, replicas, pin, prefer) -> list[Reservation]:
        """One put_start call for a batch; checks every answer; returns the reservations."""
        state, now = self.state, self.now
        options = PutOptions(
            replicas=replicas,
            preferred_hosts=(host_of(prefer),) if prefer else (),
            pin=pin.pin,
            pin_ttl=pin.pin_ttl,
        )
        keys = [key for key, _ in batch]
        sizes = [size for _, size in batch]
        before = dict(state.objects)
        evictions = state.counters.evictions

        slots = state.put_start(client, keys, sizes, options)

        self.alive_clients.add(client)  # a client that puts is alive (put_start says so)
        self.client_seen[client] = now
        started: dict[str, Reservation] = {}
        for i, (key, size, slot) in enumerate(zip(keys, sizes, slots, strict=True)):
            if slot.status is KeyStatus.ALREADY_EXISTS:
                assert key in before or key in started, f"{key}: ALREADY_EXISTS, but it was not"
                continue
            if slot.status is KeyStatus.NO_SPACE:
                if i == len(keys) - 1:  # later keys of the batch did not change the pool since
                    self.check_no_space(size)
                continue
            assert slot.status is KeyStatus.OK, slot
            assert key not in started, f"{key} reserved twice in one batch"
            if key in before:  # it existed when the batch started: evicted for an earlier key
                assert before[key].state is ObjectState.PUBLISHED and self.evictable(before[key])
            nodes = [r.segment.node_id for r in slot.replicas]
            assert 1 <= len(nodes) <= (replicas or CONFIG.default_replicas)
            assert len(set(nodes)) == len(nodes), f"{key}: two replicas on one node: {nodes}"
            assert set(nodes) <= set(self.nodes)
            if prefer in nodes:
                assert nodes[0] == prefer, f"{key}: the preferred node is not first: {nodes}"
            buffers = []
            for replica in slot.replicas:
                buffer = self.buffer_of(
                    replica.segment.segment_id, replica.address - replica.segment.base_address
                )
                assert buffer.size >= rounded(size)
                for guard in self.live_guards():
                    assert not buffer.overlaps(guard.buffer), (
                        f"{key} was given bytes still guarded for {guard.why} of {guard.key!r} "
                        f"until {guard.until} (now {now}): {buffer} vs {guard.buffer}"
                    )
                buffers.append(buffer)
            started[key] = self.reservations[key] = Reservation(
                key, slot.put_id, client, size, now, buffers
            )
            pin_until = now + (pin.pin_ttl or CONFIG.soft_pin_ttl) if pin.pin is Pin.SOFT else 0.0
            self.pins[key, slot.put_id] = (pin.pin, pin_until)
        # Whatever vanished meanwhile was evicted to make room: least recently used first,
        # unpinned before soft-pinned, never a leased, hard-pinned or unpublished object.
        vanished = [r for k, r in before.items() if state.objects.get(k) is not r]
        assert len(vanished) == state.counters.evictions - evictions
        assert all(self.evictable(r) for r in vanished), [r.key for r in vanished]
        kept = [r for r in before.values() if self.evictable(r) and state.objects.get(r.key) is r]
        self.check_eviction_order(vanished, kept, by_segment=False)
        return list(started.values())

    @rule(client=st.sampled_from(CLIENTS), batch=BATCH, replicas=REPLICAS, pin=PINS, prefer=PREFER)
    def put_start(self, client, batch, replicas, pin, prefer):
        """A writer reserves space for a batch (and may commit later, or never)."""
        self.start_puts(client, batch, replicas, pin, prefer)

    @rule(
        client=st.sampled_from(CLIENTS),
        batch=BATCH,
        replicas=REPLICAS,
        pin=PINS,
        prefer=PREFER,
        data=st.data(),
    )
    def publish(self, client, batch, replicas, pin, prefer, data):
        """A writer puts a batch and commits it at once, some replicas possibly failed."""
        for reservation in self.start_puts(client, batch, replicas, pin, prefer):
            self.commit(reservation, data)

    def check_no_space(self, size: int) -> None:
        """NO_SPACE only when the object fits nowhere even after evicting what may be evicted."""
        segments = self.state.segments.values()
        assert all(s.allocator.largest_free < rounded(size) for s in segments)
        if size == 0:
            # A known bug (see test_master_semantics.py, the zero-byte put): no eviction at all.
            return
        if any(s.allocator.capacity >= size for s in segments):
            left = [r.key for r in self.state.objects.values() if self.evictable(r)]
            assert not left, f"NO_SPACE for {size} bytes although {left} could be evicted"

    def draw_reservation(self, data) -> Reservation:
        """Mostly an open reservation; sometimes one that ended (its writer is late)."""
        keys = sorted(self.reservations)
        open_keys = [k for k in keys if self.open(self.reservations[k])]
        if open_keys:
            return self.reservations[data.draw(st.sampled_from(open_keys) | st.sampled_from(keys))]
        return self.reservations[data.draw(st.sampled_from(keys))]

    @precondition(lambda self: self.reservations)
    @rule(data=st.data())
    def put_end(self, data):
        """A writer reports which replicas it wrote (some may have failed), maybe too late."""
        self.commit(self.draw_reservation(data), data)

    def commit(self, reservation: Reservation, data) -> None:
        key, put_id = reservation.key, reservation.put_id
        n = len(reservation.buffers)
        ok = tuple(
            data.draw(st.lists(st.sampled_from([True, True, True, False]), min_size=n, max_size=n))
        )
        crc32c = data.draw(st.none() | st.integers(0, 2**32 - 1))
        written = [b for b, good in zip(reservation.buffers, ok, strict=True) if good]
        kept = [b for b in written if b.mounted(self.state)]
        if self.open(reservation):
            expected = KeyStatus.OK if kept else KeyStatus.NO_REPLICA
        else:  # a retried commit of a published object is fine; anything else is stale
            record = self.state.objects.get(key)
            retried = record is not None and record.put_id == put_id
            expected = KeyStatus.OK if retried else KeyStatus.STALE_PUT
        was_open = self.open(reservation)

        [status] = end_puts(self.state, [Commit(key, put_id, ok, crc32c)])

        assert status is expected, (key, ok, status, expected)
        if was_open:
            reservation.ended = True
        if was_open and status is KeyStatus.OK:
            self.completed[key, put_id] = {(b.segment_id, b.offset) for b in kept}
            self.used_at[key, put_id] = next(self.uses)
            info = self.state.stat(key)
            assert (info.state, info.size, info.crc32c) == ("published", reservation.size, crc32c)
            placed = {
                (r.segment.segment_id, r.address - r.segment.base_address) for r in info.replicas
            }
            assert placed == self.completed[key, put_id]

    @precondition(lambda self: self.reservations)
    @rule(data=st.data())
    def put_revoke(self, data):
        """The writer gives up: its space returns at once."""
        reservation = self.draw_reservation(data)
        expected = KeyStatus.OK if self.open(reservation) else KeyStatus.STALE_PUT

        statuses = self.state.put_revoke([reservation.key], [reservation.put_id])

        assert statuses == [expected]
        reservation.ended = True

    @precondition(lambda self: self.alive_clients)
    @rule(data=st.data())
    def client_dies(self, data):
        """A client stops heartbeating: after client_ttl its reservations are revoked."""
        client = data.draw(st.sampled_from(sorted(self.alive_clients)))
        self.alive_clients.discard(client)
        self.pass_time(CONFIG.client_ttl + 0.5)
        assert not [
            k
            for k, r in self.state.objects.items()
            if r.client_id == client and r.state is ObjectState.RESERVED
        ]

    # ------------------------------------------------------------------ readers

    def expected_read(self, key: str) -> KeyStatus:
        record = self.state.objects.get(key)
        if record is None:
            return KeyStatus.NOT_FOUND
        return KeyStatus.OK if record.state is ObjectState.PUBLISHED else KeyStatus.NOT_READY

    @staticmethod
    def granted(asked: float) -> float:
        return CONFIG.lease_ttl if asked <= 0 else min(asked, CONFIG.max_lease_ttl)

    def draw_keys(self, data, unique: bool = False) -> list[str]:
        """A few keys, mostly of objects that exist."""
        known = sorted(self.state.objects)
        key = st.sampled_from(known) | st.sampled_from(KEYS) if known else st.sampled_from(KEYS)
        return data.draw(st.lists(key, min_size=1, max_size=3, unique=unique))

    @rule(data=st.data(), ttl=st.sampled_from(LEASES))
    def get_replicas(self, data, ttl):
        keys = self.draw_keys(data)
        expected = [self.expected_read(key) for key in keys]
        records = [self.state.objects.get(key) for key in keys]

        locations, granted = self.state.get_replicas(keys, ttl)

        assert granted == self.granted(ttl)
        assert [loc.status for loc in locations] == expected
        for key, record, location in zip(keys, records, locations, strict=True):
            if location.status is KeyStatus.OK:
                assert record is not None
                assert location.size == record.size
                assert location.crc32c == record.crc32c
                assert {
                    (r.segment.segment_id, r.address - r.segment.base_address)
                    for r in location.replicas
                } == {(r.segment_id, r.offset) for r in record.replicas if r is not None}
                self.grant(key, granted)

    @rule(data=st.data(), ttl=st.sampled_from(LEASES), lease=st.booleans())
    def exists(self, data, ttl, lease):
        keys = self.draw_keys(data)
        expected = [self.expected_read(key) for key in keys]
        remaining = {key: self.state.stat(key).lease_remaining for key in keys}

        statuses = self.state.exists(keys, ttl, grant_lease=lease)

        assert statuses == expected
        for key, status in zip(keys, statuses, strict=True):
            if status is KeyStatus.OK and lease:
                self.grant(key, self.granted(ttl))
            elif status is KeyStatus.OK:
                assert self.state.stat(key).lease_remaining == remaining[key], "no lease asked"

    # ------------------------------------------------------------------ removal

    @rule(data=st.data(), force=st.booleans())
    def remove(self, data, force):
        keys = self.draw_keys(data, unique=True)
        expected = [self.expected_removal(key, force) for key in keys]
        records = [self.state.objects.get(key) for key in keys]

        statuses = self.state.remove(keys, force)

        assert statuses == expected, (keys, force)
        for record, status in zip(records, statuses, strict=True):
            if status is KeyStatus.OK:
                assert record is not None and record.key not in self.state.objects
                self.removed(record, force)

    @rule(prefix=st.sampled_from(PREFIXES), force=st.booleans())
    def remove_prefix(self, prefix, force):
        matching = {k: r for k, r in self.state.objects.items() if k.startswith(prefix)}
        expected = {k: self.expected_removal(k, force) for k in matching}

        result = self.state.remove_prefix(prefix, force)

        statuses = list(expected.values())
        assert (result.removed, result.leased, result.not_ready) == (
            statuses.count(KeyStatus.OK),
            statuses.count(KeyStatus.HAS_LEASE),
            statuses.count(KeyStatus.NOT_READY),
        ), (prefix, force, expected)
        for key, record in matching.items():
            if expected[key] is KeyStatus.OK:
                assert key not in self.state.objects
                self.removed(record, force)
            else:
                assert self.state.objects.get(key) is record

    # ------------------------------------------------------------------ time

    @rule(seconds=st.sampled_from(STEPS))
    def time_passes(self, seconds):
        self.pass_time(seconds)

    def settle(self):
        """Long enough for every reservation, quarantine and lease to end: nothing is left over."""
        self.pass_time(CONFIG.reservation_timeout)
        self.pass_time(max(CONFIG.reclaim_delay, CONFIG.max_lease_ttl) + 1)
        state = self.state
        assert not [k for k, r in state.objects.items() if r.state is ObjectState.RESERVED]
        assert not self.live_guards()
        for segment in state.segments.values():
            allocations = segment.allocator.allocations()
            assert sorted(allocations) == sorted(segment.owners), (
                f"{segment.segment_id}: buffers nobody owns: "
                f"{sorted(set(allocations) - set(segment.owners))}"
            )
            for key in segment.owners.values():
                assert state.objects[key].state is ObjectState.PUBLISHED

    def teardown(self):
        if sys.exc_info()[0] is None:  # not over a failure: it would hide it
            self.settle()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def buffers_never_overlap(self):
        for segment in self.state.segments.values():
            end = 0
            for offset, size in sorted(segment.allocator.allocations().items()):
                assert offset >= end, f"{segment.segment_id}: buffer at {offset} overlaps"
                end = offset + size
            assert end <= segment.allocator.capacity, f"{segment.segment_id}: past its end"

    @invariant()
    def every_byte_is_allocated_or_free(self):
        for segment in self.state.segments.values():
            allocator = segment.allocator
            free = allocator.free_extents()
            assert allocator.used + sum(size for _, size in free) == allocator.capacity, (
                f"{segment.segment_id}: used {allocator.used} + free != {allocator.capacity}"
            )
            extents = sorted([*allocator.allocations().items(), *free])
            position = 0
            for offset, size in extents:
                assert offset == position, f"{segment.segment_id}: hole or overlap at {offset}"
                position += size
            assert position == allocator.capacity

    @invariant()
    def published_objects_have_complete_replicas(self):
        state = self.state
        for key, record in state.objects.items():
            if record.state is not ObjectState.PUBLISHED:
                continue
            assert record.replicas, f"{key} is published without a replica"
            nodes = []
            for replica in record.replicas:
                assert replica is not None
                segment = state.segments.get(replica.segment_id)
                assert segment is not None, f"{key}: replica in unmounted {replica.segment_id}"
                assert segment.owners.get(replica.offset) == key, f"{key}: replica not owned"
                assert segment.allocator.size_of(replica.offset) >= record.size
                assert (replica.segment_id, replica.offset) in self.completed[key, record.put_id], (
                    f"{key}: a replica its writer did not report written"
                )
                nodes.append(segment.node_id)
            assert len(set(nodes)) == len(nodes), f"{key}: two replicas on one node"

    @invariant()
    def guarded_bytes_are_kept(self):
        state = self.state
        for guard in self.live_guards():
            buffer = guard.buffer
            what = f"{guard.why} of {guard.key!r} (until {guard.until}, now {self.now})"
            assert buffer.mounted(state), f"segment {buffer.segment_id} vanished under a {what}"
            allocator = buffer.segment.allocator
            assert allocator.allocations().get(buffer.offset) == buffer.size, (
                f"bytes at {buffer.segment_id}+{buffer.offset} freed under a {what}"
            )
            owner = buffer.segment.owners.get(buffer.offset)
            if guard.attached:
                record = state.objects.get(guard.key)
                assert record is not None and record.put_id == guard.put_id, (
                    f"leased {guard.key!r} was evicted, removed without force or replaced: {what}"
                )
                assert owner == guard.key, f"{buffer} owned by {owner!r} under a {what}"
            else:
                assert owner is None, f"{buffer} handed to {owner!r} under a {what}"

    @invariant()
    def reservations_agree_with_the_model(self):
        state = self.state
        reserved = {
            (k, r.put_id) for k, r in state.objects.items() if r.state is ObjectState.RESERVED
        }
        expected = {(k, r.put_id) for k, r in self.reservations.items() if self.open(r)}
        assert reserved == expected
        for key, _ in reserved:
            replicas = state.objects[key].replicas
            buffers = self.reservations[key].buffers
            assert [(r.segment_id, r.offset) if r else None for r in replicas] == [
                (b.segment_id, b.offset) if b.mounted(state) else None for b in buffers
            ], f"{key}: replicas lost or moved"

    @invariant()
    def nodes_agree_with_the_model(self):
        assert {n: set(r.segment_ids) for n, r in self.state.nodes.items()} == {
            n: set(segments) for n, segments in self.nodes.items()
        }
        for node, segments in self.nodes.items():
            for segment_id, segment in segments.items():
                assert self.state.segments[segment_id] is segment, f"{node} remounted"


def _on(record: ObjectRecord, segment_id: str) -> bool:
    return any(r is not None and r.segment_id == segment_id for r in record.replicas)


def _counts(state: MasterState) -> dict[str, int]:
    c = state.counters
    return {
        "evictions": c.evictions,
        "nodes_died": c.nodes_died,
        "clients_died": c.clients_died,
        "reservations_reclaimed": c.reservations_reclaimed,
    }


# About 12,000 steps, in a few seconds; derandomized, so every run checks the same sequences.
MasterModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=80,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_master_model = MasterModel.TestCase
