"""Gaps the model check (test_master_model.py) found in what a remount brings back
(master/state.py): each test is the smallest example, expected to fail (xfail, strict) until
the gap is closed; then the model's flag for it (``REMOVALS_SURVIVE_ORPHANS`` and those beside
it) goes True so that the model checks it too.

A storage node reports what its index holds when it mounts a segment again: after a restart,
at a new master, or when the master that had declared it dead hears from it again. The master
adopts that, newest generation first. So whatever a node recorded, and was never told to forget,
may come back: an object removed meanwhile, an object its writer was told had failed, or an
entry over bytes the master gave to another object since (which the newer entry then displaces).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from state_helpers import CONFIG, MiB, get, new_state, publish, remove, segment_info, stored

from kvpool.common.status import KeyStatus, Tier
from kvpool.master.records import (
    Commit,
    CopyCommand,
    ForgetCommand,
    PersistCommand,
    PutOptions,
    SegmentInfo,
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


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="a parked copy is not forgotten")
def test_a_removed_object_stays_removed_though_a_cancelled_copy_of_it_landed():
    """A promotion cancelled because its source segment went away leaves its target to the
    node's answer; if the object is removed meanwhile, nothing tells the node to forget the
    copy it may have recorded, and the next master adopts it."""
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
    # The node carried out the copy (it recorded k in n1/dram0); the master fails over.
    new = MasterState(CONFIG, clock=clock, epoch=1)
    new.mount_segment(dram, [copy.target], remount=True, silent=0.0)
    assert "k" not in new.objects, f"removed, yet adopted again (Forgets sent: {told})"


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="a failed Persist is not forgotten")
def test_a_failed_persist_of_a_retried_commit_leaves_no_entry_behind():
    """A writer retries its PutEnd while the first waits for the node: a second Persist goes out
    for the same replica. The node runs both in order; the second fails and its answer comes
    first: the master frees the buffer (the node recorded nothing, it thinks) and answers
    NO_REPLICA. But the first recorded the object, and nothing tells the node to forget it.
    Once the master gives those bytes to an older object (a demotion keeps its generation),
    the next master adopts the stale, newer entry there and drops the published object."""
    state, clock = new_state()
    dram = segment_info("n1", 1024, "n1/d0")
    nvme = nvme_info("n1", 2048)
    state.mount_segment(dram)
    state.mount_segment(nvme)
    publish(state, "old", 1000, options=PutOptions(tier=Tier.DRAM))  # generation 1, in DRAM
    [slot] = state.put_start("c1", ["k"], [0], PutOptions(tier=Tier.NVME))  # n1/nvme+0
    state.outbox.clear()
    commit = Commit("k", slot.put_id, (True,), None)
    assert state.put_end([commit]) == [None]
    [first] = [c for c in state.outbox if isinstance(c, PersistCommand)]
    state.outbox.clear()
    assert state.put_end([commit]) == [None]  # retried: a second Persist
    [second] = [c for c in state.outbox if isinstance(c, PersistCommand)]
    state.outbox.clear()
    state.command_done(second.command_id, False)
    assert [r.status for r in state.resolved] == [KeyStatus.NO_REPLICA]
    state.resolved.clear()
    state.command_done(first.command_id, True)  # it recorded k at n1/nvme+0
    assert "k" not in state.objects
    leftover = first.objects[0]
    state.tick()  # DRAM is above its watermark: "old" is demoted to n1/nvme, at offset 0
    [copy] = [c for c in state.outbox if isinstance(c, CopyCommand)]
    state.outbox.clear()
    state.command_done(copy.command_id, True)
    state.outbox.clear()
    assert stored(state, "old", nvme.segment_id).offset == leftover.offset
    clock.advance(1.0)  # the master fails over: the node reports its index
    new = MasterState(CONFIG, clock=clock, epoch=1)
    new.mount_segment(dram, [], remount=True, silent=1.0)
    dropped = new.mount_segment(nvme, [leftover, copy.target], remount=True, silent=1.0)
    assert "old" in new.objects, f"the published object lost (dropped: {dropped}) for {leftover}"
