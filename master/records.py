"""What the master's core remembers: nodes, segments, objects and their replicas.

Plain data; the rules that change it live in ``state.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

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


@dataclass(slots=True)
class SegmentRecord:
    info: SegmentInfo
    allocator: Allocator
    #: offset -> key of the object whose replica lives there (published or reserved).
    owners: dict[int, str] = field(default_factory=dict)
    #: Published objects with a replica here, in eviction order.
    lru: LruIndex = field(default_factory=LruIndex)

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


class ObjectState(Enum):
    RESERVED = "reserved"  # space allocated, writer copying; invisible to readers
    PUBLISHED = "published"  # committed and readable


@dataclass(slots=True)
class Replica:
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
    crc32: int | None = None


@dataclass(frozen=True, slots=True)
class PlacedReplica:
    """A replica as the caller sees it: the segment (to reach it) and the absolute address."""

    segment: SegmentInfo
    address: int


@dataclass(frozen=True, slots=True)
class PutSlot:
    status: KeyStatus
    put_id: int = 0
    replicas: tuple[PlacedReplica, ...] = ()
    message: str = ""


@dataclass(frozen=True, slots=True)
class Location:
    status: KeyStatus
    size: int = 0
    replicas: tuple[PlacedReplica, ...] = ()
    crc32: int | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    key: str
    put_id: int
    replica_ok: tuple[bool, ...]
    crc32: int | None = None


@dataclass(frozen=True, slots=True)
class PutOptions:
    """How a batch of puts wants its objects placed and kept."""

    replicas: int = 0  # 0: the master's default
    preferred_hosts: tuple[str, ...] = ()
    pin: Pin = Pin.NONE
    pin_ttl: float = 0.0  # soft pins; 0: the master's default


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
    crc32: int | None = None
    age: float = 0.0
    idle: float = 0.0


@dataclass(frozen=True, slots=True)
class PrefixRemoval:
    removed: int
    leased: int
    not_ready: int


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


@dataclass(slots=True)
class TickReport:
    """What one ``tick`` did: the effects the I/O layer logs and counts."""

    reservations_reclaimed: list[str] = field(default_factory=list)
    dead_nodes: list[str] = field(default_factory=list)
    dead_clients: list[str] = field(default_factory=list)
    objects_lost: int = 0
    objects_evicted: int = 0
    buffers_released: int = 0


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
    lease_expiries: int = 0
