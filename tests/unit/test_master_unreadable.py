"""A storage node's disk fails to read a replica (a reader got DISK_ERROR): the node says so
at its next heartbeat, and the master stops listing that replica.

Left listed, every reader would try it first and fail over, for good, and re-replication
would count it as a copy: the object would be one node's death from lost while the master
believed it safe.
"""

from __future__ import annotations

from state_helpers import (
    MiB,
    get,
    new_state,
    publish,
    segment_info,
    stored,
)

from kvpool.common.status import KeyStatus
from kvpool.master.records import ForgetCommand, SegmentInfo, UnreadableReplica
from kvpool.master.state import MasterState


def three_nodes() -> tuple[MasterState, list[SegmentInfo]]:
    state, _ = new_state()
    infos = [segment_info(n, 4 * MiB) for n in ("n1", "n2", "n3")]
    for info in infos:
        state.mount_segment(info)
    return state, infos


def report(state: MasterState, info: SegmentInfo, key: str, generation: int | None = None):
    """``info``'s node reports its replica of ``key`` unreadable at its heartbeat."""
    held = stored(state, key, info.segment_id)
    generation = held.generation if generation is None else generation
    item = UnreadableReplica(info.segment_id, key, held.offset, generation)
    state.outbox.clear()
    assert state.heartbeat(info.node_id, [info.segment_id], unreadable=[item]) == []
    return held


def node_of(state: MasterState, info_by_segment: dict[str, SegmentInfo], key: str) -> SegmentInfo:
    [first, *_] = state.objects[key].replicas
    assert first is not None
    return info_by_segment[first.segment_id]


def test_an_unreadable_replica_of_an_object_with_others_is_dropped_and_forgotten():
    state, infos = three_nodes()
    by_segment = {i.segment_id: i for i in infos}
    publish(state, "k", 4096, replicas=2)
    bad = node_of(state, by_segment, "k")
    held = report(state, bad, "k")

    location = get(state, "k")
    assert location.status is KeyStatus.OK
    assert [r.segment.segment_id for r in location.replicas] != [bad.segment_id]
    assert bad.segment_id not in {r.segment.segment_id for r in location.replicas}
    [forget] = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert (forget.segment_id, forget.objects[0].offset) == (bad.segment_id, held.offset)
    assert state.counters.replicas_unreadable == 1
    assert [e.event for e in state.story("k")][-1] == "replica_unreadable"


def test_an_object_whose_only_replica_is_unreadable_is_lost_not_served_as_an_error():
    state, infos = three_nodes()
    by_segment = {i.segment_id: i for i in infos}
    publish(state, "k", 4096)
    lost_before = state.counters.objects_lost
    report(state, node_of(state, by_segment, "k"), "k")

    assert get(state, "k").status is KeyStatus.NOT_FOUND
    assert [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert state.counters.objects_lost == lost_before + 1
    assert state.counters.objects_removed == 0


def test_a_late_or_foreign_report_changes_nothing():
    """Of another generation (the key was put again since), or naming a segment of another
    node (a node reports only its own)."""
    state, infos = three_nodes()
    by_segment = {i.segment_id: i for i in infos}
    publish(state, "k", 4096, replicas=2)
    holder = node_of(state, by_segment, "k")
    other = next(
        i
        for i in infos
        if i.segment_id not in {r.segment_id for r in state.objects["k"].replicas if r is not None}
    )
    generation = state.objects["k"].generation
    report(state, holder, "k", generation=generation - 1)
    held = stored(state, "k", holder.segment_id)
    foreign = UnreadableReplica(holder.segment_id, "k", held.offset, generation)
    state.heartbeat(other.node_id, [other.segment_id], unreadable=[foreign])

    assert len(state.objects["k"].replicas) == 2
    assert state.counters.replicas_unreadable == 0
    assert not [c for c in state.outbox if isinstance(c, ForgetCommand)]
