"""Gaps the model check (test_master_model.py) found in what a remount brings back
(master/state.py): each test is the smallest example, kept as an xfail (strict) while the gap
is open; once it is closed the test passes and the model's flag for it
(``REMOVALS_SURVIVE_ORPHANS`` and those beside it) goes True so that the model checks it too.
All are closed now.

A storage node reports what its index holds when it mounts a segment again: after a restart,
at a new master, or when the master that had declared it dead hears from it again. The master
adopts that, newest generation first. So whatever a node recorded, and was never told to forget,
may come back: an object removed meanwhile, an object its writer was told had failed, or an
entry over bytes the master gave to another object since (which the newer entry then displaces).
"""

from __future__ import annotations

from dataclasses import replace

from state_helpers import (
    CONFIG,
    FakeClock,
    MiB,
    get,
    new_state,
    publish,
    remove,
    segment_info,
    stored,
)

from kvpool.common.status import KeyStatus, Tier
from kvpool.master.records import (
    Commit,
    CopyCommand,
    ForgetCommand,
    PersistCommand,
    PutOptions,
    SegmentInfo,
    StoredObject,
)
from kvpool.master.state import MasterState


def nvme_info(node: str, size: int = 4096) -> SegmentInfo:
    info = segment_info(node, size, f"{node}/nvme", base=0x20_0000)
    return replace(info, tier=Tier.NVME, persistent=True)


def test_a_removed_object_stays_removed_when_a_node_declared_dead_remounts():
    """A node declared dead while it lived (a long pause) keeps what it recorded; an object
    removed meanwhile (its removal answered: Forgets went to the replicas the master knew)
    must not come back when the node's heartbeat asks it to remount."""
    state, clock = new_state()
    n1, n2 = segment_info("n1", 1 * MiB), segment_info("n2", 1 * MiB)
    state.mount_segment(n1)
    state.mount_segment(n2)
    contact = clock.now  # when n1 last heard from the master
    publish(state, "k", 4096, replicas=2)
    held = stored(state, "k", n1.segment_id)
    clock.advance(CONFIG.node_ttl + 1)
    state.heartbeat("n2", [n2.segment_id])
    assert state.tick().dead_nodes == ["n1"]
    assert remove(state, "k") is KeyStatus.OK
    assert state.heartbeat("n1", [n1.segment_id]) == [n1.segment_id]
    dropped = state.mount_segment(n1, [held], remount=True, silent=clock.now - contact)
    assert "k" not in state.objects, f"removed, yet adopted again (dropped: {dropped})"


def test_a_removed_object_stays_removed_though_a_cancelled_copy_of_it_landed():
    """A promotion cancelled because its source segment went away leaves its target to the
    node's answer. If the object is removed meanwhile, its node is told to forget the copy it
    may have recorded (after the copy, in order), and the removal waits for that answer: the
    next master, which adopts what nodes report, must not bring it back."""
    state, clock = new_state()
    dram, nvme, other = segment_info("n1", 4096), nvme_info("n1"), nvme_info("n2")
    for info in (dram, nvme, other):
        state.mount_segment(info)
    options = PutOptions(replicas=2, tier=Tier.NVME, preferred_hosts=("n1.cluster.local",))
    publish(state, "k", 1000, options=options)
    state.outbox.clear()
    get(state, "k")  # promoted from n1/nvme into n1/dram0
    [copy] = [c for c in state.outbox if isinstance(c, CopyCommand)]
    state.outbox.clear()
    state.unmount_segment("n1", nvme.segment_id)  # the copy's source goes: cancelled
    clock.advance(CONFIG.lease_ttl + 1)
    assert remove(state, "k") is KeyStatus.OK
    told = {
        (c.segment_id, o.key)
        for c in state.outbox
        if isinstance(c, ForgetCommand)
        for o in c.objects
    }
    assert (dram.segment_id, "k") in told, "the copy its node may have recorded is forgotten"
    # The node carried out the copy (it recorded k in n1/dram0), then stalled: the master
    # stops waiting for the Forget and answers the removal; then it fails over, the next
    # master reading what this one kept for it (etcd).
    for forget in state.outbox:
        if isinstance(forget, ForgetCommand) and forget.segment_id == dram.segment_id:
            state.quarantine(forget)
    record = state.durable_record(dram.segment_id)
    assert record is not None and "k" in record.keys
    new = MasterState(CONFIG, clock=clock, epoch=1)
    new.restore_tombstones({dram.segment_id: record})
    new.mount_segment(dram, [copy.target], remount=True, silent=0.0)
    assert "k" not in new.objects, f"removed, yet adopted again (Forgets sent: {told})"


def retried_commit() -> tuple[MasterState, SegmentInfo, PersistCommand, PersistCommand]:
    """A writer retried its PutEnd while the first waited for the node: two Persists of the
    same replica (n1/nvme+0) are out, the first and the second."""
    state, _ = new_state()
    nvme = nvme_info("n1", 2048)
    state.mount_segment(nvme)
    [slot] = state.put_start("c1", ["k"], [0], PutOptions(tier=Tier.NVME))
    state.outbox.clear()
    commit = Commit("k", slot.put_id, (True,), None)
    assert state.put_end([commit]) == [None]
    [first] = [c for c in state.outbox if isinstance(c, PersistCommand)]
    state.outbox.clear()
    assert state.put_end([commit]) == [None]  # retried: a second Persist
    [second] = [c for c in state.outbox if isinstance(c, PersistCommand)]
    state.outbox.clear()
    return state, nvme, first, second


def test_a_failed_persist_of_a_retried_commit_does_not_outvote_the_one_that_recorded_it():
    """The node runs both Persists in order; the second fails and its answer comes first. The
    first may have recorded the object, so its space must not go back (another object placed
    there would have the node's stale, newer entry adopted over it at the next master): the
    master waits for the first, which decides."""
    state, nvme, first, second = retried_commit()
    state.command_done(second.command_id, False)
    assert state.resolved == [] and not state.outbox, "undecided while the first is out"
    state.command_done(first.command_id, True)  # it recorded k at n1/nvme+0
    assert [r.status for r in state.resolved] == [KeyStatus.OK]
    assert stored(state, "k", nvme.segment_id).offset == first.objects[0].offset


def test_a_persist_answered_after_its_object_ended_is_forgotten():
    """The object is removed (by force) while both Persists are out; the first is answered
    ok afterwards: the node recorded an entry the master holds no replica for, so it is told
    to forget it (whatever the removal's own Forget found)."""
    state, nvme, first, second = retried_commit()
    assert remove(state, "k", force=True) is KeyStatus.OK
    state.outbox.clear()
    state.command_done(second.command_id, False)
    state.command_done(first.command_id, True)
    [forget] = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert (forget.segment_id, forget.objects[0].key) == (nvme.segment_id, "k")
    assert forget.objects[0].offset == first.objects[0].offset


def persist_queued_on_a_paused_node() -> tuple[
    MasterState, FakeClock, SegmentInfo, SegmentInfo, PersistCommand, float
]:
    """``k`` put on n0 and n1, recorded by n0; n1 is paused with its Persist queued (it
    last heard from the master at the time returned)."""
    state, clock = new_state()
    n0, n1 = segment_info("n0", 1 * MiB), segment_info("n1", 1 * MiB)
    state.mount_segment(n0)
    state.mount_segment(n1)
    contact = clock.now
    [slot] = state.put_start("c1", ["k"], [4096], PutOptions(replicas=2))
    assert state.put_end([Commit("k", slot.put_id, (True, True), None)]) == [None]
    persists = {c.segment_id: c for c in state.outbox if isinstance(c, PersistCommand)}
    state.outbox.clear()
    late = persists.pop(n1.segment_id)
    [answered] = persists.values()
    state.command_done(answered.command_id, True)
    return state, clock, n0, n1, late, contact


def stays_removed_at_the_next_master(
    state: MasterState, clock: FakeClock, info: SegmentInfo, late: list[StoredObject]
) -> None:
    """The next master, reading what ``state`` kept for it (etcd), does not adopt ``k`` from
    a report of ``info`` that lists ``late`` (what the node recorded late)."""
    record = state.durable_record(info.segment_id)
    assert record is not None, "nothing kept for the next master"
    for item in late:  # (refused as a tombstone, this generation or older, or exactly)
        covered = record.keys.get(item.key, -1) >= item.generation
        assert covered or (item.key, item.generation) in record.exact, (item, record)
    new = MasterState(CONFIG, clock=clock, epoch=1)
    new.restore_tombstones({info.segment_id: record})
    new.mount_segment(info, late, remount=True, silent=0.0)
    assert "k" not in new.objects, "removed, yet adopted again from a write run late"


def test_a_removed_object_stays_removed_though_its_paused_node_records_it_after_a_remount():
    """A node paused with a Persist queued is declared dead; the object is removed meanwhile
    (its Forget queued behind the Persist). The node wakes, remounts with what its index
    holds (not the object yet), then carries out the Persist, and the master fails over
    before the Forget: the next master must not adopt the removed object from its report."""
    state, clock, n0, n1, late, contact = persist_queued_on_a_paused_node()
    assert remove(state, "k", force=True) is KeyStatus.OK
    state.outbox.clear()  # (the Forget to n1 queues behind the Persist)
    clock.advance(CONFIG.node_ttl + 1)
    state.heartbeat("n0", [n0.segment_id])
    assert state.tick().dead_nodes == ["n1"]
    assert state.heartbeat("n1", [n1.segment_id]) == [n1.segment_id]
    state.mount_segment(n1, [], remount=True, silent=clock.now - contact)  # k not recorded yet
    stays_removed_at_the_next_master(state, clock, n1, list(late.objects))


def test_a_removed_object_stays_removed_though_a_copy_queued_before_its_loss_lands_late():
    """A node paused with a copy of an object queued (a promotion from its NVMe into its
    DRAM) is declared dead: the copy is cancelled and the object lost with the node. The
    node wakes and remounts: its NVMe first, whose report brings the object back (the same
    generation, in a new record), then its DRAM, before it carries out the copy. The object
    is removed; the next master must not adopt it from the copy the node then records."""
    state, clock = new_state()
    dram, nvme = segment_info("n1", 4096), nvme_info("n1")
    state.mount_segment(dram)
    state.mount_segment(nvme)
    contact = clock.now
    options = PutOptions(replicas=1, tier=Tier.NVME)
    slot = publish(state, "k", 1000, options=options)
    item = stored(state, "k", nvme.segment_id)
    state.outbox.clear()
    get(state, "k")  # a promotion into n1/dram0, queued on the paused node
    [copy] = [c for c in state.outbox if isinstance(c, CopyCommand)]
    state.outbox.clear()
    clock.advance(CONFIG.node_ttl + 1)
    assert state.tick().dead_nodes == ["n1"]
    assert "k" not in state.objects, "lost with its only node"
    silent = clock.now - contact
    state.mount_segment(nvme, [item], remount=True, silent=silent)
    assert state.objects["k"].generation == slot.put_id, "adopted again"
    state.mount_segment(dram, [], remount=True, silent=silent)  # (the copy not run yet)
    assert remove(state, "k", force=True) is KeyStatus.OK  # (the get's lease runs)
    stays_removed_at_the_next_master(state, clock, dram, [copy.target])


def test_a_removed_object_stays_removed_though_a_persist_given_up_while_its_node_was_away_lands():
    """A Persist queued on a paused node is given up on (its answer never came) after the
    node was declared dead: no Forget can follow it while the segment is not mounted. The
    object is removed; the node wakes, remounts without it, then carries out the Persist: the
    next master must not adopt the removed object from its report."""
    state, clock, n0, n1, late, contact = persist_queued_on_a_paused_node()
    clock.advance(CONFIG.node_ttl + 1)
    state.heartbeat("n0", [n0.segment_id])
    assert state.tick().dead_nodes == ["n1"]
    state.command_expired(late.command_id)  # (the I/O layer stops waiting)
    assert remove(state, "k") is KeyStatus.OK
    assert state.heartbeat("n1", [n1.segment_id]) == [n1.segment_id]
    state.mount_segment(n1, [], remount=True, silent=clock.now - contact)  # k not recorded yet
    stays_removed_at_the_next_master(state, clock, n1, list(late.objects))


def test_a_write_that_never_published_keeps_out_its_own_generation_only():
    """A Persist of ``k`` queued on a paused node, whose object was never published (its
    only node was declared dead first: NO_REPLICA), is a late write kept out at the node's
    remounts. An older generation of ``k`` that the node's report brings back (a lost
    object returning with its node) is adopted, and must stay adopted at the next remount:
    the late write's refusal is not a removal of older generations."""
    state, clock = new_state()
    n0, n1 = segment_info("n0", 1 * MiB), segment_info("n1", 1 * MiB)
    state.mount_segment(n0)
    state.mount_segment(n1)
    older = publish(state, "other", 4096)  # (an older generation's number, for k)
    state.outbox.clear()
    contact = clock.now
    on_n1 = PutOptions(replicas=1, preferred_hosts=("n1.cluster.local",))
    [slot] = state.put_start("c1", ["k"], [4096], on_n1)
    assert state.put_end([Commit("k", slot.put_id, (True,), None)]) == [None]
    [persist] = [c for c in state.outbox if isinstance(c, PersistCommand)]
    assert persist.segment_id == n1.segment_id
    state.outbox.clear()  # (queued on the paused n1)

    def n1_declared_dead_then_remounts_with(report: list[StoredObject]) -> None:
        clock.advance(CONFIG.node_ttl + 1)
        state.heartbeat("n0", [n0.segment_id])
        assert state.tick().dead_nodes == ["n1"]
        assert state.heartbeat("n1", [n1.segment_id]) == [n1.segment_id]
        state.mount_segment(n1, report, remount=True, silent=clock.now - contact)

    stale = StoredObject("k", 64 * 4096, 1000, older.put_id)
    n1_declared_dead_then_remounts_with([stale])
    assert [r.status for r in state.resolved] == [KeyStatus.NO_REPLICA]
    assert state.objects["k"].generation == older.put_id, "the older generation comes back"

    n1_declared_dead_then_remounts_with([stale, *persist.objects])  # (it ran the Persist)

    assert "k" in state.objects, "an object that lives was kept out by a write that did not"
    assert state.objects["k"].generation == older.put_id
    record = state.durable_record(n1.segment_id)
    assert record is not None and ("k", slot.put_id) in record.exact and "k" not in record.keys


def test_a_late_copy_of_an_object_only_lost_is_adopted_once_the_object_is_back():
    """A promotion (n1's NVMe into its DRAM) is queued on a paused node, declared dead: the
    object is lost with its only replica, on n1/nvme, not ended. The node remounts its DRAM
    first, the copy not run yet: that copy's object may come back with the NVMe, so the copy
    is not kept out (it goes away, as the replicas of a lost object do). The NVMe brings the
    object back; the node then runs the copy, and the DRAM replica it records is adopted at
    the next remount (it used to be refused as a late write of an ended object)."""
    state, clock = new_state()
    dram, nvme = segment_info("n1", 4096), nvme_info("n1")
    state.mount_segment(dram)
    state.mount_segment(nvme)
    contact = clock.now
    slot = publish(state, "k", 1000, options=PutOptions(replicas=1, tier=Tier.NVME))
    item = stored(state, "k", nvme.segment_id)
    state.outbox.clear()
    get(state, "k")  # a promotion into n1/dram0, queued on the paused node
    [copy] = [c for c in state.outbox if isinstance(c, CopyCommand)]
    state.outbox.clear()

    def n1_declared_dead_then_remounts(reports: dict[str, list[StoredObject]]) -> None:
        clock.advance(CONFIG.node_ttl + 1)
        assert state.tick().dead_nodes == ["n1"]
        for info in (dram, nvme):  # (DRAM first)
            state.mount_segment(
                info, reports[info.segment_id], remount=True, silent=clock.now - contact
            )

    n1_declared_dead_then_remounts({dram.segment_id: [], nvme.segment_id: [item]})
    assert state.objects["k"].generation == slot.put_id, "back with the NVMe"
    record = state.durable_record(dram.segment_id)
    assert record is None or ("k", slot.put_id) not in record.exact

    contact = clock.now  # (the node ran the copy: its DRAM records k)
    n1_declared_dead_then_remounts({dram.segment_id: [copy.target], nvme.segment_id: [item]})

    held = {replica.segment_id for replica in state.objects["k"].replicas if replica}
    assert held == {dram.segment_id, nvme.segment_id}, "the copy's replica was refused"
