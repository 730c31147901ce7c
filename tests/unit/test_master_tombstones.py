"""What a remounting node may report but must not bring back (master/tombstones.py).

A node away (declared dead while it lived) keeps what it recorded. When it mounts its segment
again the master adopts what it reports, except objects removed meanwhile, and objects whose
Forget it never answered; an object that went away with it, never removed, comes back.
"""

from __future__ import annotations

from state_helpers import (
    FakeClock,
    MiB,
    declare_dead,
    new_state,
    publish,
    put,
    remove,
    segment_info,
    stored,
)

from kvpool.common.status import KeyStatus
from kvpool.master.core import MasterCore
from kvpool.master.records import Commit, ForgetCommand, PutOptions, SegmentInfo, StoredObject
from kvpool.master.state import MasterState
from kvpool.master.tombstones import ANY, MAX_AGE, RECORD_LIMIT, DurableRecord, Tombstones

ON_N1 = PutOptions(replicas=1, preferred_hosts=("n1.cluster.local",))


def two_nodes() -> tuple[MasterState, FakeClock, SegmentInfo, SegmentInfo]:
    state, clock = new_state()
    n1, n2 = segment_info("n1", MiB), segment_info("n2", MiB)
    state.mount_segment(n1)
    state.mount_segment(n2)
    return state, clock, n1, n2


def one_removal() -> tuple[MasterState, SegmentInfo, ForgetCommand]:
    """One node; an object put and removed: the state, the node's segment, and the Forget
    its node was sent (unanswered yet)."""
    state, _ = new_state()
    n1 = segment_info("n1", MiB)
    state.mount_segment(n1)
    publish(state, "k", 4096)
    state.outbox.clear()
    remove(state, "k")
    [forget] = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    return state, n1, forget


def test_an_object_lost_with_its_node_comes_back_with_it():
    state, clock, n1, n2 = two_nodes()
    publish(state, "only-on-n1", 4096, options=ON_N1)
    held = stored(state, "only-on-n1", n1.segment_id)
    declare_dead(state, clock, "n1", [n2])
    assert "only-on-n1" not in state.objects

    assert state.mount_segment(n1, [held], remount=True, silent=1.0) == []
    assert state.objects["only-on-n1"].generation == held.generation


def test_a_removal_of_an_object_lost_with_its_node_sticks_when_the_node_returns():
    """Found by the HA audit (2026-12-06): remove() of a lost object answered NOT_FOUND and
    changed nothing, and the object came back with its node."""
    state, clock, n1, n2 = two_nodes()
    publish(state, "lost", 4096, options=ON_N1)
    held = stored(state, "lost", n1.segment_id)
    declare_dead(state, clock, "n1", [n2])

    assert remove(state, "lost") is KeyStatus.NOT_FOUND  # (nothing the master can reach)
    assert state.mount_segment(n1, [held], remount=True, silent=1.0) == ["lost"], "refused"
    assert "lost" not in state.objects


def test_a_prefix_removal_reaches_objects_lost_with_their_node():
    state, clock, n1, n2 = two_nodes()
    publish(state, "p/lost", 4096, options=ON_N1)
    publish(state, "q/lost", 4096, options=ON_N1)
    held = [stored(state, key, n1.segment_id) for key in ("p/lost", "q/lost")]
    declare_dead(state, clock, "n1", [n2])

    state.remove_prefix("p/")
    assert state.mount_segment(n1, held, remount=True, silent=1.0) == ["p/lost"]
    assert "q/lost" in state.objects, "a lost object outside the prefix comes back"


def test_an_object_whose_forget_went_unanswered_is_not_adopted_again():
    state, clock, n1, n2 = two_nodes()
    publish(state, "k", 4096, options=ON_N1)
    held = stored(state, "k", n1.segment_id)
    state.outbox.clear()
    assert remove(state, "k") is KeyStatus.OK
    [forget] = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert forget.segment_id == n1.segment_id  # sent, never answered: n1 stalls
    declare_dead(state, clock, "n1", [n2])

    assert state.mount_segment(n1, [held], remount=True, silent=1.0) == ["k"]
    assert "k" not in state.objects


def test_an_answered_forget_leaves_no_tombstone():
    state, _, forget = one_removal()
    state.forget_answered(forget.command_id)
    assert len(state._tombstones) == 0


def test_past_its_bound_a_segment_is_distrusted_rather_than_tombstones_grow():
    tombstones = Tombstones(limit=2)
    tombstones.away("s1", "a", 1)
    tombstones.away("s1", "b", 2)
    tombstones.away("s1", "c", 3)  # one too many: s1's entries go, s1 is distrusted
    assert len(tombstones) == 0
    assert tombstones.refuses("s1", "c", 3, known=False), "an object the master lost stays lost"
    assert not tombstones.refuses("s1", "d", 4, known=True), "a replica of a live one is taken"
    tombstones.mounted("s1")
    assert not tombstones.refuses("s1", "c", 3, known=False), "trusted again after its mount"


def test_a_removal_of_a_key_removes_older_generations_that_went_away():
    tombstones = Tombstones()
    tombstones.away("s1", "k", 5)
    tombstones.ended("k", 9)  # a newer write of k, then removed
    assert tombstones.refuses("s1", "k", 5, known=False)
    assert not tombstones.refuses("s1", "other", 5, known=False)


def refused_at_a_remount() -> tuple[MasterState, FakeClock, SegmentInfo, SegmentInfo, list]:
    """An object on n1 and n2, removed while n1 was away; n1 remounts reporting it and is
    refused. Returns the state, its clock, n1, n2 and n1's report."""
    state, clock, n1, n2 = two_nodes()
    publish(state, "k", 4096, options=PutOptions(replicas=2))
    held = [stored(state, "k", n1.segment_id)]
    declare_dead(state, clock, "n1", [n2])
    assert remove(state, "k") is KeyStatus.OK
    state.outbox.clear()
    assert state.mount_segment(n1, held, remount=True, silent=1.0) == ["k"]
    return state, clock, n1, n2, held


def test_a_refusal_at_a_mount_outlives_a_lost_answer():
    """Found by the chaos slice (CI, 2026-12-04: 23 removed objects listed again): n1's
    mount answer, which told it to drop what the master refused, was lost at the start of
    a partition; the mount had already dropped the segment's tombstones, and n1 was declared
    dead in that partition: its next mount brought the removed objects back."""
    state, clock, n1, n2, held = refused_at_a_remount()
    [forget] = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert (forget.segment_id, [o.key for o in forget.objects]) == (n1.segment_id, ["k"])
    declare_dead(state, clock, "n1", [n2])  # (the answer and the Forget never reached n1)

    assert state.mount_segment(n1, held, remount=True, silent=1.0) == ["k"]
    assert "k" not in state.objects


def test_a_refusal_at_a_mount_stays_in_the_record_until_the_node_forgets():
    state, _, n1, _, held = refused_at_a_remount()
    record = state.durable_record(n1.segment_id)
    assert record is not None and ("k", held[0].generation) in record.exact, "a new leader too"
    successor = new_leader_with({n1.segment_id: record})
    assert successor.mount_segment(n1, held, remount=True, silent=1.0) == ["k"]
    assert "k" not in successor.objects

    [forget] = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    state.durable_changes()
    state.forget_answered(forget.command_id)  # n1 dropped it
    assert state.durable_changes() == {n1.segment_id}
    assert state.durable_record(n1.segment_id) is None
    assert not state._tombstones.refuses(n1.segment_id, "k", held[0].generation, known=False)


# ---- across leaders: what a new leader must be told (written to etcd by the I/O layer)


def new_leader_with(records: dict[str, DurableRecord]) -> MasterState:
    """A new leader's state: empty, with the durable records its predecessor kept."""
    successor, _ = new_state()
    successor.restore_tombstones(records)
    return successor


def test_a_removal_while_a_node_is_away_is_recorded_for_the_next_leader():
    state, clock, n1, n2 = two_nodes()
    publish(state, "gone", 4096, options=PutOptions(replicas=2))
    publish(state, "kept", 4096, options=ON_N1)
    held = [stored(state, key, n1.segment_id) for key in ("gone", "kept")]
    declare_dead(state, clock, "n1", [n2])
    state.durable_changes()
    assert remove(state, "gone") is KeyStatus.OK
    assert state.durable_changes() == {n1.segment_id}
    record = state.durable_record(n1.segment_id)
    assert record == DurableRecord(False, {"gone": held[0].generation})

    successor = new_leader_with({n1.segment_id: record})
    assert successor.mount_segment(n1, held, remount=True, silent=1.0) == ["gone"]
    assert set(successor.objects) == {"kept"}
    assert successor.durable_changes() == {n1.segment_id}, "reconciled: the record changes"
    record = successor.durable_record(n1.segment_id)
    refused = frozenset({("gone", held[0].generation)})  # (that generation only)
    assert record == DurableRecord(False, {}, refused), "until n1 forgets it"
    [forget] = [c for c in successor.outbox if isinstance(c, ForgetCommand)]
    successor.forget_answered(forget.command_id)
    assert successor.durable_changes() == {n1.segment_id}, "reconciled: the record goes"
    assert successor.durable_record(n1.segment_id) is None


def test_a_forget_answered_in_time_is_never_recorded():
    state, _, forget = one_removal()
    assert state.durable_changes() == set(), "sent, and waited for: nothing to write yet"
    state.forget_answered(forget.command_id)
    assert state.durable_changes() == set()


def test_a_forget_answered_late_is_recorded_until_its_answer():
    state, n1, forget = one_removal()
    state.durable_changes()
    state.quarantine(forget)  # the master stopped waiting: the removal is answered
    assert state.durable_changes() == {n1.segment_id}
    assert state.durable_record(n1.segment_id) is not None
    assert "k" in state.durable_record(n1.segment_id).keys

    state.forget_answered(forget.command_id)
    assert state.durable_changes() == {n1.segment_id}
    assert state.durable_record(n1.segment_id) is None


def test_an_unanswered_forget_refuses_its_place_only():
    """A Forget names a place: the node forgets nothing elsewhere, so a copy of the same
    generation at another place on the segment (placed before the Forget went out) is
    adopted at a remount. A copy not placed yet is asked about with ``ANY``: any unanswered
    Forget of its generation there counts (it could land on the place forgotten)."""
    tombstones = Tombstones()
    tombstones.sent(1, "s1", "k", 3, offset=0x1000)
    assert tombstones.refuses("s1", "k", 3, known=True, offset=0x1000)
    assert not tombstones.refuses("s1", "k", 3, known=True, offset=0x2000)
    assert tombstones.refuses("s1", "k", 3, known=True, offset=ANY), "a copy not placed yet"
    assert not tombstones.refuses("s1", "k", 2, known=True, offset=0x1000), "that generation"
    tombstones.answered(1)
    assert not tombstones.refuses("s1", "k", 3, known=True, offset=0x1000)
    assert not tombstones.refuses("s1", "k", 3, known=True, offset=ANY)
    assert len(tombstones) == 0


def test_a_report_in_parts_keeps_unanswered_forgets_in_the_durable_record():
    """Between the parts of a report the segment's unanswered Forgets are held against every
    part; a new leader taking over meanwhile must refuse them too."""
    tombstones = Tombstones()
    tombstones.sent(1, "s1", "k", 3, offset=0x1000)
    tombstones.overdue(1)
    tombstones.mounted("s1", in_parts=True)
    record = tombstones.record("s1")
    assert record is not None and ("k", 3) in record.exact
    assert tombstones.refuses("s1", "k", 3, known=False, offset=0x1000)
    tombstones.report_over("s1")
    assert tombstones.record("s1") is None


def test_forgets_sent_as_one_are_answered_as_one():
    tombstones = Tombstones()
    tombstones.sent(1, "s1", "a", 1)
    tombstones.sent(2, "s1", "b", 2)
    tombstones.merged(2, 1)
    tombstones.overdue(1)
    assert tombstones.record("s1") == DurableRecord(False, {"a": 1, "b": 2})
    tombstones.answered(1)
    assert len(tombstones) == 0
    assert tombstones.record("s1") is None
    assert not tombstones.refuses("s1", "b", 2, known=False)


def test_a_record_past_its_bound_says_distrusted():
    tombstones = Tombstones()
    for i in range(RECORD_LIMIT + 1):
        tombstones.away("s1", f"k{i}", 1)
        tombstones.ended(f"k{i}", 1)
    assert tombstones.record("s1") == DurableRecord(True, {})
    long_keys = Tombstones()  # few keys, but long ones: bounded in bytes too (etcd's limit)
    for i in range(400):
        long_keys.away("s2", f"{i:04d}" + "k" * 1020, 1)
        long_keys.ended(f"{i:04d}" + "k" * 1020, 1)
    assert long_keys.record("s2") == DurableRecord(True, {})
    successor = Tombstones()
    successor.restore("s1", DurableRecord(True, {}))
    assert successor.refuses("s1", "anything", 1, known=False)


def test_the_core_asks_for_the_record_with_the_removals_answer():
    state, clock, n1, n2 = two_nodes()
    core = MasterCore(state)
    publish(state, "gone", 4096, options=PutOptions(replicas=2))
    declare_dead(state, clock, "n1", [n2])
    core.tick()
    effects = core.remove(7, ["gone"], force=False)
    assert effects.durable == {n1.segment_id}, "written before any answer that relies on it"
    assert effects.answers == {}, "the removal waits for n2's Forget"


def test_a_lost_object_written_again_is_not_brought_back_by_the_next_leader():
    """Lost with its node, then put again (a newer generation, elsewhere): the old one has
    ended. A new leader that hears from its node before the newer one's must not adopt it
    (found by the core's model check: the old bytes were served while the newer one's node
    had not remounted yet)."""
    state, clock, n1, n2 = two_nodes()
    publish(state, "k", 4096, options=ON_N1)
    old = stored(state, "k", n1.segment_id)
    declare_dead(state, clock, "n1", [n2])
    state.durable_changes()
    publish(state, "k", 4096)  # (n2: n1 is not mounted)
    assert state.objects["k"].generation > old.generation
    assert state.durable_changes() == {n1.segment_id}
    record = state.durable_record(n1.segment_id)
    assert record is not None and record.keys == {"k": old.generation}

    successor = new_leader_with({n1.segment_id: record})
    assert successor.mount_segment(n1, [old], remount=True, silent=1.0) == ["k"]
    assert "k" not in successor.objects


# ---- nodes a new leader has not heard from


def leader_past_its_window_without_n2(
    records: dict[str, DurableRecord] | None = None,
) -> tuple[MasterCore, FakeClock, SegmentInfo, SegmentInfo, list]:
    """Term 1 publishes "k" on n1 and n2; a new leader expects both, hears from n1 only, and
    takes clients once its rebuild window has passed."""
    state, _, n1, n2 = two_nodes()
    publish(state, "k", 4096, options=PutOptions(replicas=2))
    held = {s.segment_id: [stored(state, "k", s.segment_id)] for s in (n1, n2)}
    successor, clock = new_state()
    successor.restore_tombstones(records or {})
    core = MasterCore(successor, awaited_nodes=["n1", "n2"], rebuild_window=10.0)
    core.mount_segment(1, n1, held[n1.segment_id], True, 0.0)
    assert not core.accepting_clients()
    clock.advance(10.0)
    assert core.accepting_clients(), "the window passed: clients are taken without n2"
    return core, clock, n1, n2, held[n2.segment_id]


def test_a_removal_reaches_a_node_the_new_leader_has_not_heard_from():
    """Found by the core's model check: the object came back when n2 remounted."""
    core, _, _, n2, on_n2 = leader_past_its_window_without_n2()
    assert core.remove(2, ["k"], False).answers.get(2, [KeyStatus.OK]) == [KeyStatus.OK]

    assert core.mount_segment(3, n2, on_n2, True, 0.0).answers[3] == ["k"], "refused"
    assert "k" not in core.state.objects


def test_a_removal_of_a_key_the_new_leader_never_heard_of_reaches_an_unheard_node():
    """Found by the HA audit (2026-12-06): the object lived on n2 only; the new leader,
    past its window without n2, answered its removal NOT_FOUND and adopted it from n2."""
    state, _, n1, n2 = two_nodes()
    publish(
        state,
        "only-n2",
        4096,
        options=PutOptions(replicas=1, preferred_hosts=("n2.cluster.local",)),
    )
    on_n2 = [stored(state, "only-n2", n2.segment_id)]
    successor, clock = new_state(epoch=1)  # (a later term: etcd's revision, larger)
    core = MasterCore(successor, awaited_nodes=["n1", "n2"], rebuild_window=10.0)
    core.mount_segment(1, n1, [], True, 0.0)
    clock.advance(10.0)
    assert core.accepting_clients()

    effects = core.remove(2, ["only-n2"], False)
    assert effects.answers[2] == [KeyStatus.NOT_FOUND]
    assert effects.durable == {"node:n2"}, "written before the removal answers"
    assert core.mount_segment(3, n2, on_n2, True, 0.0).answers[3] == ["only-n2"], "refused"


def test_a_put_after_such_a_removal_is_not_refused_when_its_node_mounts_again():
    """A removal ends the generations issued until then, not later ones (found by review:
    ending every generation refused a later, legitimate put of the key at its node's next
    mount)."""
    state, clock = new_state()
    n1, n2 = segment_info("n1", MiB), segment_info("n2", MiB)
    core = MasterCore(state, awaited_nodes=["n1", "n2"], rebuild_window=10.0)
    core.mount_segment(1, n1, [], True, 0.0)
    clock.advance(10.0)
    assert core.remove(2, ["x"], False).answers[2] == [KeyStatus.NOT_FOUND]  # n2 unheard
    core.mount_segment(3, n2, [], False, 0.0)
    publish(state, "x", 4096, options=PutOptions(replicas=1, preferred_hosts=("n2.cluster.local",)))
    held = [stored(state, "x", n2.segment_id)]
    declare_dead(state, clock, "n2", [n1])  # (before the heartbeat that reconciles n2)

    assert core.mount_segment(4, n2, held, True, 0.0).answers[4] == []
    assert "x" in state.objects


def test_a_prefix_removal_while_a_node_is_unheard_distrusts_what_it_holds():
    """No one here can list what an unheard node holds: its mount then adopts only objects
    the master holds (a cached object lost, no removed one back)."""
    core, _, _, n2, on_n2 = leader_past_its_window_without_n2()
    effects = core.remove_prefix(2, "", True)
    assert "node:n2" in effects.durable
    record = core.state.durable_record("node:n2")
    assert record is not None and record.distrusted

    assert core.mount_segment(3, n2, on_n2, True, 0.0).answers[3] == ["k"]
    assert "k" not in core.state.objects


def test_what_a_tick_ends_after_the_window_passed_stays_out_of_an_unheard_node():
    """Found by the core's model check (secure variant, 2026-12-04): the window passed with
    no client call to close it, and the next tick evicted an object held on n1 and on n2,
    which had not remounted: the node entry did not exist yet, so n2's report brought the
    evicted object back, and a later removal of it did not wait for n1's unanswered Forget
    (a further failover would have adopted the removed object from n1)."""
    state, _ = new_state()
    n1, n2 = segment_info("n1", 4096), segment_info("n2", 4096)
    state.mount_segment(n1)
    state.mount_segment(n2)
    publish(state, "k", 4000, options=PutOptions(replicas=2))  # past the high watermark
    held = {s.segment_id: [stored(state, "k", s.segment_id)] for s in (n1, n2)}
    successor, clock = new_state()
    core = MasterCore(successor, awaited_nodes=["n1", "n2"], rebuild_window=4.0)
    core.mount_segment(1, n1, held[n1.segment_id], True, 0.0)
    for call_id in range(2, 5):  # past the window, and the lease of what was adopted
        clock.advance(4.0)
        core.heartbeat(call_id, "n1", [n1.segment_id])
    core.tick()  # (no client came meanwhile)
    assert "k" not in successor.objects, "evicted: its segment is past the high watermark"

    assert core.mount_segment(5, n2, held[n2.segment_id], True, 0.0).answers[5] == ["k"]
    assert "k" not in successor.objects, "an evicted object came back with a node unheard"


def test_what_ended_while_a_node_was_unheard_outlives_the_next_failover():
    core, _, _, n2, on_n2 = leader_past_its_window_without_n2()
    effects = core.remove(2, ["k"], False)
    assert effects.durable == {"node:n2"}, "written before the removal answers"
    record = core.state.durable_record("node:n2")
    assert record is not None and "k" in record.keys

    later, _, _, _, _ = leader_past_its_window_without_n2({"node:n2": record})
    assert later.mount_segment(3, n2, on_n2, True, 0.0).answers[3] == ["k"]


def test_a_node_that_mounted_everything_is_reconciled_at_its_heartbeat():
    core, _, _, n2, on_n2 = leader_past_its_window_without_n2()
    core.remove(2, ["k"], False)
    core.mount_segment(3, n2, on_n2, True, 0.0)
    assert core.heartbeat(4, "n2", [n2.segment_id]).durable == {"node:n2"}
    assert core.state.durable_record("node:n2") is None, "reconciled: the record goes"
    core.state.validate()


def test_a_segment_may_not_take_the_name_of_a_node_entry():
    state, _ = new_state()
    problem = state.mount_problem(segment_info("n1", MiB, "node:n2"))
    assert problem is not None and "reserved" in problem


def test_a_segment_away_for_the_records_age_loses_its_tombstones():
    """A node away that long has been replaced (a DRAM segment's id never comes back at
    all): what is kept of its segment goes, here as in the durable record, which a new leader
    would drop at that age anyway. The master's memory no longer grows with every node
    restart until the tombstones' bound."""
    state, clock, n1, n2 = two_nodes()
    publish(state, "gone", 4096, options=PutOptions(replicas=2))
    publish(state, "lost", 4096, options=ON_N1)
    gone, lost = (stored(state, key, n1.segment_id) for key in ("gone", "lost"))
    declare_dead(state, clock, "n1", [n2])
    assert remove(state, "gone") is KeyStatus.OK
    state.durable_changes()
    tombstones = state._tombstones

    def kept() -> tuple[bool, bool]:
        return (
            tombstones.refuses(n1.segment_id, "gone", gone.generation, known=False),
            tombstones.went_away(n1.segment_id, "lost", lost.generation),
        )

    assert kept() == (True, True)
    clock.advance(MAX_AGE - 2)  # (after the drop, at the tick that declared n1 dead)
    state.heartbeat("n2", [n2.segment_id])
    state.tick()
    assert kept() == (True, True), "not yet"
    clock.advance(2)
    state.heartbeat("n2", [n2.segment_id])
    state.tick()
    assert kept() == (False, False)
    assert state.durable_changes() == {n1.segment_id}
    assert state.durable_record(n1.segment_id) is None, "its durable record goes too"


def test_a_segment_that_comes_back_in_time_keeps_its_refusals_until_it_mounts():
    state, clock, n1, n2 = two_nodes()
    publish(state, "gone", 4096, options=PutOptions(replicas=2))
    held = stored(state, "gone", n1.segment_id)
    declare_dead(state, clock, "n1", [n2])
    assert remove(state, "gone") is KeyStatus.OK
    clock.advance(MAX_AGE / 2)
    state.heartbeat("n2", [n2.segment_id])
    state.tick()

    assert state.mount_segment(n1, [held], remount=True, silent=1.0) == ["gone"]
    assert "gone" not in state.objects


def test_an_object_lost_with_its_segment_comes_back_in_any_part_of_its_report():
    """A write the master stopped waiting for while its node was away is a late write at the
    remount, and one of an object that ended stays out; but an object only lost with this
    very segment has not ended: whichever part of the report brings it, it is adopted, as a
    report in one part adopts it."""
    state, clock, n1, n2 = two_nodes()
    publish(state, "other", 4096, options=ON_N1)
    other = stored(state, "other", n1.segment_id)
    slot = put(state, "lost", 4096, options=ON_N1)
    assert state.put_end([Commit("lost", slot.put_id, (True,), None)]) == [None]
    [replica] = slot.replicas
    lost = StoredObject("lost", replica.address - n1.base_address, 4096, slot.put_id, 0)
    state.outbox.clear()  # (the node, paused, never answers its Persist)
    declare_dead(state, clock, "n1", [n2])
    assert "lost" not in state.objects

    assert state.mount_segment(n1, [other], remount=True, silent=1.0, more=True) == []
    assert state.report_more(n1, [lost], more=False) == []
    assert state.objects["lost"].generation == slot.put_id
