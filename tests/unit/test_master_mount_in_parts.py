"""A segment that holds more objects than one call carries is reported in parts
(master/state.py: ``mount_segment`` with ``more``, then ``report_more``).

A node mounts a segment with what its index holds: after a restart, or at a new master. One
MountSegment carries at most the batch limit of objects, so a node holding more sends them
in parts, newest first. Every object of every part is adopted as a one-part mount adopts it;
a part sent again changes nothing; and until the last part, the master places nothing new in
the segment, where an object of a part still to come may lie.
"""

from __future__ import annotations

from state_helpers import (
    CONFIG,
    KiB,
    MiB,
    declare_dead,
    get,
    new_state,
    publish,
    put,
    remove,
    segment_info,
    stored,
)

from kvpool.common.status import KeyStatus
from kvpool.master.core import MasterCore
from kvpool.master.records import StoredObject
from kvpool.master.tombstones import DurableRecord
from kvpool.proto import master_pb2 as pb
from kvpool.storage_node.node import report_parts


def held(count: int, size: int = 4 * KiB, first_generation: int = 1) -> list[StoredObject]:
    """``count`` objects of ``size`` bytes, back to back, as a node's index reports them."""
    return [
        StoredObject(f"k{i}", i * size, size, first_generation + i, replicas=1)
        for i in range(count)
    ]


def test_every_object_of_every_part_is_adopted():
    state, _ = new_state()
    info = segment_info("n1", 1 * MiB)
    objects = held(200)
    assert state.mount_segment(info, objects[:80], more=True) == []
    assert state.report_more(info, objects[80:160], more=True) == []
    assert state.report_more(info, objects[160:], more=False) == []
    for item in objects:
        location = get(state, item.key)
        assert location.status is KeyStatus.OK, item.key
        assert [r.address - info.base_address for r in location.replicas] == [item.offset]


def test_nothing_new_is_placed_in_the_segment_until_the_last_part():
    state, _ = new_state()
    info = segment_info("n1", 1 * MiB)
    objects = held(100)
    state.mount_segment(info, objects[:50], more=True)
    slot = put(state, "new", 4 * KiB)
    assert slot.status is KeyStatus.FENCED
    assert "still reporting" in slot.message
    state.report_more(info, objects[50:], more=False)
    slot = put(state, "new", 4 * KiB)
    assert slot.status is KeyStatus.OK, slot.message
    taken = {item.offset for item in objects}
    assert slot.replicas[0].address - info.base_address not in taken


def test_the_fence_of_a_remount_still_holds_after_the_last_part():
    state, clock = new_state()
    info = segment_info("n1", 1 * MiB)
    state.mount_segment(info, held(10)[:5], remount=True, more=True)
    state.report_more(info, held(10)[5:], more=False)
    assert put(state, "new", 4 * KiB).status is KeyStatus.FENCED  # (old writers may copy)
    clock.advance(CONFIG.write_timeout + 5)
    assert put(state, "new", 4 * KiB).status is KeyStatus.OK


def test_a_part_sent_again_changes_nothing():
    state, _ = new_state()
    info = segment_info("n1", 1 * MiB)
    objects = held(60)
    state.mount_segment(info, objects[:30], more=True)
    assert state.report_more(info, objects[30:], more=False) == []
    before = {k: (o.generation, list(o.replicas)) for k, o in state.objects.items()}
    assert state.mount_segment(info, objects[:30], more=True) == []  # (begun again)
    assert state.report_more(info, objects[30:], more=False) == []
    after = {k: (o.generation, list(o.replicas)) for k, o in state.objects.items()}
    assert after == before
    assert put(state, "new", 4 * KiB).status is KeyStatus.OK


def test_a_newer_object_of_an_earlier_part_keeps_its_bytes_over_an_older_one_later():
    """Parts go newest first: where a newer object lies over an older one's bytes (the older
    was removed and its space reused while the node missed the Forget), the newer wins."""
    state, _ = new_state()
    info = segment_info("n1", 1 * MiB)
    newer = StoredObject("newer", 0, 8 * KiB, 50, replicas=1)
    older = StoredObject("older", 4 * KiB, 8 * KiB, 10, replicas=1)
    assert state.mount_segment(info, [newer], more=True) == []
    assert state.report_more(info, [older], more=False) == ["older"]
    assert get(state, "newer").status is KeyStatus.OK
    assert get(state, "older").status is KeyStatus.NOT_FOUND


def test_a_part_for_a_segment_not_mounted_so_is_refused():
    state, _ = new_state()
    info = segment_info("n1", 1 * MiB)
    assert state.report_more(info, held(3), more=False) is None
    state.mount_segment(info, [], more=True)
    moved = segment_info("n1", 2 * MiB)  # (the same id, another segment)
    assert state.report_more(moved, held(3), more=False) is None


# ---- the node's side: how it cuts its report


def test_a_node_reports_what_fits_one_call_in_one_part():
    objects = [pb.StoredObject(key=f"k{i}", generation=i) for i in range(5)]
    assert list(report_parts(objects, most=5)) == [(objects, (False, False))]
    assert list(report_parts([], most=5)) == [([], (False, False))]


def test_a_node_reports_more_in_parts_newest_first():
    objects = [pb.StoredObject(key=f"k{i}", generation=i) for i in range(12)]
    parts = list(report_parts(objects, most=5))
    assert [flags for _, flags in parts] == [(False, True), (True, True), (True, False)]
    assert [len(part) for part, _ in parts] == [5, 5, 2]
    generations = [o.generation for part, _ in parts for o in part]
    assert generations == sorted(range(12), reverse=True)


# ---- a new leader takes clients once the reports are over


def test_a_new_leader_takes_clients_only_once_every_part_has_come():
    state, _ = new_state()
    core = MasterCore(state, awaited_nodes={"n1"}, rebuild_window=30.0)
    info = segment_info("n1", 1 * MiB)
    objects = held(10)
    core.mount_segment(1, info, objects[:5], True, 0.0, more=True)
    assert not core.accepting_clients(), "it would answer NOT_FOUND for the rest"
    core.report_more(2, info, objects[5:], more=False)
    assert core.accepting_clients()


def test_a_report_never_finished_holds_clients_back_no_longer_than_the_rebuild_window():
    state, clock = new_state()
    core = MasterCore(state, awaited_nodes={"n1"}, rebuild_window=30.0)
    core.mount_segment(1, segment_info("n1", 1 * MiB), held(5), True, 0.0, more=True)
    assert not core.accepting_clients()
    clock.advance(31.0)
    assert core.accepting_clients()


def test_a_restarted_lone_master_waits_for_the_parts_too():
    state, clock = new_state()
    core = MasterCore(state, awaited_nodes=None, rebuild_window=30.0)
    info = segment_info("n1", 1 * MiB)
    objects = held(10)
    core.mount_segment(1, info, objects[:5], True, 0.0, more=True)
    clock.advance(10.0)  # (long past the quiet time after the last new node)
    assert not core.accepting_clients()
    core.report_more(2, info, objects[5:], more=False)
    assert core.accepting_clients()


def test_a_report_cut_short_then_sent_whole_takes_every_object_and_ends_the_fence():
    """A node's report in parts broke off after its first part; by its next try it holds
    few enough objects for one call (some were forgotten meanwhile), and sends them whole."""
    state, _ = new_state()
    info = segment_info("n1", 1 * MiB)
    objects = held(30)
    state.mount_segment(info, objects[:10], more=True)  # (then the node's call failed)
    assert state.mount_segment(info, objects[5:]) == []  # whole now: 25 objects
    for item in objects:
        assert get(state, item.key).status is KeyStatus.OK, item.key
    assert put(state, "new", 4 * KiB).status is KeyStatus.OK


# ---- what the master refuses at a mount holds for every part


def _declared_dead_with(names: list[str]):
    """n1 and n2 hold ``names`` (two replicas each, published in that order); n1 is declared
    dead while it lives on (a long pause). (state, clock, n1's info, what n1 reports of each
    key, when n1 last heard from the master)."""
    state, clock = new_state()
    n1, n2 = segment_info("n1", 1 * MiB), segment_info("n2", 1 * MiB)
    state.mount_segment(n1)
    state.mount_segment(n2)
    contact = clock.now
    for name in names:
        publish(state, name, 4 * KiB, replicas=2)
    reports = {name: stored(state, name, n1.segment_id) for name in names}
    declare_dead(state, clock, "n1", [n2])
    return state, clock, n1, reports, contact


def test_an_object_removed_while_its_node_was_away_stays_removed_in_a_later_part():
    """A removal answered while n1 was away is kept (a tombstone) until n1's report is over,
    not only through its first part: the removed object, older, comes in the last part."""
    state, clock, n1, reports, contact = _declared_dead_with(["old", "new"])
    assert remove(state, "old") is KeyStatus.OK
    assert state.heartbeat("n1", [n1.segment_id]) == [n1.segment_id]
    silent = clock.now - contact
    state.mount_segment(n1, [reports["new"]], remount=True, silent=silent, more=True)
    dropped = state.report_more(n1, [reports["old"]], more=False)
    assert "old" not in state.objects, f"removed, yet adopted again (dropped: {dropped})"
    assert dropped == ["old"]
    assert get(state, "new").status is KeyStatus.OK


def test_what_a_report_in_parts_refuses_is_what_the_same_report_whole_refuses():
    """The same removals, the same report: in one call or in parts, the same objects are
    adopted and the same keys dropped."""
    names = [f"k{i}" for i in range(12)]
    outcomes = []
    for cut in (None, 4, 9):
        state, clock, n1, reports, contact = _declared_dead_with(names)
        for name in names[::3]:
            assert remove(state, name) is KeyStatus.OK
        state.heartbeat("n1", [n1.segment_id])
        report = sorted(reports.values(), key=lambda s: s.generation, reverse=True)
        silent = clock.now - contact
        if cut is None:
            dropped = state.mount_segment(n1, report, remount=True, silent=silent)
        else:
            dropped = state.mount_segment(n1, report[:cut], remount=True, silent=silent, more=True)
            dropped += state.report_more(n1, report[cut:], more=False) or []
        adopted = sorted(k for k in names if k in state.objects)
        outcomes.append((adopted, sorted(dropped)))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert outcomes[0][1] == sorted(names[::3])


def test_a_new_leader_in_the_middle_of_a_report_still_refuses_what_was_removed():
    """What the first part's mount held back stays in the segment's durable record until
    the last part: a leader that takes over in between refuses it too."""
    state, _, n1, reports, _ = _declared_dead_with(["old", "new"])
    assert remove(state, "old") is KeyStatus.OK
    state.heartbeat("n1", [n1.segment_id])
    state.mount_segment(n1, [reports["new"]], remount=True, silent=1.0, more=True)
    assert state.durable_changes() >= {n1.segment_id}
    record = state.durable_record(n1.segment_id)
    assert record is not None and "old" in record.keys, record

    successor, _ = new_state()  # (it never heard the first part: n1 starts again)
    successor.restore_tombstones({n1.segment_id: record})
    successor.mount_segment(n1, [reports["new"]], remount=True, silent=1.0, more=True)
    assert successor.report_more(n1, [reports["old"]], more=False) == ["old"]
    assert "old" not in successor.objects

    state.report_more(n1, [reports["old"]], more=False)
    old = reports["old"]
    assert state.durable_record(n1.segment_id) == DurableRecord(
        False, {}, frozenset({(old.key, old.generation)})
    ), "let go of at the last part: the Forget of the entry it refused keeps it out now"


def test_a_node_s_own_entry_holds_until_its_report_in_parts_is_over():
    """A new leader took clients before n2 remounted: what ended meanwhile is refused of
    every part of n2's report, though n2 heartbeats between parts (its segment is mounted,
    its report not over yet)."""
    state, _ = new_state()
    n1, n2 = segment_info("n1", 1 * MiB), segment_info("n2", 1 * MiB)
    state.mount_segment(n1)
    state.mount_segment(n2)
    for name in ("old", "new"):
        publish(state, name, 4 * KiB, replicas=2)
    on = {s.segment_id: [stored(state, k, s.segment_id) for k in ("old", "new")] for s in (n1, n2)}

    successor, _ = new_state()
    successor.mount_segment(n1, on[n1.segment_id], remount=True, silent=0.0)
    successor.nodes_unheard(["n2"])  # (its rebuild window passed without n2)
    assert remove(successor, "old", force=True) is KeyStatus.OK  # (adopted: leased)
    old, new = on[n2.segment_id]
    successor.mount_segment(n2, [new], remount=True, silent=0.0, more=True)
    assert successor.heartbeat("n2", [n2.segment_id]) == []
    assert successor.report_more(n2, [old], more=False) == ["old"]
    assert "old" not in successor.objects
