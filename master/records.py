"""What the master's core remembers: nodes, segments, objects and their replicas.

Plain data; the rules that change it live in ``state.py``. The records made for every key of
every call (replicas, slots, commits, locations) are named tuples: as immutable as frozen
dataclasses, at less than half the cost to create.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from kvpool.common.status import KeyStatus, Pin, Tier
from kvpool.master.allocator import Allocator
from kvpool.master.lru import LruIndex


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What a node says about a segment when it mounts it: how clients reach its memory."""

    segment_id: str
    node_id: str
    host: str
    worker_address: bytes
    base_address: int
    size: int
    rkey: bytes
    tier: Tier = Tier.DRAM
    #: Objects in it survive a restart of its node (NVMe, /dev/shm): the node reports them.
    persistent: bool = False
    #: How a client on the node's host maps the segment (a serialized SharedMemory message,
    #: passed through to clients untouched; empty when the node does not share it).
    shared_memory: bytes = b""
    #: HOST:PORT of the node's checked stream ("": none): clients elsewhere move bytes there.
    checked_address: str = ""
    #: The tenant whose objects alone it holds (the node's ``--tenant``); "": any tenant's.
    tenant: str = ""
    #: Its node allocated every block of its file on the disk: no Prepare before a write.
    space_reserved: bool = False
    #: The node process that mounted it ("": a node that does not say). Memory that does not
    #: persist goes with its process: a mount from another process of the node drops it.
    incarnation: str = ""


@dataclass(slots=True)
class SegmentRecord:
    info: SegmentInfo
    allocator: Allocator
    #: offset -> key of the object whose replica lives there (published or reserved).
    owners: dict[int, str] = field(default_factory=dict)
    #: Published objects with a replica here, in eviction order.
    lru: LruIndex = field(default_factory=LruIndex)
    #: Replicas a report in parts brought back of objects used at this master: they join
    #: ``lru`` once the report ends, in the order their objects were last used.
    relisted: list[ObjectRecord] = field(default_factory=list)
    #: Bytes of replicas being copied out of here (demotions not yet acknowledged).
    leaving: int = 0
    #: No new buffers here before this time: writers of an earlier master term may still be
    #: copying into space this master does not know was reserved.
    fenced_until: float = 0.0
    #: While its node is still reporting the objects it holds in parts (a MountSegment with
    #: ``more``): the fence its mount set, which ``fenced_until`` (infinite meanwhile: nothing
    #: new goes where a part still to come may hold an object) becomes at the last part.
    reporting: float | None = None
    #: When this master last granted a writer space here (a put's reservation): writers copy
    #: until a write timeout after their grant, whatever becomes of the segment meanwhile.
    granted_at: float = float("-inf")
    #: While an eviction pass over this segment is under way (it passed the high watermark):
    #: the bytes in use it brings the segment back to. None between passes.
    evict_to: float | None = None

    @property
    def segment_id(self) -> str:
        return self.info.segment_id

    @property
    def node_id(self) -> str:
        return self.info.node_id


@dataclass(slots=True)
class NodeRecord:
    node_id: str
    host: str
    last_seen: float
    segment_ids: set[str] = field(default_factory=set)
    #: Leaving: nothing new is placed here, and its objects are copied to other nodes
    #: (``MasterState.drain``).
    draining: bool = False


#: The ``unacked`` of every object that awaits no node.
NO_SEGMENTS: frozenset[str] = frozenset()


class ObjectState(Enum):
    RESERVED = "reserved"  # space allocated, writer copying; invisible to readers
    COMMITTED = "committed"  # written; waiting for its nodes to record it; still invisible
    PUBLISHED = "published"  # recorded by its nodes and readable


#: ``make(Kind, (field, ...))``: one of the named tuples below made in a single C call, every
#: field given, in order (no defaults are filled in). Calling the class runs the named tuple's
#: ``__new__``, a Python function, which doubled the cost of the records a put and a get make
#: for every key; the per-key paths of ``state.py`` use this instead.
make = tuple.__new__


class Replica(NamedTuple):
    segment_id: str
    offset: int


@dataclass(slots=True)
class ObjectRecord:
    key: str
    size: int
    state: ObjectState
    put_id: int
    client_id: str
    created_at: float
    #: While RESERVED, positions match the PutSlot the writer got; a replica lost with its
    #: node becomes None so that the writer's per-replica report still lines up.
    replicas: list[Replica | None]
    lease_until: float = 0.0
    last_access: float = 0.0
    pin: Pin = Pin.NONE
    pin_until: float = 0.0  # soft pins only
    crc32c: int | None = None
    #: A read lease whose end has not been counted yet (for the lease-expiry metric).
    lease_open: bool = False
    #: The client that leased it last ("": anonymous), and when the leases of every other
    #: reader end at the latest: a release by that client brings ``lease_until`` back to
    #: ``others_until``, so that no other reader's lease is ever cut short.
    lease_client: str = ""
    others_until: float = 0.0
    #: COMMITTED: segments whose nodes have not yet acknowledged recording it. Replaced, not
    #: changed in place, so that a published object shares the one empty set (a set per
    #: object would be one more container for the garbage collector to walk, for life).
    unacked: frozenset[str] = NO_SEGMENTS
    #: Copies in flight (command id -> move), during which it is not evicted again.
    moving: dict[int, Move] = field(default_factory=dict)
    #: Nodes that should hold a replica (re-replication keeps it so): the replicas its put
    #: got, less those eviction took; for an object adopted from the nodes' reports, as many
    #: as reported it.
    wanted: int = 1
    #: Made from a node's report (a remount), not by a put of this master's.
    adopted: bool = False

    @property
    def generation(self) -> int:
        """Orders writes across master restarts: the put id (the master epoch in its top
        32 bits)."""
        return self.put_id


@dataclass(slots=True)
class Move:
    """A copy of a replica to another segment: of the same node (a demotion or promotion),
    or of another node (``replication``: a lost replica made good, or a draining node's
    object copied away)."""

    source: Replica
    target: Replica
    demotion: bool  # the source replica goes away once the copy is recorded
    replication: bool = False


class PlacedReplica(NamedTuple):
    """A replica as the caller sees it: the segment (to reach it) and the absolute address."""

    segment: SegmentInfo
    address: int


class PutSlot(NamedTuple):
    status: KeyStatus
    put_id: int = 0
    replicas: tuple[PlacedReplica, ...] = ()
    message: str = ""


class Location(NamedTuple):
    status: KeyStatus
    size: int = 0
    replicas: tuple[PlacedReplica, ...] = ()
    crc32c: int | None = None
    #: The object's generation: its read grants carry it, so that a node that forgot the
    #: object refuses them and only them (storage_node/checked_server.py, Seals).
    generation: int = 0


class Commit(NamedTuple):
    key: str
    put_id: int
    replica_ok: tuple[bool, ...]
    crc32c: int | None = None


class UnreadableReplica(NamedTuple):
    """A replica a storage node's disk failed to read (``MasterState.heartbeat``)."""

    segment_id: str
    key: str
    offset: int
    generation: int


@dataclass(frozen=True, slots=True)
class PutOptions:
    """How a batch of puts wants its objects placed and kept."""

    replicas: int = 0  # 0: the master's default
    preferred_hosts: tuple[str, ...] = ()
    pin: Pin = Pin.NONE
    pin_ttl: float = 0.0  # soft pins; 0: the master's default
    tier: Tier = Tier.UNSPECIFIED  # UNSPECIFIED: DRAM first, then NVMe
    #: Nodes the writer could not reach lately (it saw them fail; the master may not know
    #: yet): no replica goes there.
    avoid_nodes: frozenset[str] = frozenset()
    #: Segments the writer writes itself (it maps them, or holds an NVMe segment's file:
    #: transport/shared_file.py). Such a writer's own writes allocate an NVMe file's blocks
    #: (a full disk fails its write, no one faults), so its nodes get no Prepare for them.
    self_written: frozenset[str] = frozenset()


class StoredObject(NamedTuple):
    """An object as a storage node records it."""

    key: str
    offset: int
    size: int
    generation: int
    crc32c: int | None = None
    #: Replicas the object should have, recorded with it so that a master that adopts it
    #: after a failover restores that many; 0: unknown (taken as 1).
    replicas: int = 0
    #: Reported from before damage in the node's index log, which may have held its
    #: removal: adopted only as a copy of an object the master knows.
    unconfirmed: bool = False


@dataclass(frozen=True, slots=True)
class PersistCommand:
    """Tell a node: these objects are now published in this segment; record them."""

    command_id: int
    node_id: str
    segment_id: str
    objects: tuple[StoredObject, ...]


@dataclass(frozen=True, slots=True)
class ForgetCommand:
    """Tell a node: these objects are gone from this segment."""

    command_id: int
    node_id: str
    segment_id: str
    objects: tuple[StoredObject, ...]


@dataclass(frozen=True, slots=True)
class CopyCommand:
    """Tell a node: copy an object into one of your segments, then record the copy. From
    another of its segments, or (``source_segment`` set) from another node's, over UCX."""

    command_id: int
    node_id: str
    source_segment_id: str
    source: StoredObject
    target_segment_id: str
    target: StoredObject
    source_segment: SegmentInfo | None = None


@dataclass(frozen=True, slots=True)
class PrepareCommand:
    """Tell a node: space was reserved in this file-backed segment; allocate its blocks."""

    command_id: int
    node_id: str
    segment_id: str
    offset: int
    size: int


NodeCommand = PersistCommand | ForgetCommand | CopyCommand | PrepareCommand


class ExplainedStatuses(list[Any]):
    """A PutEnd's answer (one KeyStatus per key, as a plain list answers) where some keys'
    statuses come with why (``messages``: index -> message): a node could not record them."""

    __slots__ = ("messages",)

    def __init__(self, statuses: Iterable[Any], messages: dict[int, str]) -> None:
        super().__init__(statuses)
        self.messages = messages


class CommitResult(NamedTuple):
    """A PutEnd that waited for its nodes has an answer."""

    key: str
    put_id: int
    status: KeyStatus
    #: Why, where the status alone does not say (a node could not record it: its error).
    message: str = ""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """Everything the master knows about one object (``kvpool stat``)."""

    status: KeyStatus
    size: int = 0
    state: str = ""
    replicas: tuple[PlacedReplica, ...] = ()
    lease_remaining: float = 0.0
    pin: Pin = Pin.NONE
    pin_remaining: float = 0.0
    crc32c: int | None = None
    age: float = 0.0
    idle: float = 0.0


@dataclass(frozen=True, slots=True)
class DrainProgress:
    """Where the drain of a node stands: what still needs a copy on another node."""

    draining: bool
    objects_left: int
    bytes_left: int
    #: Other nodes, not draining, that may take copies.
    live_nodes: int


@dataclass(frozen=True, slots=True)
class PrefixRemoval:
    removed: int
    leased: int
    not_ready: int
    #: Where the next page starts (its keys come strictly after this); "" after the last.
    next_start_after: str = ""


@dataclass(frozen=True, slots=True)
class KeyPage:
    keys: list[str]
    sizes: list[int]
    next_start_after: str


@dataclass(frozen=True, slots=True)
class SegmentUsage:
    info: SegmentInfo
    capacity: int
    used: int
    objects: int
    largest_free: int


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    segments: list[SegmentUsage]
    objects: int
    reservations: int
    nodes: int
    #: Published objects on fewer live nodes than they should be (re-replication's work).
    under_replicated: int = 0
    #: Copies between nodes in flight, and nodes draining.
    copies_in_flight: int = 0
    draining_nodes: int = 0
    #: Nodes silent on their commands lately (``state.SILENT_NODE_PAUSE``).
    silent_nodes: int = 0


@dataclass(slots=True)
class TickReport:
    """What one ``tick`` did: the effects the I/O layer logs and counts."""

    reservations_reclaimed: list[str] = field(default_factory=list)
    dead_nodes: list[str] = field(default_factory=list)
    dead_clients: list[str] = field(default_factory=list)
    objects_lost: int = 0
    objects_evicted: int = 0
    #: Each eviction pass started: the segment (or tier) past its high watermark and what
    #: its bytes in use were (``MasterState.space_of``), for the log.
    passes_started: list[dict[str, Any]] = field(default_factory=list)
    buffers_released: int = 0
    #: The call's step ran out with work left (frees, ended leases, an eviction pass): call
    #: ``tick`` again soon to go on.
    unfinished: bool = False
    #: Seconds of the master's own silence forgiven to nodes and writers (``late_by``).
    silence_forgiven: float = 0.0


@dataclass(slots=True)
class Counters:
    """Monotonic event counts, exported as metrics by the service."""

    hits: int = 0
    misses: int = 0
    puts_started: int = 0
    puts_published: int = 0
    puts_revoked: int = 0
    reservations_reclaimed: int = 0
    objects_removed: int = 0
    objects_lost: int = 0
    nodes_died: int = 0
    clients_died: int = 0
    evictions: int = 0
    #: Of those, evicted for room in the object table (``max_objects``), not for space.
    evictions_for_table: int = 0
    demotions: int = 0
    promotions: int = 0
    lease_expiries: int = 0
    objects_adopted: int = 0
    #: Copies between nodes recorded (re-replication and drain), and their bytes.
    replicas_copied: int = 0
    bytes_copied: int = 0
    #: Surplus replicas dropped (a node came back with replicas copied meanwhile).
    replicas_trimmed: int = 0
    #: Replicas dropped because their node's disk could not read them.
    replicas_unreadable: int = 0
