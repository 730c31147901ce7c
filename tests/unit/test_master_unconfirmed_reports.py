"""What a master adopts of a report from a node whose index log was damaged.

A damaged record in the middle of a node's log may have been a removal: the entries
recorded before it come marked ``unconfirmed`` (storage_node/index_log.py). The master
adopts such an entry only as an object it knows there: the same generation it holds, or a
replica that went away with its node and whose object has not ended since. A removed object
(its Forget answered, so nothing else remembers it) does not come back, and neither does
anything a new leader has not heard of: losing a cached object is allowed, bringing back a
removed one is not.
"""

from __future__ import annotations

import dataclasses

from state_helpers import MiB, declare_dead, new_state, publish, remove, segment_info, stored

from kvpool.common.status import KeyStatus
from kvpool.master.records import PutOptions, SegmentInfo, StoredObject
from kvpool.master.state import MasterState

ON_N1 = PutOptions(replicas=1, preferred_hosts=("n1.cluster.local",))


def unsure(item: StoredObject) -> StoredObject:
    return item._replace(unconfirmed=True)


def restarted(info: SegmentInfo) -> SegmentInfo:
    """The same segment, mounted by a restarted node process (mapped at another address)."""
    return dataclasses.replace(info, base_address=info.base_address + (1 << 30))


def test_an_unconfirmed_object_the_master_holds_is_adopted_again():
    state, _ = new_state()
    n1 = segment_info("n1", MiB)
    state.mount_segment(n1)
    publish(state, "k", 4096)
    held = unsure(stored(state, "k", n1.segment_id))

    assert state.mount_segment(restarted(n1), [held], remount=True, silent=1.0) == []
    assert state.objects["k"].generation == held.generation
    assert [r.segment_id for r in state.objects["k"].replicas] == [n1.segment_id]


def test_an_unconfirmed_object_that_went_away_with_its_node_comes_back_with_it():
    state, clock = new_state()
    n1, n2 = segment_info("n1", MiB), segment_info("n2", MiB)
    state.mount_segment(n1)
    state.mount_segment(n2)
    publish(state, "lost", 4096, options=ON_N1)
    held = unsure(stored(state, "lost", n1.segment_id))
    declare_dead(state, clock, "n1", [n2])
    assert "lost" not in state.objects

    assert state.mount_segment(n1, [held], remount=True, silent=1.0) == []
    assert state.objects["lost"].generation == held.generation


def removed_with_its_forget_answered() -> tuple[MasterState, SegmentInfo, StoredObject]:
    """n1 held "removed"; it was removed and n1 answered the Forget: the state, n1's
    segment, and what n1's damaged log still lists."""
    state, _ = new_state()
    n1 = segment_info("n1", MiB)
    state.mount_segment(n1)
    publish(state, "removed", 4096)
    held = stored(state, "removed", n1.segment_id)
    state.outbox.clear()
    assert remove(state, "removed") is KeyStatus.OK
    for command in state.outbox:  # nothing is left to remember the object by
        state.forget_answered(command.command_id)
    state.outbox.clear()
    return state, n1, held


def test_an_unconfirmed_object_whose_removal_was_answered_is_not_brought_back():
    state, n1, held = removed_with_its_forget_answered()

    report = [unsure(held)]
    assert state.mount_segment(restarted(n1), report, remount=True, silent=1.0) == ["removed"]
    assert "removed" not in state.objects


def test_without_the_mark_the_same_report_would_bring_it_back():
    """What the mark prevents: the master has nothing else to refuse it by."""
    state, n1, held = removed_with_its_forget_answered()

    assert state.mount_segment(restarted(n1), [held], remount=True, silent=1.0) == []
    assert "removed" in state.objects


def test_a_new_leader_adopts_no_unconfirmed_object_but_every_sure_one():
    state, _ = new_state()
    n1 = segment_info("n1", MiB)
    sure = StoredObject("sure", 0, 4096, 5, replicas=1)
    doubtful = StoredObject("doubtful", 1 << 16, 4096, 6, replicas=1, unconfirmed=True)

    assert state.mount_segment(n1, [sure, doubtful]) == ["doubtful"]
    assert sorted(state.objects) == ["sure"]
