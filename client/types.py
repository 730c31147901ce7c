"""What ``kvpool.Client`` returns besides bytes: plain frozen dataclasses of kvpool's own.

They keep the attribute names of the master's protobuf answers they are made from (so code
written against those keeps working), but carry none of protobuf's machinery: enums are
``kvpool.common.status`` IntEnums, repeated fields are lists (``page.keys == []`` holds for
an empty page), an absent optional field is None (``info.crc32c is None`` where the writer
sent no checksum). Being frozen, they cannot be changed by mistake; being dataclasses, they
compare by value and print readably.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvpool.common.status import KeyStatus, Pin, Tier

if TYPE_CHECKING:
    from kvpool.proto import master_pb2 as pb

__all__ = [
    "ClusterStatus",
    "KeyPage",
    "ObjectInfo",
    "PrefixRemoval",
    "RegisteredRegion",
    "ReplicaInfo",
    "SegmentStatus",
    "StoryEvent",
]


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """One copy of an object: in which segment of which node (on which host), at which
    address of that segment's memory, and on which tier."""

    segment_id: str
    node_id: str
    host: str
    tier: Tier
    address: int


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``Client.stat`` says of one object. ``state`` is ``"published"`` (readable) or
    ``"reserved"`` (being written); ``crc32c`` is None where the writer sent no checksum;
    ``age_ms`` counts from its put, ``idle_ms`` from its last read or write."""

    status: KeyStatus
    size: int
    state: str
    replicas: list[ReplicaInfo]
    lease_remaining_ms: int
    pin: Pin
    pin_remaining_ms: int
    crc32c: int | None
    age_ms: int
    idle_ms: int


@dataclass(frozen=True, slots=True)
class KeyPage:
    """One page of ``Client.list_keys``: published keys in order with their sizes; pass
    ``next_start_after`` as ``start_after`` for the next page (empty: this is the last)."""

    keys: list[str]
    sizes: list[int]
    next_start_after: str


@dataclass(frozen=True, slots=True)
class PrefixRemoval:
    """What ``Client.remove_prefix`` and ``remove_all`` did: objects removed, and those kept
    (without ``force``) because a reader leases them or they are being written."""

    removed: int
    leased: int
    not_ready: int


@dataclass(frozen=True, slots=True)
class SegmentStatus:
    """One segment of one storage node, as ``Client.cluster_status`` sees it."""

    segment_id: str
    node_id: str
    host: str
    tier: Tier
    capacity: int
    used: int
    objects: int
    largest_free: int
    persistent: bool


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """The cluster as the master sees it: its segments, published ``objects``,
    ``reservations`` being written, live ``nodes`` and the master's ``uptime_s``;
    ``clients_refused`` says why the master turns clients' calls away now (rebuilding its
    index after an election, or hearing from no storage node: they are retried), empty while
    it serves them."""

    segments: list[SegmentStatus]
    objects: int
    reservations: int
    nodes: int
    uptime_s: float
    clients_refused: str = ""


@dataclass(frozen=True, slots=True)
class StoryEvent:
    """One event of ``Client.story``: ``event`` (``"reserved"``, ``"published"``,
    ``"removed"``, ...), ``age_s`` seconds before the answer, ``time`` on the master's own
    monotonic clock (compare, do not print), and ``details`` (put_id, replicas, reason...)."""

    time: float
    age_s: float
    event: str
    details: dict[str, str]


@dataclass(frozen=True, slots=True)
class RegisteredRegion:
    """Memory registered with ``Client.register_buffer``: ``address`` .. ``address +
    length``. Transfers from or into any part of it skip per-transfer registration; hand it
    back to ``Client.unregister_buffer`` (and keep the buffer alive until then)."""

    address: int
    length: int
    #: The UCX registration behind it: the client's own business.
    _region: Any = field(repr=False, compare=False)

    def contains(self, address: int, length: int) -> bool:
        """Whether ``length`` bytes at ``address`` lie inside the region."""
        return self.address <= address and address + length <= self.address + self.length


# ---- made from the master's answers (the client's own use)


def replica_info(replica: pb.ReplicaInfo) -> ReplicaInfo:
    return ReplicaInfo(
        replica.segment_id, replica.node_id, replica.host, Tier(replica.tier), replica.address
    )


def object_info(info: pb.StatResponse) -> ObjectInfo:
    return ObjectInfo(
        status=KeyStatus(info.status),
        size=info.size,
        state=info.state,
        replicas=[replica_info(r) for r in info.replicas],
        lease_remaining_ms=info.lease_remaining_ms,
        pin=Pin(info.pin),
        pin_remaining_ms=info.pin_remaining_ms,
        crc32c=info.crc32c if info.HasField("crc32c") else None,
        age_ms=info.age_ms,
        idle_ms=info.idle_ms,
    )


def key_page(page: pb.ListKeysResponse) -> KeyPage:
    return KeyPage(list(page.keys), list(page.sizes), page.next_start_after)


def prefix_removal(removal: pb.RemovePrefixResponse) -> PrefixRemoval:
    return PrefixRemoval(removal.removed, removal.leased, removal.not_ready)


def add_removals(a: PrefixRemoval, b: PrefixRemoval) -> PrefixRemoval:
    """Two pages of one removal, counted together."""
    return PrefixRemoval(a.removed + b.removed, a.leased + b.leased, a.not_ready + b.not_ready)


def segment_status(segment: pb.SegmentStatus) -> SegmentStatus:
    return SegmentStatus(
        segment_id=segment.segment_id,
        node_id=segment.node_id,
        host=segment.host,
        tier=Tier(segment.tier),
        capacity=segment.capacity,
        used=segment.used,
        objects=segment.objects,
        largest_free=segment.largest_free,
        persistent=segment.persistent,
    )


def cluster_status(status: pb.ClusterStatusResponse) -> ClusterStatus:
    return ClusterStatus(
        segments=[segment_status(s) for s in status.segments],
        objects=status.objects,
        reservations=status.reservations,
        nodes=status.nodes,
        uptime_s=status.uptime_s,
        clients_refused=status.clients_refused,
    )


def story_event(event: pb.StoryEvent) -> StoryEvent:
    return StoryEvent(event.time, event.age_s, event.event, dict(event.details))
