"""Model check of the master's metadata core (``master/state.py``).

A hypothesis state machine drives ``MasterState`` (fake clock, seeded placement) through random
sequences of what happens to a small cluster: storage nodes with one or two small DRAM segments
and often an NVMe segment come, go away gracefully, die, or restart and remount their segments
with the objects they recorded; clients put batches of objects of random sizes, replica counts,
pins and tiers, commit them with random replica failures, revoke them or go silent; nodes answer
the master's Persist and Copy commands at once, later, with a failure, or not at all (the I/O
layer gives up: a failure to the master, though the node may have recorded the object, which
the master then tells it to forget);
readers take leases with ``get_replicas`` (which may promote NVMe objects to DRAM) and
``exists``; objects are removed one by one or by prefix, with or without force; time passes in
small steps and in large jumps; the master ticks (evicting, or demoting DRAM objects to NVMe).

Beside the master, the machine keeps a small model of its own: which reservations are open,
which commits wait for which nodes and which nodes recorded them, which copies are in flight,
which leases it was granted and until when, which buffers must not be reused yet (leases on
removed objects, quarantined reservations), which nodes and clients are alive, and what each
node's index holds (what it recorded, less what it was told to forget, though a node that
restarts may have missed some Forgets). After every step the invariants below compare the two:

1. no two live buffers of a segment overlap;
2. every byte of a segment is either allocated or free, never both, never neither;
3. every published object has at least one complete replica (one its writer reported written
   and its node recorded, one a node copied and acknowledged, or one a node reported on
   remount), in a mounted segment that owns it, of at least the object's size;
4. a leased object is never evicted, removed without force or overwritten, and its bytes are
   not handed out again before the lease ends, even after a forced removal or a demotion
   (likewise the bytes of a revoked reservation during the reclaim delay);
5. every reservation ends published or reclaimed: reservations and commits agree with the
   model, and once everything has timed out and every node answered (``settle``, also run at
   the end of every example) no reservation, commit or copy is left, every allocated byte
   belongs to a replica of a published object, and every lease granted was counted as ended;
6. a copy in flight (demotion or promotion) leaves its object readable, with its source
   replica, until the node acknowledges it; its target is allocated to the object meanwhile,
   and a demotion's bytes count as leaving their DRAM segment.

Each event is also checked against the model as it happens: every status a call returns (the
model predicts HAS_LEASE, NOT_READY, STALE_PUT, NO_REPLICA...); every commit that waited for its
nodes comes out of ``resolved`` exactly once with the status the model predicts; every command
for a node names a mounted segment of that node (a Forget never names a replica the master still
keeps), every Persist the replicas awaiting that node, every Copy a published object and a
target on the same node in the other tier; a remount adopts exactly what the adoption rules say
(newest generation first, at its exact offset, never over another buffer, never over a key
being written, superseding older generations) and leases it; a later put gets a larger
generation than any object known; a tick declares dead exactly the clients (holding
reservations) and nodes that went silent, reclaims exactly the reservations due, ends exactly
the soft pins due, and leaves no segment (nor either tier of the pool) above the watermark
while something there may still be evicted or demoted; eviction, at a tick or to make room for
a put, goes in least-recently-used order (the model keeps its own recency), unpinned objects
before soft-pinned ones; NO_SPACE only once nothing evictable is left in the tiers tried;
unmounting a segment reports a drain time exactly as long as the longest guard on its bytes.

Placement within a node iterates a set of segment ids, so with two equally free segments the
choice may differ between interpreter runs (string hashing is salted): the examples are
derandomized, the model predicts nothing that depends on that choice.
"""

from __future__ import annotations

import itertools
import random
import sys
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

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

from kvpool.common.status import KeyStatus, Pin, Tier
from kvpool.master.config import MasterConfig
from kvpool.master.records import (
    Commit,
    CopyCommand,
    ForgetCommand,
    ObjectRecord,
    ObjectState,
    PersistCommand,
    PrepareCommand,
    PutOptions,
    Replica,
    SegmentInfo,
    SegmentRecord,
    StoredObject,
    TickReport,
)
from kvpool.master.state import MasterState

# Production timings (lease 10 s, node TTL 5 s, ...) but for reservations, which time out and
# leave quarantine sooner, so that space turns over within one example, and for writers, declared
# dead after 4 s of silence: before their reservations (8 s) time out.
CONFIG = MasterConfig(
    reservation_timeout=8.0, reclaim_delay=12.0, max_lease_ttl=120.0, client_ttl=4.0
)
NODES = ("n0", "n1", "n2", "n3")
CLIENTS = ("c0", "c1", "c2")
KEYS = ("a0", "a1", "a2", "a3", "a/0", "a/1", "a/2", "a/3", "ab", "b", "b/0", "b/1", "c0", "c1")
PREFIXES = ("", "a", "a/", "ab", "b", "b/", "c", "zz")
DRAM_SIZES = (1000, 2048, 4096)  # 1000 rounds down to 960 usable bytes
NVME_SIZES = (None, 2048, 4096, 4096)  # None: the node has no NVMe segment
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
TIERS = st.sampled_from([*[Tier.UNSPECIFIED] * 5, Tier.DRAM, Tier.NVME, Tier.NVME])
BATCH = st.lists(
    st.tuples(st.sampled_from(KEYS), st.integers(0, 1500) | st.integers(500, 1400)),
    min_size=1,
    max_size=4,
)
REPLICAS = st.integers(0, 3)
PREFER = st.sampled_from([None, *NODES])
#: How a node answers a command: "ok"; "failed" (it recorded nothing); "timeout" (the I/O layer
#: gave up and tells the master it failed, but the node did record it).
ANSWERS = st.sampled_from(["ok"] * 6 + ["failed", "timeout"])
LAYOUT = st.tuples(
    st.lists(st.sampled_from(DRAM_SIZES), min_size=0, max_size=2),
    st.sampled_from(NVME_SIZES),
    st.booleans(),  # DRAM on /dev/shm: persistent
)
HIGH = CONFIG.high_watermark


def host_of(node: str) -> str:
    return f"{node}.cluster.local"  # what segment_info says


def node_crc(item: StoredObject) -> int:
    """The checksum a node computes of what it holds."""
    return zlib.crc32(f"{item.key}/{item.generation}".encode())


@dataclass(frozen=True)
class SegmentSpec:
    """A segment a node has, across its restarts."""

    segment_id: str
    index: int  # its place on the node: its base address
    size: int
    tier: Tier
    persistent: bool


def make_layout(node: str, drams: list[int], nvme: int | None, shm: bool) -> list[SegmentSpec]:
    if not drams and nvme is None:
        drams = [2048]
    specs = [SegmentSpec(f"{node}/d{i}", i, size, Tier.DRAM, shm) for i, size in enumerate(drams)]
    if nvme is not None:
        specs.append(SegmentSpec(f"{node}/nvme", 2, nvme, Tier.NVME, True))
    return specs


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

    def place(self) -> tuple[int, int]:
        return (id(self.segment), self.offset)


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
class Committing:
    """A committed object waiting for its nodes to record it."""

    key: str
    put_id: int
    size: int
    crc32c: int | None
    unacked: dict[int, Buffer]  # id(segment) -> the replica whose node has not answered
    persisted: list[Buffer]  # replicas their nodes recorded


@dataclass
class Moving:
    """A copy in flight: a demotion (DRAM to NVMe) or a promotion (NVMe to DRAM)."""

    record: ObjectRecord
    source: Buffer
    target: Buffer
    demotion: bool

    @property
    def ident(self) -> tuple[str, int]:
        return (self.record.key, self.record.put_id)


@dataclass
class Sent:
    """A Persist or Copy command the master awaits an answer to, and the segment it went to."""

    command: PersistCommand | CopyCommand
    segment: SegmentRecord


@dataclass
class Guard:
    """Bytes that must stay allocated (never handed out again) until ``until``: those of a
    leased object (``attached``: the object must still own them), of a leased object removed by
    force or demoted, of a revoked reservation whose writer may still be copying, or the target
    of a cancelled copy that its node may still be writing (until it answers)."""

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
        #: node -> its segments (kept while it is down: a node that restarts has them again).
        self.layout: dict[str, list[SegmentSpec]] = {}
        self.boots: Counter[str] = Counter()  # restarts of each node: new segment infos
        #: alive node -> its mounted segments (those the master must keep).
        self.nodes: dict[str, dict[str, SegmentRecord]] = {}
        self.node_seen: dict[str, float] = {}
        #: Every segment record the model met (so that ids of dropped ones stay unique).
        self.segment_records: list[SegmentRecord] = []
        #: clients that keep heartbeating, and when the master last heard of each writer.
        self.alive_clients: set[str] = set()
        self.client_seen: dict[str, float] = {}
        self.reservations: dict[str, Reservation] = {}  # key -> its latest reservation
        self.committing: dict[tuple[str, int], Committing] = {}
        self.crc_of: dict[tuple[str, int], int | None] = {}  # checksums of finished commits
        self.sent: dict[int, Sent] = {}  # command id -> a command awaiting its node's answer
        self.moves: dict[int, Moving] = {}  # command id -> a copy in flight (not cancelled)
        self.issued: set[int] = set()
        #: CommitResults the master owes (compared with ``state.resolved`` after each call).
        self.owed: Counter[tuple[str, int, KeyStatus]] = Counter()
        #: (key, put_id) -> where complete copies live: (id(segment), offset).
        self.complete: dict[tuple[str, int], set[tuple[int, int]]] = {}
        self.pins: dict[tuple[str, int], tuple[Pin, float]] = {}  # (pin, pin_until)
        self.lease_until: dict[tuple[str, int], float] = {}
        self.guards: dict[tuple, Guard] = {}
        #: id(record) -> record, for each object with a lease whose end is not counted yet.
        self.open_leases: dict[int, ObjectRecord] = {}
        self.lease_periods = 0
        #: When each object was last used (published, read, adopted, or its soft pin ended),
        #: and when it was added to a segment after its last use (a copy or an adoption): the
        #: master evicts in this order, unpinned objects first.
        self.used_at: dict[tuple[str, int], int] = {}
        self.added_at: dict[tuple[tuple[str, int], int], int] = {}
        self.uses = itertools.count()
        self.max_generation = 0
        #: segment id -> key -> what the node's index holds (one entry per key, like a node).
        self.disk: dict[str, dict[str, StoredObject]] = defaultdict(dict)
        #: segment id -> key -> an entry a Forget removed (a node that crashes may miss it).
        self.missed: dict[str, dict[str, StoredObject]] = defaultdict(dict)
        #: (id(segment), key, generation, offset) of every Forget sent: the node has it after
        #: the command it follows in its stream, whatever order the answers come in.
        self.forgotten: set[tuple[int, str, int, int]] = set()

    # ------------------------------------------------------------------ model helpers

    @property
    def now(self) -> float:
        return self.clock()

    def open(self, reservation: Reservation) -> bool:
        """Still a reservation at the master: not ended, and not every replica lost."""
        return not reservation.ended and any(b.mounted(self.state) for b in reservation.buffers)

    def leased(self, key: str, put_id: int) -> bool:
        return self.lease_until.get((key, put_id), 0.0) > self.now

    def moving(self) -> set[tuple[str, int]]:
        return {move.ident for move in self.moves.values()}

    def evictable(self, record: ObjectRecord, moving: set | None = None) -> bool:
        ident = (record.key, record.put_id)
        return (
            record.state is ObjectState.PUBLISHED
            and self.pins[ident][0] is not Pin.HARD
            and not self.leased(*ident)
            and ident not in (self.moving() if moving is None else moving)
        )

    def rank(self, record: ObjectRecord, index: tuple[str, object]) -> int:
        """Where ``record`` stands in an eviction index: the pool's (a tier) or a segment's."""
        ident = (record.key, record.put_id)
        kind, where = index
        if kind == "pool":
            return self.used_at[ident]
        return max(self.used_at[ident], self.added_at.get((ident, id(where)), -1))

    def buffer_of(self, segment_id: str, offset: int) -> Buffer:
        segment = self.state.segments[segment_id]
        return Buffer(segment, offset, segment.allocator.size_of(offset))

    def tier_of(self, replica: Replica) -> Tier:
        return self.state.segments[replica.segment_id].info.tier

    def live_guards(self) -> list[Guard]:
        return [g for g in self.guards.values() if g.until > self.now]

    def keep(self, segment: SegmentRecord) -> SegmentRecord:
        self.segment_records.append(segment)
        return segment

    def fingerprint(self) -> tuple:
        """Everything a no-op must leave as it was."""
        state = self.state
        return (
            {
                segment_id: (
                    id(segment),
                    sorted(segment.allocator.allocations().items()),
                    sorted(segment.owners.items()),
                    segment.leaving,
                )
                for segment_id, segment in state.segments.items()
            },
            {
                key: (
                    r.put_id,
                    r.state,
                    list(r.replicas),
                    sorted(r.moving),
                    sorted(r.unacked),
                    r.crc32c,
                    r.lease_until,
                )
                for key, r in state.objects.items()
            },
            dict(state.nodes),
        )

    def guard_lease(self, record: ObjectRecord, until: float) -> None:
        for replica in record.replicas:
            assert replica is not None
            buffer = self.buffer_of(replica.segment_id, replica.offset)
            guard_key = ("lease", record.key, record.put_id, id(buffer.segment), replica.offset)
            self.guards[guard_key] = Guard(
                "lease", record.key, record.put_id, buffer, until, attached=True
            )

    def grant(self, key: str, ttl: float) -> None:
        """The master granted (or extended) a lease of ``ttl`` seconds on ``key``."""
        record = self.state.objects[key]
        ident = (key, record.put_id)
        previous = self.lease_until.get(ident, 0.0)
        if id(record) not in self.open_leases or previous <= self.now:
            self.lease_periods += 1  # a new lease, not an extension: its end is counted once
            self.open_leases[id(record)] = record
        until = max(previous, self.now + ttl)
        self.lease_until[ident] = until
        self.used_at[ident] = next(self.uses)
        self.guard_lease(record, until)
        info = self.state.stat(key)
        assert info.lease_remaining == pytest.approx(until - self.now), (
            f"{key}: lease should last {until - self.now} s more, stat says {info}"
        )

    def detach(self, key: str, put_id: int, buffer: Buffer | None = None) -> None:
        """The object is gone (removed by force), or it left ``buffer`` (a demotion): its leased
        bytes stay guarded, unowned."""
        for guard in self.guards.values():
            if (guard.key, guard.put_id) == (key, put_id) and (
                buffer is None or guard.buffer.place() == buffer.place()
            ):
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

    def cancel_moves(self, ident: tuple[str, int]) -> list[Moving]:
        cancelled = {c: m for c, m in self.moves.items() if m.ident == ident}
        self.moves = {c: m for c, m in self.moves.items() if m.ident != ident}
        for command_id, move in cancelled.items():
            self.guard_copy(command_id, move)
        return list(cancelled.values())

    def guard_copy(self, command_id: int, move: Moving, until: float = float("inf")) -> None:
        """A copy's target must not be reused while its node may still write there: until the
        node answers (``until`` infinite), or for the reclaim delay after the I/O layer gave
        up."""
        key, put_id = move.ident
        self.guards[("copy", command_id)] = Guard("copy", key, put_id, move.target, until, False)

    def removed(self, record: ObjectRecord, force: bool) -> set[tuple[str, str, int]]:
        """The master removed ``record`` (status OK from remove or remove_prefix, or superseded
        on adoption); returns the Forgets it owes the nodes: (segment id, key, offset)."""
        ident = (record.key, record.put_id)
        if record.state is ObjectState.RESERVED:
            assert force, f"{record.key}: a reservation removed without force"
            reservation = self.reservations[record.key]
            assert reservation.put_id == record.put_id
            self.quarantine(reservation)
            return set()
        forgets = {(r.segment_id, record.key, r.offset) for r in record.replicas if r is not None}
        if record.state is ObjectState.COMMITTED:
            assert force, f"{record.key}: a commit removed without force"
            del self.committing[ident]
            self.owed[record.key, record.put_id, KeyStatus.STALE_PUT] += 1
        else:
            assert force or not self.leased(*ident)
            self.detach(*ident)
            for move in self.cancel_moves(ident):
                forgets.add((move.target.segment_id, record.key, move.target.offset))
                if self.leased(*ident):  # the target's space waits for the lease too
                    guard_key = ("lease", *ident, id(move.target.segment), move.target.offset)
                    until = self.lease_until[ident]
                    self.guards[guard_key] = Guard("lease", *ident, move.target, until, False)
        return forgets

    def expected_removal(self, key: str, force: bool) -> KeyStatus:
        record = self.state.objects.get(key)
        if record is None:
            return KeyStatus.NOT_FOUND
        if record.state is not ObjectState.PUBLISHED and not force:
            return KeyStatus.NOT_READY
        if self.leased(key, record.put_id) and not force:
            return KeyStatus.HAS_LEASE
        return KeyStatus.OK

    def writing(self, client: str) -> bool:
        return any(r.client == client and self.open(r) for r in self.reservations.values())

    def heartbeat(self, silent_nodes=(), silent_clients=()) -> None:
        for node, segments in self.nodes.items():
            if node not in silent_nodes:
                assert self.state.heartbeat(node, sorted(segments)) == [], f"{node} must remount"
                self.node_seen[node] = self.now
        for client in self.alive_clients - set(silent_clients):
            self.state.client_heartbeat(client)
            if self.writing(client):  # the master tracks writers only
                self.client_seen[client] = self.now

    # ------------------------------------------------------------------ commands and commits

    def collect(self, copies: str | None = None) -> list:
        """Takes the commands the master queued for its nodes, checks each (``copies``: the
        kind of Copy this event may start, if any), and the commits it resolved."""
        state = self.state
        commands = list(state.outbox)
        state.outbox.clear()
        for command in commands:
            assert command.command_id not in self.issued, "a command id used twice"
            self.issued.add(command.command_id)
            if isinstance(command, ForgetCommand):
                self.check_forget(command)
            elif isinstance(command, PrepareCommand):
                self.check_prepare(command)
            elif isinstance(command, PersistCommand):
                self.check_persist(command)
            else:
                assert isinstance(command, CopyCommand), command
                self.check_copy(command, copies)
        resolved = Counter((r.key, r.put_id, r.status) for r in state.resolved)
        state.resolved.clear()
        assert resolved == self.owed, f"commits resolved: {resolved}, expected {self.owed}"
        self.owed = Counter()
        return commands

    def node_segment(self, node_id: str, segment_id: str) -> SegmentRecord:
        segment = self.state.segments.get(segment_id)
        assert segment is not None, f"a command for {segment_id}, which is not mounted"
        assert segment.node_id == node_id, f"a command for {segment_id} sent to {node_id}"
        return segment

    def check_forget(self, command: ForgetCommand) -> None:
        segment = self.node_segment(command.node_id, command.segment_id)
        for item in command.objects:
            record = self.state.objects.get(item.key)
            if record is not None and record.put_id == item.generation:
                held = {(r.segment_id, r.offset) for r in record.replicas if r is not None}
                held |= {(m.target.segment_id, m.target.offset) for m in record.moving.values()}
                assert (command.segment_id, item.offset) not in held, (
                    f"{command.node_id} told to forget {item.key!r}, which it holds for the master"
                )
            self.forgotten.add((id(segment), item.key, item.generation, item.offset))
            self.forget_on_disk(command.segment_id, item)

    def forget_on_disk(self, segment_id: str, item: StoredObject) -> None:
        entry = self.disk[segment_id].get(item.key)
        if entry is not None and (entry.offset, entry.generation) == (item.offset, item.generation):
            del self.disk[segment_id][item.key]
            self.missed[segment_id][item.key] = entry

    def record_on_disk(self, segment: SegmentRecord, item: StoredObject) -> None:
        """The node recorded ``item`` (unless told to forget it already: that came later)."""
        if not self.mounted(segment):
            return  # the node restarted meanwhile: it never got the command
        if (id(segment), item.key, item.generation, item.offset) in self.forgotten:
            return
        self.disk[segment.segment_id][item.key] = item
        self.missed[segment.segment_id].pop(item.key, None)

    def mounted(self, segment: SegmentRecord) -> bool:
        return self.state.segments.get(segment.segment_id) is segment

    def check_prepare(self, command: PrepareCommand) -> None:
        segment = self.node_segment(command.node_id, command.segment_id)
        assert segment.info.tier is Tier.NVME, "only file-backed space is prepared"
        record = self.state.objects.get(segment.owners.get(command.offset, ""))
        assert record is not None and record.state is ObjectState.RESERVED
        assert command.size == record.size > 0

    def check_persist(self, command: PersistCommand) -> None:
        segment = self.node_segment(command.node_id, command.segment_id)
        for item in command.objects:
            record = self.state.objects[item.key]
            ident = (item.key, item.generation)
            assert record.put_id == item.generation and record.state is ObjectState.COMMITTED
            waiting = self.committing[ident]
            buffer = waiting.unacked.get(id(segment))
            assert buffer is not None, f"{item.key}: a Persist to {segment.segment_id} not awaited"
            assert (item.offset, item.size, item.crc32c) == (
                buffer.offset,
                waiting.size,
                waiting.crc32c,
            )
        self.sent[command.command_id] = Sent(command, segment)

    def check_copy(self, command: CopyCommand, kind: str | None) -> None:
        state = self.state
        source_segment = self.node_segment(command.node_id, command.source_segment_id)
        target_segment = self.node_segment(command.node_id, command.target_segment_id)
        demotion = source_segment.info.tier is Tier.DRAM
        assert target_segment.info.tier is (Tier.NVME if demotion else Tier.DRAM)
        assert kind == ("demotion" if demotion else "promotion"), f"a Copy during {kind}"
        key = command.source.key
        record = state.objects[key]
        assert record.state is ObjectState.PUBLISHED
        assert command.source.generation == command.target.generation == record.put_id
        assert command.source.size == command.target.size == record.size
        assert command.source.crc32c == command.target.crc32c == record.crc32c
        assert Replica(command.source_segment_id, command.source.offset) in record.replicas
        assert Replica(command.target_segment_id, command.target.offset) not in record.replicas
        assert target_segment.owners.get(command.target.offset) == key
        assert list(record.moving) == [command.command_id], "one copy at a time"
        target = self.buffer_of(command.target_segment_id, command.target.offset)
        for guard in self.live_guards():
            assert not target.overlaps(guard.buffer), f"{key} copied over guarded bytes"
        source = self.buffer_of(command.source_segment_id, command.source.offset)
        self.moves[command.command_id] = Moving(record, source, target, demotion)
        self.sent[command.command_id] = Sent(command, target_segment)

    def finish_commit(self, ident: tuple[str, int]) -> KeyStatus:
        """Every node of a committed object answered (or went away): it is published with the
        replicas their nodes recorded, or NO_REPLICA. The master owes its writer the answer."""
        waiting = self.committing.pop(ident)
        self.crc_of[ident] = waiting.crc32c
        kept = [b for b in waiting.persisted if b.mounted(self.state)]
        status = KeyStatus.OK if kept else KeyStatus.NO_REPLICA
        self.owed[ident[0], ident[1], status] += 1
        if kept:
            self.complete[ident] = {b.place() for b in kept}
            self.used_at[ident] = next(self.uses)
        return status

    def check_published(self, ident: tuple[str, int], status: KeyStatus, crc32c: int | None):
        """What the master made of a commit whose nodes all answered, just now."""
        key, put_id = ident
        record = self.state.objects.get(key)
        if status is KeyStatus.NO_REPLICA:
            assert record is None or record.put_id != put_id, f"{key}: NO_REPLICA, but kept"
            return
        assert record is not None and record.put_id == put_id
        assert record.state is ObjectState.PUBLISHED
        info = self.state.stat(key)
        assert info.crc32c == crc32c
        assert {
            (id(self.state.segments[r.segment_id]), r.offset) for r in record.replicas
        } == self.complete[ident], f"{key}: published with replicas its nodes did not record"

    def segment_gone(self, segment: SegmentRecord) -> None:
        """A segment was dropped (its node died, withdrew it, or remounted it changed)."""
        self.guards = {k: g for k, g in self.guards.items() if g.buffer.segment is not segment}
        for command_id, move in list(self.moves.items()):
            if segment in (move.source.segment, move.target.segment):
                del self.moves[command_id]
                if move.target.segment is not segment:
                    self.guard_copy(command_id, move)
        for ident, waiting in list(self.committing.items()):
            waiting.persisted = [b for b in waiting.persisted if b.segment is not segment]
            if waiting.unacked.pop(id(segment), None) is not None and not waiting.unacked:
                self.finish_commit(ident)

    def answer(self, command_id: int, how: str, data=None) -> None:
        """A node answers a Persist or Copy command (or the I/O layer gives up on it)."""
        sent = self.sent.pop(command_id)
        assert self.state.awaiting(command_id)
        ok = how == "ok"
        command = sent.command
        crcs: list[int] = []
        if ok and data is not None and data.draw(st.booleans(), label="with checksums"):
            items = command.objects if isinstance(command, PersistCommand) else (command.target,)
            crcs = [node_crc(item) for item in items]
        if isinstance(command, PersistCommand):
            self.answer_persist(command, sent.segment, how, crcs)
        else:
            self.answer_copy(command, sent.segment, how, crcs)
        assert not self.state.awaiting(command_id)

    def tell(self, command_id: int, how: str, crcs: list[int]) -> None:
        """Hands the master a node's answer, or the I/O layer's giving up on it."""
        if how == "timeout":
            self.state.command_expired(command_id)
        else:
            self.state.command_done(command_id, how == "ok", crcs)

    def answer_persist(
        self, command: PersistCommand, segment: SegmentRecord, how: str, crcs: list[int]
    ) -> None:
        ok = how == "ok"
        touched, failed, finished = [], [], []
        for i, item in enumerate(command.objects):
            ident = (item.key, item.generation)
            waiting = self.committing.get(ident)
            if waiting is None or id(segment) not in waiting.unacked:
                continue  # answered already, or the object is gone
            if waiting.crc32c is None and i < len(crcs):
                waiting.crc32c = crcs[i]
            buffer = waiting.unacked.pop(id(segment))
            (waiting.persisted if ok else failed).append(buffer)
            touched.append(ident)
            if not waiting.unacked:
                finished.append(ident)
        if how != "failed":
            for item in command.objects:
                self.record_on_disk(segment, item)
        before = None if touched else self.fingerprint()

        self.tell(command.command_id, how, crcs)

        if before is not None:
            assert self.fingerprint() == before, "a late answer changed the master's state"
        for buffer in failed:  # a replica its node could not record is freed at once
            assert buffer.offset not in buffer.segment.owners
            assert buffer.offset not in buffer.segment.allocator.allocations()
        outcomes = [(ident, self.finish_commit(ident)) for ident in finished]
        self.collect()
        for ident, status in outcomes:
            self.check_published(ident, status, self.crc_of[ident])

    def answer_copy(
        self, command: CopyCommand, segment: SegmentRecord, how: str, crcs: list[int]
    ) -> None:
        ok = how == "ok"
        if how != "failed":
            self.record_on_disk(segment, command.target)
        move = self.moves.pop(command.command_id, None)
        if move is None:  # cancelled: its object went, or a segment of its node did
            before = self.fingerprint()
            self.tell(command.command_id, how, crcs)
            after = self.fingerprint()
            guard = self.guards.pop(("copy", command.command_id), None)
            if guard is not None and how == "timeout":  # the node may still write there
                guard.until = self.now + CONFIG.reclaim_delay
                self.guards[("copy", command.command_id)] = guard
            assert after[1:] == before[1:], "the answer to a cancelled copy changed objects"
            for segment_id, (ident, _, owners, leaving) in after[0].items():
                assert before[0][segment_id][0] == ident and before[0][segment_id][2] == owners
                assert before[0][segment_id][3] == leaving
            self.collect()
            return
        record, ident = move.record, move.ident
        replicas = list(record.replicas)
        crc_before = record.crc32c
        counters = (self.state.counters.demotions, self.state.counters.promotions)

        self.tell(command.command_id, how, crcs)

        commands = self.collect()
        assert not record.moving
        if not ok:
            assert record.replicas == replicas
            assert move.target.offset not in move.target.segment.owners
            allocated = move.target.offset in move.target.segment.allocator.allocations()
            if how == "timeout":  # its node may still be writing there
                assert allocated, "a copy target reused though its node may still write it"
                self.guard_copy(command.command_id, move, self.now + CONFIG.reclaim_delay)
            else:
                assert not allocated, "the target of a failed copy was not freed"
            assert counters == (self.state.counters.demotions, self.state.counters.promotions)
            return
        source = Replica(move.source.segment_id, move.source.offset)
        target = Replica(move.target.segment_id, move.target.offset)
        if move.demotion:
            assert record.replicas == [r for r in replicas if r != source] + [target]
            assert self.state.counters.demotions == counters[0] + 1
            forgets = {
                (c.segment_id, o.key, o.offset)
                for c in commands
                if isinstance(c, ForgetCommand)
                for o in c.objects
            }
            assert (source.segment_id, record.key, source.offset) in forgets
            self.detach(*ident, move.source)
            assert source.offset not in move.source.segment.owners
        else:
            assert record.replicas == [*replicas, target]
            assert self.state.counters.promotions == counters[1] + 1
        assert record.crc32c == (crcs[0] if crc_before is None and crcs else crc_before)
        self.complete[ident].add(move.target.place())
        self.added_at[ident, id(move.target.segment)] = next(self.uses)
        if self.leased(*ident):
            self.guard_lease(record, self.lease_until[ident])

    # ------------------------------------------------------------------ time

    def pass_time(self, seconds: float, silent_nodes=(), silent_clients=()) -> TickReport:
        """``seconds`` pass, everyone alive (but the silent) heartbeats, the master ticks; the
        tick must do exactly what the model expects."""
        self.clock.advance(seconds)
        self.heartbeat(silent_nodes, silent_clients)
        now = self.now
        state = self.state
        reserved = {k: r for k, r in self.reservations.items() if self.open(r)}
        due = {k for k, r in reserved.items() if r.created_at <= now - CONFIG.reservation_timeout}
        dying_clients = {  # writers that still hold reservations once those due are reclaimed
            r.client
            for k, r in reserved.items()
            if k not in due and self.client_seen[r.client] < now - CONFIG.client_ttl
        }
        reclaimed = due | {k for k, r in reserved.items() if r.client in dying_clients}
        dying_nodes = {n for n in self.nodes if self.node_seen[n] < now - CONFIG.node_ttl}
        before = {key: (record, list(record.replicas)) for key, record in state.objects.items()}
        pins_before = {key: record.pin for key, record in state.objects.items()}
        counters = _counts(state)

        report = state.tick()

        assert set(report.dead_clients) == dying_clients, (report.dead_clients, dying_clients)
        assert sorted(report.reservations_reclaimed) == sorted(reclaimed), report
        assert sorted(report.dead_nodes) == sorted(dying_nodes), report
        for client in dying_clients:
            self.alive_clients.discard(client)
        for key in reclaimed:
            self.quarantine(self.reservations[key])
        for node in dying_nodes:
            for segment in self.nodes.pop(node).values():
                self.segment_gone(segment)
            del self.node_seen[node]
        moving = self.moving()  # what eviction had to leave alone
        commands = self.collect(copies="demotion")
        demoted = {c.source.key: c for c in commands if isinstance(c, CopyCommand)}

        unpinned = next(self.uses)  # soft pins ended now: these objects count as just used
        for key, record in state.objects.items():
            if record.state is not ObjectState.PUBLISHED:
                continue
            pin, pin_until = self.pins[key, record.put_id]
            if pin is Pin.SOFT and pin_until <= now:
                pin = Pin.NONE
                self.pins[key, record.put_id] = (pin, 0.0)
            assert record.pin is pin, f"{key}: pin {record.pin!r}, expected {pin!r}"
            if pins_before.get(key) is Pin.SOFT and pin is Pin.NONE:
                self.used_at[key, record.put_id] = unpinned
        self.open_leases = {k: r for k, r in self.open_leases.items() if r.lease_until > now}

        after = _counts(state)
        assert after["evictions"] - counters["evictions"] == report.objects_evicted
        assert after["nodes_died"] - counters["nodes_died"] == len(report.dead_nodes)
        assert after["clients_died"] - counters["clients_died"] == len(report.dead_clients)
        reclaimed_count = after["reservations_reclaimed"] - counters["reservations_reclaimed"]
        assert reclaimed_count == len(reclaimed)
        self.check_eviction(before, report, moving, demoted)
        self.guards = {k: g for k, g in self.guards.items() if g.until > now}
        return report

    def victims(
        self, before: dict[str, tuple[ObjectRecord, list]], demoted: dict[str, CopyCommand]
    ) -> tuple[list[ObjectRecord], list[tuple[ObjectRecord, list[Replica]]]]:
        """What eviction took, from what ``before`` held: objects evicted, and each object that
        lost replicas to it (evicted, a replica dropped, or demoted) with those replicas."""
        state = self.state
        evicted, victims = [], []
        for key, (record, replicas) in before.items():
            if record.state is not ObjectState.PUBLISHED:
                continue
            taken = [r for r in replicas if r is not None and r.segment_id in state.segments]
            if state.objects.get(key) is not record:
                if taken:  # (not a loss with its node)
                    evicted.append(record)
                    victims.append((record, taken))
            else:
                dropped = [r for r in taken if r not in record.replicas]
                if dropped:
                    victims.append((record, dropped))
        for key, copy in demoted.items():
            record = state.objects[key]
            assert len(record.replicas) == 1, f"{key}: demoted although it has a twin"
            victims.append((record, [Replica(copy.source_segment_id, copy.source.offset)]))
        return evicted, victims

    def check_eviction(
        self,
        before: dict[str, tuple[ObjectRecord, list]],
        report: TickReport,
        moving: set[tuple[str, int]],
        demoted: dict[str, CopyCommand],
    ) -> None:
        state = self.state
        evicted, victims = self.victims(before, demoted)
        assert len(evicted) == report.objects_evicted, (evicted, report)
        for record, _ in victims:
            assert self.evictable(record, moving), f"{record.key} evicted: leased, pinned, moving"
        touched = {id(record) for record, _ in victims}
        survivors = [
            r for r in state.objects.values() if self.evictable(r, moving) and id(r) not in touched
        ]
        self.check_eviction_order(victims, survivors, by_segment=True)
        leaving = self.leaving()
        evictable = [r for r in state.objects.values() if self.evictable(r)]  # not moving now
        for segment in state.segments.values():
            allocator = segment.allocator
            if allocator.used - leaving[id(segment)] > HIGH * allocator.capacity:
                assert not [r.key for r in evictable if _on(r, segment.segment_id)], (
                    f"{segment.segment_id} stays above the watermark with evictable objects"
                )
        # (Objects that lost a replica this tick may keep others: see
        # test_a_tick_brings_the_dram_pool_below_the_watermark_when_replicas_may_go.)
        thinned = self.thinned(before)
        for tier in (Tier.DRAM, Tier.NVME):
            segments = [s for s in state.segments.values() if s.info.tier is tier]
            capacity = sum(s.allocator.capacity for s in segments)
            used = sum(s.allocator.used - leaving[id(s)] for s in segments)
            if used > HIGH * capacity:
                left = [
                    r.key
                    for r in evictable
                    if id(r) not in thinned and any(self.tier_of(x) is tier for x in r.replicas)
                ]
                assert not left, f"the {tier.name} pool stays above the watermark with {left}"

    def leaving(self) -> defaultdict[int, int]:
        """Bytes demotions in flight are taking out of each segment (by id)."""
        leaving: defaultdict[int, int] = defaultdict(int)
        for move in self.moves.values():
            if move.demotion:
                leaving[id(move.source.segment)] += move.source.size
        return leaving

    def check_eviction_order(
        self,
        victims: list[tuple[ObjectRecord, list[Replica]]],
        survivors: list[ObjectRecord],
        by_segment: bool,
    ) -> None:
        """Each victim was, in an index it was taken from (its tier's in the pool or, above a
        segment's watermark, one of its segments'), no more recently used than an evictable
        object of its pin class that was left alone; soft-pinned objects went only once no
        unpinned one was left to go."""
        state = self.state
        for gone, taken in victims:
            indexes: list[tuple[str, object]] = []
            for replica in taken:
                segment = state.segments[replica.segment_id]
                indexes.append(("pool", segment.info.tier))
                if by_segment:
                    indexes.append(("segment", segment))

            def rivals(index: tuple[str, object]) -> list[ObjectRecord]:
                kind, where = index
                if kind == "pool":
                    return [
                        s for s in survivors if any(self.tier_of(x) is where for x in s.replicas)
                    ]
                assert isinstance(where, SegmentRecord)
                return [s for s in survivors if _on(s, where.segment_id)]

            def in_order(index: tuple[str, object], gone: ObjectRecord = gone) -> bool:
                others = rivals(index)
                if gone.pin is Pin.SOFT and any(s.pin is Pin.NONE for s in others):
                    return False
                return all(
                    self.rank(gone, index) <= self.rank(s, index)
                    for s in others
                    if s.pin is gone.pin
                )

            ranks = [(s.key, s.pin.name, self.used_at[s.key, s.put_id]) for s in survivors]
            assert any(in_order(index) for index in indexes), (
                f"{gone.key} ({gone.pin!r}) evicted out of order from {taken}; evictable "
                f"survivors: {ranks}, it was last used at {self.used_at[gone.key, gone.put_id]}"
            )

    # ------------------------------------------------------------------ nodes

    def info_of(self, node: str, spec: SegmentSpec) -> SegmentInfo:
        base = 0x1000_0000 * (spec.index + 1) + 0x1_0000 * self.boots[node]
        info = segment_info(node, spec.size, spec.segment_id, base=base)
        return replace(info, tier=spec.tier, persistent=spec.persistent)

    def mount_node(self, node: str, layout: list[SegmentSpec]) -> None:
        """A node with fresh segments (it recorded nothing)."""
        self.layout[node] = layout
        self.boots[node] += 1
        for spec in layout:
            self.disk.pop(spec.segment_id, None)
            self.missed.pop(spec.segment_id, None)
            assert self.state.mount_segment(self.info_of(node, spec)) == []
            segment = self.keep(self.state.segments[spec.segment_id])
            self.nodes.setdefault(node, {})[spec.segment_id] = segment
        self.node_seen[node] = self.now
        self.collect()

    def bring_up(self, node: str, data) -> None:
        """A node (re)starts and mounts its segments with what each one's index holds."""
        self.boots[node] += 1
        for spec in data.draw(st.permutations(self.layout[node]), label="segments in order"):
            self.remount(node, spec, data)
        self.node_seen[node] = self.now

    def remount(self, node: str, spec: SegmentSpec, data) -> None:
        state = self.state
        info = self.info_of(node, spec)
        if not spec.persistent:  # its memory went with the process
            self.disk.pop(spec.segment_id, None)
            self.missed.pop(spec.segment_id, None)
        entries = dict(self.disk[spec.segment_id])
        missed = sorted(k for k in self.missed[spec.segment_id] if k not in entries)
        if missed:  # Forgets it never applied (it crashed first)
            lost = data.draw(st.lists(st.booleans(), min_size=len(missed), max_size=len(missed)))
            for key, kept in zip(missed, lost, strict=True):
                if kept:
                    entries[key] = self.missed[spec.segment_id][key]
        if spec.persistent and data.draw(st.booleans(), label="a stale duplicate"):
            self.add_stale_duplicate(node, spec, entries, data)
        stored = data.draw(st.permutations(sorted(entries.values(), key=repr)), label="order")
        old = state.segments.get(spec.segment_id)
        if old is not None:  # the master drops the old segment first (a changed info)
            assert old is self.nodes[node][spec.segment_id]
            self.segment_gone(old)
        view = self.objects_without(old)
        adopted, rejected, superseded = self.predict_adoption(spec, stored, view)
        records = {key: state.objects.get(key) for key in superseded}
        adopted_before = state.counters.objects_adopted

        dropped = state.mount_segment(info, stored)

        assert dropped == [item.key for item in rejected], (dropped, rejected)
        assert state.counters.objects_adopted - adopted_before == len(adopted)
        segment = self.keep(state.segments[spec.segment_id])
        self.nodes.setdefault(node, {})[spec.segment_id] = segment
        self.node_seen[node] = self.now
        for key in dropped:  # the node forgets what was not adopted
            self.disk[spec.segment_id].pop(key, None)
            self.missed[spec.segment_id].pop(key, None)
        for item in stored:
            if item.key not in dropped:
                self.disk[spec.segment_id][item.key] = item
                self.missed[spec.segment_id].pop(item.key, None)
        forgets = set()
        for key, record in records.items():
            assert record is not None and state.objects.get(key) is not record
            forgets |= self.removed(record, force=True)
        self.adopted(segment, adopted)
        commands = self.collect()
        sent = {
            (c.segment_id, o.key, o.offset)
            for c in commands
            if isinstance(c, ForgetCommand)
            for o in c.objects
        }
        assert forgets <= sent, f"superseded objects not forgotten: {forgets - sent}"

    def add_stale_duplicate(
        self, node: str, spec: SegmentSpec, entries: dict[str, StoredObject], data
    ) -> None:
        """An older generation of a key the node or the master holds elsewhere (left over from
        an earlier write whose Forget the node missed), somewhere in this segment."""
        generations = {key: r.put_id for key, r in self.state.objects.items()}
        for other in self.layout[node]:
            if other.segment_id != spec.segment_id:
                for key, item in self.disk[other.segment_id].items():
                    generations[key] = max(generations.get(key, 0), item.generation)
        candidates = sorted(k for k, g in generations.items() if k not in entries and g > 1)
        if candidates:
            key = data.draw(st.sampled_from(candidates), label="stale key")
            offset = data.draw(st.integers(0, spec.size // CONFIG.alignment), label="at")
            size = data.draw(st.sampled_from([0, 100, 500, 1200]), label="stale size")
            stale = StoredObject(key, offset * CONFIG.alignment, size, generations[key] - 1)
            entries[key] = stale
            self.disk[spec.segment_id][key] = stale

    def objects_without(self, segment: SegmentRecord | None) -> dict[str, tuple]:
        """key -> (state, generation, size) of each object once ``segment`` is dropped (the
        model already let it go: ``segment_gone``)."""
        view = {}
        for key, record in self.state.objects.items():
            ident = (key, record.put_id)
            if record.state is ObjectState.COMMITTED and ident not in self.committing:
                if self.owed[key, record.put_id, KeyStatus.OK]:  # its last node went
                    view[key] = (ObjectState.PUBLISHED, record.put_id, record.size)
                continue
            left = [
                r
                for r in record.replicas
                if r is not None and (segment is None or r.segment_id != segment.segment_id)
            ]
            if left:
                view[key] = (record.state, record.put_id, record.size)
        return view

    def predict_adoption(
        self, spec: SegmentSpec, stored: list[StoredObject], view: dict[str, tuple]
    ) -> tuple[list[tuple[StoredObject, bool]], list[StoredObject], list[str]]:
        """What the master adopts of ``stored`` (with whether it is a twin of a published
        object), what it drops, and which published objects the adopted supersede."""
        capacity = spec.size - spec.size % CONFIG.alignment
        taken: list[tuple[int, int]] = []
        adopted, rejected, superseded = [], [], []
        for item in sorted(stored, key=lambda s: s.generation, reverse=True):
            existing = view.get(item.key)
            twin = False
            if existing is not None:
                state, generation, size = existing
                if state is not ObjectState.PUBLISHED or generation > item.generation:
                    rejected.append(item)  # being written, or newer
                    continue
                if generation == item.generation:
                    if size != item.size:
                        rejected.append(item)
                        continue
                    twin = True
                else:
                    superseded.append(item.key)
                    del view[item.key]
            need = rounded(item.size)
            if (
                item.offset % CONFIG.alignment
                or item.offset < 0
                or item.offset + need > capacity
                or any(item.offset < end and start < item.offset + need for start, end in taken)
            ):
                rejected.append(item)
                continue
            taken.append((item.offset, item.offset + need))
            adopted.append((item, twin))
            view[item.key] = (ObjectState.PUBLISHED, item.generation, item.size)
        return adopted, rejected, superseded

    def adopted(self, segment: SegmentRecord, adopted: list[tuple[StoredObject, bool]]) -> None:
        """The model learns of what the master adopted into ``segment``; checks each."""
        state = self.state
        until = self.now + CONFIG.lease_ttl
        for item, twin in adopted:
            ident = (item.key, item.generation)
            record = state.objects[item.key]
            assert record.put_id == item.generation and record.state is ObjectState.PUBLISHED
            assert Replica(segment.segment_id, item.offset) in record.replicas
            assert segment.owners[item.offset] == item.key
            if twin:
                self.complete[ident].add((id(segment), item.offset))
                self.added_at[ident, id(segment)] = next(self.uses)
                self.lease_until[ident] = max(self.lease_until.get(ident, 0.0), until)
            else:
                assert record.size == item.size and record.crc32c == item.crc32c
                self.complete[ident] = {(id(segment), item.offset)}
                self.pins[ident] = (Pin.NONE, 0.0)
                self.used_at[ident] = next(self.uses)
                self.lease_until[ident] = until
                self.max_generation = max(self.max_generation, item.generation)
            assert record.lease_until == self.lease_until[ident]
        for item, _ in adopted:  # every replica of a leased object is guarded
            record = state.objects[item.key]
            self.guard_lease(record, self.lease_until[item.key, record.put_id])

    @initialize(layouts=st.lists(LAYOUT, min_size=2, max_size=2))
    def start_cluster(self, layouts):
        for node, layout in zip(NODES, layouts, strict=False):
            self.mount_node(node, make_layout(node, *layout))

    @rule(data=st.data())
    def node_event(self, data):
        """A node comes (a new one, or one that died or withdrew, with fresh segments or with
        what it recorded), dies, restarts, or withdraws a segment: one rule, so that nodes
        change less often than objects."""
        events = ["dies"] if len(self.nodes) >= 2 else []
        events += ["unmounts", "restarts"] if self.nodes else []
        events += ["mounts"] if len(self.nodes) < len(NODES) else []
        event = data.draw(st.sampled_from(events))
        if event == "mounts":
            node = data.draw(st.sampled_from([n for n in NODES if n not in self.nodes]))
            if node in self.layout and data.draw(st.booleans(), label="comes back"):
                self.bring_up(node, data)
            else:
                self.mount_node(node, make_layout(node, *data.draw(LAYOUT)))
        elif event == "dies":
            self.node_dies(data.draw(st.sampled_from(sorted(self.nodes))))
        elif event == "restarts":
            node = data.draw(st.sampled_from(sorted(self.nodes)))
            if data.draw(st.booleans(), label="declared dead first"):
                self.node_dies(node)
            self.bring_up(node, data)
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
        state = self.state
        segment = self.nodes[node][segment_id]
        waits = [  # (not copies yet to be answered: its node knows of its own copies)
            g.until - self.now
            for g in self.live_guards()
            if g.buffer.segment is segment and g.until != float("inf")
        ]
        waits += [  # (copies into it: their objects' leases count too)
            m.record.lease_until - self.now
            for m in self.moves.values()
            if m.target.segment is segment
        ]
        lost = [
            key
            for key, record in state.objects.items()
            if {r.segment_id for r in record.replicas if r is not None} == {segment_id}
        ]

        removed, drain = state.unmount_segment(node, segment_id)

        assert removed == len(lost)
        assert drain == pytest.approx(max([0.0, *waits])), (drain, waits)
        del self.nodes[node][segment_id]
        self.layout[node] = [s for s in self.layout[node] if s.segment_id != segment_id]
        self.disk.pop(segment_id, None)
        self.missed.pop(segment_id, None)
        if not self.nodes[node]:
            del self.nodes[node]
            del self.node_seen[node]
            del self.layout[node]
        self.segment_gone(segment)
        self.collect()

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def nodes_answer(self, data):
        """Nodes answer some of the commands they were sent (or the I/O layer gives up)."""
        ids = data.draw(
            st.lists(st.sampled_from(sorted(self.sent)), min_size=1, max_size=4, unique=True)
        )
        for command_id in ids:
            self.answer(command_id, data.draw(ANSWERS), data)

    # ------------------------------------------------------------------ writers

    def start_puts(self, client, batch, replicas, pin, tier, prefer) -> list[Reservation]:
        """One put_start call for a batch; checks every answer; returns the reservations."""
        state, now = self.state, self.now
        options = PutOptions(
            replicas=replicas,
            preferred_hosts=(host_of(prefer),) if prefer else (),
            pin=pin.pin,
            pin_ttl=pin.pin_ttl,
            tier=tier,
        )
        keys = [key for key, _ in batch]
        sizes = [size for _, size in batch]
        before = {key: (record, list(record.replicas)) for key, record in state.objects.items()}
        evictions = state.counters.evictions
        moving = self.moving()

        slots = state.put_start(client, keys, sizes, options)

        self.alive_clients.add(client)  # a client that puts is alive
        started: dict[str, Reservation] = {}
        prepares = 0
        for i, (key, size, slot) in enumerate(zip(keys, sizes, slots, strict=True)):
            if slot.status is KeyStatus.ALREADY_EXISTS:
                assert key in before or key in started, f"{key}: ALREADY_EXISTS, but it was not"
                continue
            if slot.status is KeyStatus.NO_SPACE:
                if i == len(keys) - 1:  # later keys of the batch did not change the pool since
                    self.check_no_space(size, tier, spared=self.thinned(before))
                continue
            assert slot.status is KeyStatus.OK, slot
            assert key not in started, f"{key} reserved twice in one batch"
            if key in before:  # it existed when the batch started: evicted for an earlier key
                record = before[key][0]
                assert record.state is ObjectState.PUBLISHED and self.evictable(record, moving)
            assert slot.put_id > self.max_generation, "a put id older than a known generation"
            self.max_generation = slot.put_id
            nodes = [r.segment.node_id for r in slot.replicas]
            assert 1 <= len(nodes) <= (replicas or CONFIG.default_replicas)
            assert len(set(nodes)) == len(nodes), f"{key}: two replicas on one node: {nodes}"
            assert set(nodes) <= set(self.nodes)
            if prefer in nodes:
                assert nodes[0] == prefer, f"{key}: the preferred node is not first: {nodes}"
            tiers = {r.segment.tier for r in slot.replicas}
            assert len(tiers) == 1, f"{key}: replicas in two tiers"
            assert tier is Tier.UNSPECIFIED or tiers == {tier}, f"{key}: {tiers}, asked {tier}"
            if size and tiers == {Tier.NVME}:
                prepares += len(slot.replicas)
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
        if self.writing(client):  # the master tracks writers only
            self.client_seen[client] = now
        commands = self.collect()
        prepared = [c for c in commands if isinstance(c, PrepareCommand)]
        assert len(prepared) == prepares, "a Prepare for each reserved NVMe buffer, no more"
        assert not [c for c in commands if isinstance(c, PersistCommand)]
        # Whatever vanished meanwhile was evicted to make room: least recently used first,
        # unpinned before soft-pinned, never a leased, hard-pinned, moving or unpublished one.
        evicted, victims = self.victims(before, {})
        assert len(evicted) == state.counters.evictions - evictions
        assert all(self.evictable(r, moving) for r, _ in victims), [r.key for r, _ in victims]
        touched = {id(record) for record, _ in victims}
        kept = [
            r for r in state.objects.values() if self.evictable(r, moving) and id(r) not in touched
        ]
        self.check_eviction_order(victims, kept, by_segment=False)
        return list(started.values())

    @rule(
        client=st.sampled_from(CLIENTS),
        batch=BATCH,
        replicas=REPLICAS,
        pin=PINS,
        tier=TIERS,
        prefer=PREFER,
    )
    def put_start(self, client, batch, replicas, pin, tier, prefer):
        """A writer reserves space for a batch (and may commit later, or never)."""
        self.start_puts(client, batch, replicas, pin, tier, prefer)

    @rule(
        client=st.sampled_from(CLIENTS),
        batch=BATCH,
        replicas=REPLICAS,
        pin=PINS,
        tier=TIERS,
        prefer=PREFER,
        data=st.data(),
    )
    def publish(self, client, batch, replicas, pin, tier, prefer, data):
        """A writer puts a batch and commits it at once, some replicas possibly failed."""
        for reservation in self.start_puts(client, batch, replicas, pin, tier, prefer):
            self.commit(reservation, data)

    @rule(client=st.sampled_from(CLIENTS), batch=BATCH, pin=PINS, prefer=PREFER, data=st.data())
    def publish_to_dram(self, client, batch, pin, prefer, data):
        """The same, one replica each, in DRAM: what fills it up, so that ticks demote."""
        for reservation in self.start_puts(client, batch, 1, pin, Tier.DRAM, prefer):
            self.commit(reservation, data)

    def two_tiers(self, node: str) -> bool:
        return {s.info.tier for s in self.nodes[node].values()} == {Tier.DRAM, Tier.NVME}

    @precondition(lambda self: any(self.two_tiers(node) for node in self.nodes))
    @rule(data=st.data(), size=st.sampled_from([150, 300, 700]))
    def dram_fills_up(self, data, size):
        """A writer publishes objects into the DRAM of a node that also has NVMe, until it
        passes the watermark; the master ticks (and demotes what it may)."""
        node = data.draw(st.sampled_from(sorted(n for n in self.nodes if self.two_tiers(n))))
        for key in KEYS:
            dram = [s for s in self.nodes[node].values() if s.info.tier is Tier.DRAM]
            if all(s.allocator.used > HIGH * s.allocator.capacity for s in dram):
                break
            if key not in self.state.objects:
                for reservation in self.start_puts(
                    "c0", [(key, size)], 1, PutOptions(), Tier.DRAM, node
                ):
                    self.commit(reservation, data)
        self.pass_time(0.0)

    def thinned(self, before: dict[str, tuple[ObjectRecord, list]]) -> set[int]:
        """Objects (by id) that lost some replicas since ``before`` and kept others."""
        return {
            id(record)
            for key, (record, replicas) in before.items()
            if self.state.objects.get(key) is record
            and any(r is not None and r not in record.replicas for r in replicas)
        }

    def check_no_space(self, size: int, tier: Tier, spared: set[int]) -> None:
        """NO_SPACE only when the object fits in no tier tried, even after evicting what may be
        evicted there (but for the objects that lost a replica to it and keep one there: see
        test_no_space_only_once_every_evictable_replica_in_the_tier_is_gone)."""
        tiers = (Tier.DRAM, Tier.NVME) if tier is Tier.UNSPECIFIED else (tier,)
        for each in tiers:
            segments = [s for s in self.state.segments.values() if s.info.tier is each]
            assert all(s.allocator.largest_free < rounded(size) for s in segments)
            if any(s.allocator.capacity >= size for s in segments):
                left = [
                    r.key
                    for r in self.state.objects.values()
                    if self.evictable(r)
                    and id(r) not in spared
                    and any(self.tier_of(x) is each for x in r.replicas)
                ]
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
        """A PutEnd: answered when every node has answered (``end_puts``: the nodes answer at
        once, all well or all failing), or left waiting for the nodes."""
        state = self.state
        key, put_id = reservation.key, reservation.put_id
        ident = (key, put_id)
        n = len(reservation.buffers)
        ok = tuple(
            data.draw(st.lists(st.sampled_from([True, True, True, False]), min_size=n, max_size=n))
        )
        crc32c = data.draw(st.none() | st.integers(0, 2**32 - 1))
        wait = data.draw(st.sampled_from([False, False, True]), label="nodes answer later")
        written = [b for b, good in zip(reservation.buffers, ok, strict=True) if good]
        kept = [b for b in written if b.mounted(state)]
        was_open = self.open(reservation)
        record = state.objects.get(key)
        retried = not was_open and record is not None and record.put_id == put_id
        if was_open:
            expected = None if kept else KeyStatus.NO_REPLICA
        elif retried and record.state is ObjectState.PUBLISHED:
            expected = KeyStatus.OK  # a retried commit of a published object is fine
        elif retried:
            assert record.state is ObjectState.COMMITTED
            expected = None  # a retried commit: it still waits for its nodes
        else:
            expected = KeyStatus.STALE_PUT
        if was_open:
            reservation.ended = True
            if kept:
                units = {id(b.segment): b for b in kept}
                self.committing[ident] = Committing(
                    key, put_id, reservation.size, crc32c, units, []
                )
        waiting = self.committing.get(ident) if expected is None else None
        awaited = {(b.segment_id, key) for b in waiting.unacked.values()} if waiting else set()

        if wait:
            [status] = state.put_end([Commit(key, put_id, ok, crc32c)])
        else:
            nodes_ok = data.draw(st.sampled_from([True, True, True, False]), label="nodes ok")
            [status] = end_puts(state, [Commit(key, put_id, ok, crc32c)], nodes_ok)
            if waiting is not None:  # every node answered (end_puts took the results)
                for buffer in waiting.unacked.values():
                    if nodes_ok:
                        waiting.persisted.append(buffer)
                        item = StoredObject(
                            key, buffer.offset, waiting.size, put_id, waiting.crc32c
                        )
                        self.record_on_disk(buffer.segment, item)
                waiting.unacked.clear()
                expected = self.finish_commit(ident)
                self.owed[key, put_id, expected] -= 1

        assert status is expected, (key, ok, status, expected)
        commands = self.collect()
        persists = {
            (c.segment_id, o.key)
            for c in commands
            if isinstance(c, PersistCommand)
            for o in c.objects
        }
        assert persists == (awaited if wait else set()), (persists, awaited)
        if waiting is not None and not wait:
            self.check_published(ident, expected, waiting.crc32c)
        if was_open and not kept:
            assert key not in state.objects, f"{key}: NO_REPLICA, but it is still there"

    @precondition(lambda self: self.reservations)
    @rule(data=st.data())
    def put_revoke(self, data):
        """The writer gives up: its space returns at once."""
        reservation = self.draw_reservation(data)
        expected = KeyStatus.OK if self.open(reservation) else KeyStatus.STALE_PUT

        statuses = self.state.put_revoke([reservation.key], [reservation.put_id])

        assert statuses == [expected]
        reservation.ended = True
        self.collect()

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
        assert client not in self.state.clients

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
        """A few keys, mostly of objects that exist, most of those published."""
        objects = self.state.objects
        published = sorted(k for k, r in objects.items() if r.state is ObjectState.PUBLISHED)
        key = st.sampled_from(KEYS)
        if objects:
            key |= st.sampled_from(sorted(objects))
        if published:
            key |= st.sampled_from(published)
        on_nvme = [  # (reads of these promote them)
            k for k in published if all(self.tier_of(r) is Tier.NVME for r in objects[k].replicas)
        ]
        if on_nvme:
            key |= st.sampled_from(on_nvme)
        return data.draw(st.lists(key, min_size=1, max_size=3, unique=unique))

    @rule(data=st.data(), ttl=st.sampled_from(LEASES))
    def get_replicas(self, data, ttl):
        self.read(self.draw_keys(data), ttl)

    @precondition(lambda self: any(self.two_tiers(node) for node in self.nodes))
    @rule(data=st.data(), size=st.sampled_from([0, 100, 300, 700]), ttl=st.sampled_from(LEASES))
    def nvme_object_is_read(self, data, size, ttl):
        """A writer publishes an object into the NVMe of a node that also has DRAM, and a
        reader reads it (which promotes it if that DRAM has room)."""
        node = data.draw(st.sampled_from(sorted(n for n in self.nodes if self.two_tiers(n))))
        key = data.draw(st.sampled_from(KEYS))
        for reservation in self.start_puts("c1", [(key, size)], 1, PutOptions(), Tier.NVME, node):
            self.commit(reservation, data)
        self.read([key], ttl)

    def read(self, keys: list[str], ttl: float) -> None:
        state = self.state
        expected = [self.expected_read(key) for key in keys]
        records = [state.objects.get(key) for key in keys]
        moving = self.moving()

        locations, granted = state.get_replicas(keys, ttl)

        assert granted == self.granted(ttl)
        assert [loc.status for loc in locations] == expected
        commands = self.collect(copies="promotion")
        promoted = {c.source.key: c for c in commands if isinstance(c, CopyCommand)}
        assert len(promoted) == len(commands)
        for key, record, location in zip(keys, records, locations, strict=True):
            if location.status is not KeyStatus.OK:
                continue
            assert record is not None
            assert location.size == record.size
            assert location.crc32c == record.crc32c
            assert {
                (r.segment.segment_id, r.address - r.segment.base_address)
                for r in location.replicas
            } == {(r.segment_id, r.offset) for r in record.replicas if r is not None}
            self.grant(key, granted)
            self.check_promotion(record, promoted.get(key), moving)

    def check_promotion(
        self, record: ObjectRecord, copy: CopyCommand | None, moving: set[tuple[str, int]]
    ) -> None:
        """A read promotes an object held only on NVMe, not moving, into DRAM on the node of
        its first replica when that has room below the watermark."""
        state = self.state
        nvme_only = all(self.tier_of(r) is Tier.NVME for r in record.replicas)
        candidate = nvme_only and (record.key, record.put_id) not in moving
        node = state.segments[record.replicas[0].segment_id].node_id
        if copy is not None:
            assert candidate and CONFIG.promote_on_hit
            assert copy.source_segment_id == record.replicas[0].segment_id
            target = state.segments[copy.target_segment_id].allocator
            assert target.used <= HIGH * target.capacity, "promoted above the watermark"
        elif candidate and not record.moving:
            for segment_id in state.nodes[node].segment_ids:
                segment = state.segments[segment_id]
                allocator = segment.allocator
                need = allocator.rounded(record.size)
                assert not (
                    segment.info.tier is Tier.DRAM
                    and allocator.largest_free >= need
                    and allocator.used + need <= HIGH * allocator.capacity
                ), f"{record.key}: not promoted although {segment_id} has room"

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
        assert self.collect() == [], "exists moves nothing"

    # ------------------------------------------------------------------ removal

    def check_forgets(self, commands: list, owed: set[tuple[str, str, int]]) -> None:
        sent = {
            (c.segment_id, o.key, o.offset)
            for c in commands
            if isinstance(c, ForgetCommand)
            for o in c.objects
        }
        assert sent == owed, f"Forgets sent {sent}, expected {owed}"

    @rule(data=st.data(), force=st.booleans())
    def remove(self, data, force):
        keys = self.draw_keys(data, unique=True)
        expected = [self.expected_removal(key, force) for key in keys]
        records = [self.state.objects.get(key) for key in keys]

        statuses = self.state.remove(keys, force)

        assert statuses == expected, (keys, force)
        owed = set()
        for record, status in zip(records, statuses, strict=True):
            if status is KeyStatus.OK:
                assert record is not None and record.key not in self.state.objects
                owed |= self.removed(record, force)
        self.check_forgets(self.collect(), owed)

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
        owed = set()
        for key, record in matching.items():
            if expected[key] is KeyStatus.OK:
                assert key not in self.state.objects
                owed |= self.removed(record, force)
            else:
                assert self.state.objects.get(key) is record
        self.check_forgets(self.collect(), owed)

    # ------------------------------------------------------------------ time

    @rule(seconds=st.sampled_from(STEPS))
    def time_passes(self, seconds):
        self.pass_time(seconds)

    def answer_everything(self) -> None:
        for command_id in sorted(self.sent):
            self.answer(command_id, "ok")

    def settle(self):
        """Long enough for every reservation, quarantine and lease to end, and every node
        answers: nothing is left over."""
        self.answer_everything()
        self.pass_time(CONFIG.reservation_timeout)
        self.answer_everything()
        self.pass_time(max(CONFIG.reclaim_delay, CONFIG.max_lease_ttl) + 1)
        self.answer_everything()
        state = self.state
        assert not [k for k, r in state.objects.items() if r.state is not ObjectState.PUBLISHED]
        assert not self.committing and not self.moves
        assert not [c for c in self.issued if state.awaiting(c)], "commands still awaited"
        assert not state.clients, f"writers still tracked: {state.clients}"
        assert not self.live_guards()
        for segment in state.segments.values():
            allocations = segment.allocator.allocations()
            assert sorted(allocations) == sorted(segment.owners), (
                f"{segment.segment_id}: buffers nobody owns: "
                f"{sorted(set(allocations) - set(segment.owners))}"
            )
            for offset, key in segment.owners.items():
                record = state.objects[key]
                assert Replica(segment.segment_id, offset) in record.replicas
        assert state.counters.lease_expiries == self.lease_periods

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
            places = []
            for replica in record.replicas:
                assert replica is not None
                segment = state.segments.get(replica.segment_id)
                assert segment is not None, f"{key}: replica in unmounted {replica.segment_id}"
                assert segment.owners.get(replica.offset) == key, f"{key}: replica not owned"
                assert segment.allocator.size_of(replica.offset) >= record.size
                assert (id(segment), replica.offset) in self.complete[key, record.put_id], (
                    f"{key}: a replica nobody wrote, recorded, copied or reported"
                )
                places.append(replica.segment_id)
            assert len(set(places)) == len(places), f"{key}: two replicas in one segment"

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
        writers = {r.client for r in self.reservations.values() if self.open(r)}
        assert set(state.clients) == writers, "the master tracks exactly the writers"

    @invariant()
    def commits_agree_with_the_model(self):
        state = self.state
        committed = {
            (k, r.put_id): r for k, r in state.objects.items() if r.state is ObjectState.COMMITTED
        }
        assert set(committed) == set(self.committing)
        for ident, record in committed.items():
            waiting = self.committing[ident]
            assert record.unacked == {b.segment_id for b in waiting.unacked.values()}
            assert {(r.segment_id, r.offset) for r in record.replicas if r is not None} == {
                (b.segment_id, b.offset) for b in [*waiting.unacked.values(), *waiting.persisted]
            }, f"{ident}: replicas of a commit"
            assert record.crc32c == waiting.crc32c
            for buffer in [*waiting.unacked.values(), *waiting.persisted]:
                assert buffer.mounted(state) and buffer.segment.owners[buffer.offset] == ident[0]
        for sent in self.sent.values():
            assert state.awaiting(sent.command.command_id)

    @invariant()
    def copies_in_flight_leave_their_objects_readable(self):
        state = self.state
        for command_id, move in self.moves.items():
            record = move.record
            key = record.key
            assert state.objects.get(key) is record, f"{key} gone with a copy in flight"
            assert record.state is ObjectState.PUBLISHED
            assert state.exists([key], grant_lease=False) == [KeyStatus.OK]
            assert list(record.moving) == [command_id] and state.awaiting(command_id)
            source = Replica(move.source.segment_id, move.source.offset)
            target = Replica(move.target.segment_id, move.target.offset)
            assert source in record.replicas, f"{key} lost its replica before the copy was done"
            assert target not in record.replicas, f"{key} readable where it is not copied yet"
            assert move.source.mounted(state) and move.target.mounted(state)
            assert move.target.segment.owners.get(move.target.offset) == key
            assert move.target.segment.allocator.allocations().get(move.target.offset)
        for key, record in state.objects.items():
            for command_id in record.moving:
                assert command_id in self.moves, f"{key}: a copy the model did not see"
        leaving = self.leaving()
        for segment in state.segments.values():
            assert segment.leaving == leaving[id(segment)], f"{segment.segment_id}: leaving"

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


# About 12,000 steps, in some 12 s; derandomized, so every run checks the same sequences.
MasterModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=80,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_master_model = MasterModel.TestCase
