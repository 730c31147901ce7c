"""Tunables of the master's metadata core, with the defaults a production cluster starts from."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpool.common.limits import MAX_REPLICAS
from kvpool.master.story import EVENTS, EVENTS_PER_KEY

PLACEMENTS = ("random", "most-free")


#: The longest a write or read grant may run: a storage node refuses capabilities that
#: expire further ahead than it keeps their seals (``SEAL_LIFE`` in
#: storage_node/checked_seals.py, 1800 s), less a margin for clocks and transfers.
MAX_GRANT_SECONDS = 1500.0


@dataclass(frozen=True, slots=True)
class MasterConfig:
    #: Replicas per object when a put does not say.
    default_replicas: int = 1
    #: Upper bound on replicas per object.
    max_replicas: int = MAX_REPLICAS
    #: Read lease granted by GetReplicas when the request does not ask for one (seconds).
    lease_ttl: float = 10.0
    #: Longest lease a request may ask for (seconds).
    max_lease_ttl: float = 600.0
    #: Writers must finish copying this many seconds after PutStart (clients stop their
    #: transfers then). After a master change, free space stays fenced this long (plus a
    #: margin): a writer of the old term may still be copying into it.
    write_timeout: float = 3.0
    #: A reservation not committed within this many seconds is revoked and its key freed.
    reservation_timeout: float = 30.0
    #: Space of a timed-out reservation stays quarantined this much longer, so that a slow
    #: writer that lost its reservation cannot write into another object's buffer.
    reclaim_delay: float = 60.0
    #: A client with reservations that is silent this long has them revoked (seconds).
    client_ttl: float = 10.0
    #: Eviction starts when a segment, or the whole pool, is fuller than this fraction...
    high_watermark: float = 0.90
    #: ...and frees this fraction of its capacity (below the watermark) in LRU order.
    eviction_ratio: float = 0.05
    #: Soft pins last this long unless a put says otherwise (seconds).
    soft_pin_ttl: float = 1800.0
    #: Most objects one put may evict to make room for itself before it reports NO_SPACE.
    max_evictions_per_put: int = 4096
    #: Objects the master holds at most (published and being written, every tenant
    #: together), for its memory's sake; a put beyond evicts the least recently used (None:
    #: no bound; ``kvpool master`` sets one from its memory, ``--max-objects``).
    max_objects: int | None = None
    #: A node silent for this long is declared dead and its replicas dropped (seconds).
    node_ttl: float = 5.0
    #: Page size of ListKeys when the request does not say.
    list_page_size: int = 1000
    #: A read of an object held only on NVMe copies it to DRAM on the same node, if DRAM
    #: has room below its watermark.
    promote_on_hit: bool = True
    #: Where replicas go: "random" nodes (even spread) or "most-free" first.
    placement: str = "random"
    #: Buffers start at multiples of this many bytes.
    alignment: int = 64
    #: Check the core's own invariants (``MasterState.validate``) after every event it
    #: applies: a debugging aid that costs time proportional to everything the master holds,
    #: per call.
    validate_each_event: bool = False
    #: ``MasterState.story``: the last this many events of all keys are kept (0: no story at
    #: all)...
    story_events: int = EVENTS
    #: ...and a key's story tells its last this many.
    story_events_per_key: int = EVENTS_PER_KEY
    #: Re-replication: bytes per second copied between nodes, at most, to give objects that
    #: lost a replica (their node died, or withdrew a segment) a new one, and to copy a
    #: draining node's objects away (0: off; objects keep what is left, drains refused).
    rereplication_rate: float = 0.0
    #: ...and copies in flight at most.
    rereplication_copies: int = 4
    #: Seconds a node may honour a capability past its expiry (its clock's allowance,
    #: security/capabilities.py); None: this master grants no capabilities. With them, space
    #: goes to another object only once every grant of its old one has ended at the nodes.
    capability_skew: float | None = None

    def __post_init__(self) -> None:
        if self.max_objects is not None and self.max_objects < 1:
            raise ValueError(f"max_objects must be at least 1, got {self.max_objects}")
        if not 0.0 < self.high_watermark <= 1.0:
            raise ValueError(f"high_watermark must be in (0, 1], got {self.high_watermark}")
        if not 0.0 <= self.eviction_ratio < self.high_watermark:
            raise ValueError(
                f"eviction_ratio must be in [0, high_watermark), got {self.eviction_ratio}"
            )
        for name in (
            "lease_ttl",
            "max_lease_ttl",
            "reservation_timeout",
            "node_ttl",
            "client_ttl",
            "soft_pin_ttl",
            "write_timeout",
        ):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):  # nan compares false: refused too
                raise ValueError(f"{name} must be a positive finite number, got {value}")
        for name in ("write_timeout", "max_lease_ttl"):  # (how long grants live)
            if getattr(self, name) > MAX_GRANT_SECONDS:
                raise ValueError(
                    f"{name} must be at most {MAX_GRANT_SECONDS:g} s, got {getattr(self, name)}: "
                    "storage nodes refuse capabilities that run further ahead"
                )
        if self.lease_ttl > self.max_lease_ttl:
            raise ValueError(
                f"lease_ttl must be at most max_lease_ttl ({self.max_lease_ttl}),"
                f" got {self.lease_ttl}"
            )
        if not (self.reclaim_delay >= 0 and math.isfinite(self.reclaim_delay)):
            raise ValueError(
                f"reclaim_delay must be a finite number, not negative, got {self.reclaim_delay}"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.story_events_per_key < 1:
            raise ValueError(
                f"story_events_per_key must be at least 1, got {self.story_events_per_key}"
            )
        if self.story_events < 0:
            raise ValueError(f"story_events must not be negative, got {self.story_events}")
        if not (self.rereplication_rate >= 0 and math.isfinite(self.rereplication_rate)):
            raise ValueError(
                "rereplication_rate must be a finite number, not negative, got "
                f"{self.rereplication_rate}"
            )
        if self.rereplication_copies < 1:
            raise ValueError(
                f"rereplication_copies must be at least 1, got {self.rereplication_copies}"
            )
        if not 1 <= self.default_replicas <= self.max_replicas:
            raise ValueError(
                f"default_replicas must be between 1 and max_replicas ({self.max_replicas}),"
                f" got {self.default_replicas}"
            )
