"""Helpers shared by the specifications of the master's sans-IO core (``master/state.py``).

A ``MasterState`` here always runs on a ``FakeClock`` (time passes only when a test says so) and
a seeded random generator (random placement makes the same choices on every run). The helpers
spell one event each, in the words of the design: mount a segment, start a put, commit it,
publish (both), read, remove.
"""

from __future__ import annotations

import random

from kvpool.common.status import KeyStatus, Tier
from kvpool.master.config import MasterConfig
from kvpool.master.records import (
    Commit,
    Location,
    PutOptions,
    PutSlot,
    SegmentInfo,
    SegmentUsage,
    StoredObject,
)
from kvpool.master.state import MasterState

KiB = 1024
MiB = 1024 * KiB


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "time does not go backwards"
        self.now += seconds


CONFIG = MasterConfig()  # the production defaults: these tests spell the rules in their terms
MOST_FREE = MasterConfig(placement="most-free")


def new_state(
    config: MasterConfig = CONFIG, seed: int = 0, epoch: int = 0
) -> tuple[MasterState, FakeClock]:
    clock = FakeClock()
    return MasterState(config, clock=clock, rng=random.Random(seed), epoch=epoch), clock


def segment_info(
    node: str,
    size: int,
    segment: str | None = None,
    *,
    base: int = 0x10_0000,
    host: str | None = None,
) -> SegmentInfo:
    """What node ``node`` would send to mount a segment of ``size`` bytes."""
    return SegmentInfo(
        segment_id=segment or f"{node}/dram0",
        node_id=node,
        host=host or f"{node}.cluster.local",
        worker_address=f"ucx-worker-of-{node}".encode(),
        base_address=base,
        size=size,
        rkey=f"rkey-of-{segment or node}".encode(),
        tier=Tier.DRAM,
    )


def mount(
    state: MasterState,
    node: str,
    size: int = 1 * MiB,
    segment: str | None = None,
    *,
    host: str | None = None,
) -> SegmentInfo:
    info = segment_info(node, size, segment, host=host)
    state.mount_segment(info)
    return info


def put(
    state: MasterState,
    key: str,
    size: int = 4 * KiB,
    replicas: int = 1,
    client: str = "c1",
    *,
    options: PutOptions | None = None,
) -> PutSlot:
    """Starts a put of one key (``options``, when given, replace ``replicas``)."""
    [slot] = state.put_start(client, [key], [size], options or replicas)
    return slot


def answer_nodes(state: MasterState, ok: bool = True) -> list:
    """Every node answers every command the master sent (as the service would relay)."""
    sent = list(state.outbox)
    state.outbox.clear()
    for command in sent:
        if state.awaiting(command.command_id):
            state.command_done(command.command_id, ok)
    return sent


def end_puts(state: MasterState, commits: list[Commit], nodes_ok: bool = True) -> list[KeyStatus]:
    """PutEnd as a client sees it: the master waits for the nodes to record each object."""
    statuses = state.put_end(commits)
    answer_nodes(state, nodes_ok)
    settled = {(r.key, r.put_id): r.status for r in state.resolved}
    state.resolved.clear()
    return [
        settled[(c.key, c.put_id)] if status is None else status
        for c, status in zip(commits, statuses, strict=True)
    ]


def commit(
    state: MasterState, key: str, slot: PutSlot, *replica_ok: bool, crc32c: int | None = None
) -> KeyStatus:
    """Ends a put; by default the writer reports every replica written."""
    ok = replica_ok or (True,) * len(slot.replicas)
    [status] = end_puts(state, [Commit(key, slot.put_id, tuple(ok), crc32c)])
    return status


def publish(
    state: MasterState,
    key: str,
    size: int = 4 * KiB,
    replicas: int = 1,
    *,
    options: PutOptions | None = None,
    crc32c: int | None = None,
) -> PutSlot:
    """A complete, successful put."""
    slot = put(state, key, size, replicas, options=options)
    assert slot.status is KeyStatus.OK, slot.message
    assert commit(state, key, slot, crc32c=crc32c) is KeyStatus.OK
    return slot


def get(state: MasterState, key: str, lease_ttl: float = 0.0) -> Location:
    [location], _ = state.get_replicas([key], lease_ttl)
    return location


def exists(state: MasterState, key: str, lease_ttl: float = 0.0) -> KeyStatus:
    [status] = state.exists([key], lease_ttl)
    return status


def remove(state: MasterState, key: str, force: bool = False) -> KeyStatus:
    [status] = state.remove([key], force)
    return status


def nodes_of(slot_or_location) -> list[str]:
    return [replica.segment.node_id for replica in slot_or_location.replicas]


def segments_of(slot_or_location) -> list[str]:
    return [replica.segment.segment_id for replica in slot_or_location.replicas]


def usage(state: MasterState, segment_id: str) -> SegmentUsage:
    [found] = [u for u in state.snapshot().segments if u.info.segment_id == segment_id]
    return found


def used(state: MasterState, segment_id: str) -> int:
    return usage(state, segment_id).used


def total_used(state: MasterState) -> int:
    return sum(u.used for u in state.snapshot().segments)


def rounded(size: int) -> int:
    """Bytes a buffer of ``size`` occupies in a segment."""
    unit = CONFIG.alignment
    return max(unit, -(-size // unit) * unit)


def stored(state: MasterState, key: str, segment_id: str) -> StoredObject:
    """What the node holding ``key``'s replica in ``segment_id`` reports when it remounts."""
    record = state.objects[key]
    [offset] = [r.offset for r in record.replicas if r is not None and r.segment_id == segment_id]
    return StoredObject(key, offset, record.size, record.put_id, record.crc32c)


def declare_dead(state: MasterState, clock: FakeClock, node: str, alive: list[SegmentInfo]) -> None:
    """Time passes past the node TTL with only ``alive``'s nodes heartbeating: ``node`` is
    declared dead (while it may live on: a long pause)."""
    clock.advance(CONFIG.node_ttl + 1)
    for info in alive:
        state.heartbeat(info.node_id, [info.segment_id])
    assert state.tick().dead_nodes == [node]
