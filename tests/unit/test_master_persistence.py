"""Specification of the master's rules for durable objects (``master/state.py``): two-phase
commit (publish only once every node recorded the object), re-adoption of what nodes report
when they mount a segment, storage tiers, demotion to NVMe and promotion back to DRAM.

Each test is one rule, spelled against ``MasterState`` with a fake clock. Commands for storage
nodes pile up in ``state.outbox`` until a test takes them (``sent``) and answers them
(``state.command_done``), the way the gRPC service relays them to the nodes and their answers
back; commits that waited for their nodes come out in ``state.resolved``.

The production defaults (``MasterConfig()``) are the vocabulary: a lease of 10 s, a high
watermark of 90 % with 5 % evicted (or demoted) below it, a node TTL of 5 s.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from state_helpers import (
    CONFIG,
    FakeClock,
    KiB,
    MiB,
    answer_nodes,
    commit,
    exists,
    get,
    mount,
    new_state,
    nodes_of,
    publish,
    put,
    remove,
    rounded,
    segment_info,
    segments_of,
    used,
)
from state_helpers import stored as stored_at

from kvpool.common.status import KeyStatus, Pin, Tier
from kvpool.master.config import MasterConfig
from kvpool.master.records import (
    Commit,
    CommitResult,
    CopyCommand,
    ForgetCommand,
    PersistCommand,
    PrepareCommand,
    PutOptions,
    SegmentInfo,
    StoredObject,
    TickReport,
)
from kvpool.master.state import DEMOTION_PAUSE, MasterState

OK = KeyStatus.OK
DRAM = PutOptions(tier=Tier.DRAM)
NVME = PutOptions(tier=Tier.NVME)

# ------------------------------------------------------------------ helpers


def mount_tier(
    state: MasterState,
    node: str,
    size: int,
    tier: Tier = Tier.DRAM,
    *,
    segment: str | None = None,
    base: int = 0x10_0000,
    stored: list[StoredObject] | None = None,
) -> SegmentInfo:
    """Mounts a segment of ``tier`` (NVMe segments are persistent) with what the node holds."""
    name = segment or f"{node}/{tier.name.lower()}0"
    info = replace(
        segment_info(node, size, name, base=base), tier=tier, persistent=tier is Tier.NVME
    )
    assert state.mount_segment(info, stored or []) == [], "everything reported was adopted"
    return info


def sent(state: MasterState) -> list:
    """Takes every command the master has for its nodes (as the service would send them),
    but for the Prepare commands of new reservations on NVMe, which no rule here is about."""
    commands = [c for c in state.outbox if not isinstance(c, PrepareCommand)]
    state.outbox.clear()
    return commands


def only(commands: list, kind: type) -> list:
    return [c for c in commands if isinstance(c, kind)]


def settled(state: MasterState) -> list[CommitResult]:
    results = list(state.resolved)
    state.resolved.clear()
    return results


def host(node: str) -> str:
    return f"{node}.cluster.local"  # what state_helpers.segment_info says


def pass_time(state: MasterState, clock: FakeClock, seconds: float, *silent: str) -> TickReport:
    """``seconds`` pass; every mounted node but the ``silent`` heartbeats; the master ticks."""
    clock.advance(seconds)
    for node_id, node in list(state.nodes.items()):
        if node_id not in silent:
            state.heartbeat(node_id, sorted(node.segment_ids))
    return state.tick()


def offset_of(location_or_slot, index: int = 0) -> int:
    replica = location_or_slot.replicas[index]
    return replica.address - replica.segment.base_address


def tiers_of(location) -> list[Tier]:
    return [replica.segment.tier for replica in location.replicas]


def start_commit(state: MasterState, key: str, size: int = 4 * KiB, replicas: int = 1):
    """A put whose writer committed every replica: the object waits for its nodes."""
    slot = put(state, key, size, replicas)
    assert slot.status is OK, slot.message
    assert state.put_end([Commit(key, slot.put_id, (True,) * len(slot.replicas))]) == [None]
    return slot, sent(state)


def committed_on_a_and_b(key: str = "k"):
    """Nodes a and b mounted, and a put of two replicas whose writer committed both: the
    object waits for the Persists sent to a and b (by node)."""
    state, clock = new_state()
    mount(state, "a")
    mount(state, "b")
    slot, persists = start_commit(state, key, 4 * KiB, replicas=2)
    return state, clock, slot, {p.node_id: p for p in persists}


def published(state: MasterState) -> set[str]:
    return set(state.list_keys(limit=100_000).keys)


# ------------------------------------------------------------------ two-phase commit


def test_put_end_sends_each_node_a_persist_and_publishes_only_once_every_node_answered():
    state, _ = new_state()
    mount(state, "a")
    mount(state, "b")
    slot = put(state, "k", 4 * KiB, replicas=2)

    assert state.put_end([Commit("k", slot.put_id, (True, True), crc32c=7)]) == [None]

    persists = sent(state)
    assert sorted(p.node_id for p in only(persists, PersistCommand)) == ["a", "b"]
    assert len(persists) == 2
    for command in persists:
        [stored] = command.objects
        [replica] = [r for r in slot.replicas if r.segment.segment_id == command.segment_id]
        offset = replica.address - replica.segment.base_address
        assert stored == StoredObject("k", offset, 4 * KiB, slot.put_id, 7, replicas=2)
        assert state.awaiting(command.command_id)
    assert state.stat("k").state == "committed"
    assert get(state, "k").status is KeyStatus.NOT_READY
    assert exists(state, "k") is KeyStatus.NOT_READY

    state.command_done(persists[0].command_id, True)
    assert not state.awaiting(persists[0].command_id)
    assert settled(state) == []
    assert get(state, "k").status is KeyStatus.NOT_READY, "one node has not recorded it yet"

    state.command_done(persists[1].command_id, True)
    assert settled(state) == [CommitResult("k", slot.put_id, OK)]
    location = get(state, "k")
    assert location.status is OK and sorted(nodes_of(location)) == ["a", "b"]
    assert location.crc32c == 7
    assert state.counters.puts_published == 1


def test_the_commits_of_a_batch_go_to_each_segment_in_one_persist():
    state, _ = new_state()
    mount(state, "a")
    slots = state.put_start("c1", ["k1", "k2", "k3"], [1 * KiB, 2 * KiB, 3 * KiB])

    statuses = state.put_end([Commit(f"k{i + 1}", s.put_id, (True,)) for i, s in enumerate(slots)])

    assert statuses == [None, None, None]
    [persist] = sent(state)
    assert isinstance(persist, PersistCommand) and persist.segment_id == "a/dram0"
    assert [(o.key, o.size) for o in persist.objects] == [("k1", 1024), ("k2", 2048), ("k3", 3072)]
    state.command_done(persist.command_id, True)
    assert sorted(r.key for r in settled(state)) == ["k1", "k2", "k3"]
    assert published(state) == {"k1", "k2", "k3"}


def test_put_end_answers_at_once_what_needs_no_node():
    state, _ = new_state()
    mount(state, "a")
    written, failed = state.put_start("c1", ["written", "failed"], [1 * KiB, 1 * KiB])

    statuses = state.put_end(
        [
            Commit("written", written.put_id, (True,)),
            Commit("failed", failed.put_id, (False,)),  # the writer completed no replica
            Commit("never-put", 99, (True,)),
        ]
    )

    assert statuses == [None, KeyStatus.NO_REPLICA, KeyStatus.STALE_PUT]
    assert [len(p.objects) for p in only(sent(state), PersistCommand)] == [1]
    assert exists(state, "failed") is KeyStatus.NOT_FOUND


def test_a_node_failing_its_persist_drops_that_replica_and_the_object_is_published_with_the_rest():
    state, _, slot, persists = committed_on_a_and_b()

    state.command_done(persists["b"].command_id, False)  # b could not record it

    assert used(state, "b/dram0") == 0, "the failed replica's space returns at once"
    assert settled(state) == []
    state.command_done(persists["a"].command_id, True)
    assert settled(state) == [CommitResult("k", slot.put_id, OK)]
    assert nodes_of(get(state, "k")) == ["a"]


def test_a_persist_the_master_gave_up_waiting_for_is_dropped_and_its_node_told_to_forget_it():
    state, _, slot, persists = committed_on_a_and_b()

    state.command_expired(persists["b"].command_id)  # b may record it late: that entry must go

    [forget] = only(sent(state), ForgetCommand)
    assert (forget.node_id, forget.objects) == ("b", persists["b"].objects)
    assert used(state, "b/dram0") == 0, "a record writes no object bytes: the space returns"
    state.command_done(persists["a"].command_id, True)
    assert settled(state) == [CommitResult("k", slot.put_id, OK)]
    assert nodes_of(get(state, "k")) == ["a"]


def test_when_every_node_fails_its_persist_the_commit_is_no_replica_and_the_space_free():
    state, _, slot, persists = committed_on_a_and_b()

    full = "OSError: [Errno 28] No space left on device"
    state.command_done(persists["a"].command_id, False, error=full)
    state.command_done(persists["b"].command_id, False, error="x" * 10_000)

    [result] = settled(state)
    assert result[:3] == ("k", slot.put_id, KeyStatus.NO_REPLICA)
    # the writer hears why, from each node (a node's words bounded)
    assert result.message.startswith(f"storage node 'a' could not record it: {full}; ")
    assert "storage node 'b' could not record it: xxx" in result.message
    assert len(result.message) <= 400
    assert exists(state, "k") is KeyStatus.NOT_FOUND
    assert used(state, "a/dram0") == used(state, "b/dram0") == 0
    assert put(state, "k").status is OK, "the key is free again"


def test_why_a_node_failed_is_kept_only_while_its_commit_waits():
    state, _, _, persists = committed_on_a_and_b()
    state.command_done(persists["a"].command_id, False, error="disk \x1b[31mfull\n")
    assert remove(state, "k", force=True) is OK  # the commit ends another way

    assert [r.status for r in settled(state)] == [KeyStatus.STALE_PUT]
    assert state._persist_errors == {}, "nothing kept for an answer given"

    # a node dying with the last replica: the writer hears what the other node said
    state, clock, _, persists = committed_on_a_and_b()
    state.command_done(persists["a"].command_id, False, error="disk \x1b[31mfull\n")
    pass_time(state, clock, CONFIG.node_ttl + 1, "b")
    [result] = settled(state)
    assert result.status is KeyStatus.NO_REPLICA
    assert result.message == "storage node 'a' could not record it: disk ?[31mfull?"
    assert state._persist_errors == {}


def test_a_retried_put_end_of_a_committed_object_waits_again_and_resends_the_persist():
    state, _ = new_state()
    mount(state, "a")
    slot, [first] = start_commit(state, "k")

    assert state.put_end([Commit("k", slot.put_id, (True,))]) == [None]

    [again] = sent(state)
    assert again.objects == first.objects and again.command_id != first.command_id
    state.command_done(again.command_id, True)
    assert settled(state) == [CommitResult("k", slot.put_id, OK)]
    state.command_done(first.command_id, True)  # the first answer, late: nothing more happens
    assert settled(state) == []
    assert state.put_end([Commit("k", slot.put_id, (True,))]) == [OK]


def test_without_a_writer_checksum_the_object_takes_the_one_its_node_computed():
    state, _ = new_state()
    mount(state, "a")
    _, [persist] = start_commit(state, "k")
    assert persist.objects[0].crc32c is None

    state.command_done(persist.command_id, True, [0xC0FFEE])

    assert get(state, "k").crc32c == 0xC0FFEE


def test_a_node_dying_while_an_object_is_committed_publishes_it_with_the_other_replicas():
    state, clock, slot, persists = committed_on_a_and_b()
    state.command_done(persists["a"].command_id, True)

    report = pass_time(state, clock, CONFIG.node_ttl + 1, "b")  # b dies before answering

    assert report.dead_nodes == ["b"] and report.objects_lost == 0
    assert settled(state) == [CommitResult("k", slot.put_id, OK)]
    assert nodes_of(get(state, "k")) == ["a"]


def test_a_commit_whose_nodes_all_die_in_one_tick_is_no_replica_whoever_answered_first():
    # (each dead node was dropped in turn: the first publishing the object on the other's
    # replica, which the second then took away; its writer had been told OK for nothing)
    state, clock, slot, persists = committed_on_a_and_b()
    state.command_done(persists["b"].command_id, True)  # b recorded it, a (dropped first) has not

    report = pass_time(state, clock, CONFIG.node_ttl + 1, "a", "b")

    assert sorted(report.dead_nodes) == ["a", "b"] and report.objects_lost == 1
    assert settled(state) == [CommitResult("k", slot.put_id, KeyStatus.NO_REPLICA)]
    assert exists(state, "k") is KeyStatus.NOT_FOUND


def test_a_node_dying_while_it_holds_the_only_replica_of_a_committed_object_is_no_replica():
    state, clock = new_state()
    mount(state, "a")
    mount(state, "b", 64 * KiB)
    slot, [persist] = start_commit(state, "k", 128 * KiB)  # only a can hold it

    report = pass_time(state, clock, CONFIG.node_ttl + 1, "a")

    assert report.objects_lost == 1
    assert settled(state) == [CommitResult("k", slot.put_id, KeyStatus.NO_REPLICA)]
    assert exists(state, "k") is KeyStatus.NOT_FOUND
    state.command_done(persist.command_id, True)  # a's late answer changes nothing
    assert settled(state) == [] and exists(state, "k") is KeyStatus.NOT_FOUND


def test_a_node_dying_before_the_others_answered_leaves_the_object_waiting_for_them():
    state, clock, slot, persists = committed_on_a_and_b()

    pass_time(state, clock, CONFIG.node_ttl + 1, "b")

    assert settled(state) == [] and state.stat("k").state == "committed"
    state.command_done(persists["a"].command_id, True)
    assert settled(state) == [CommitResult("k", slot.put_id, OK)]
    assert nodes_of(get(state, "k")) == ["a"]


def test_a_committed_object_is_removed_only_by_force_which_resolves_it_stale_and_sends_forgets():
    state, _, slot, by_node = committed_on_a_and_b()
    persists = list(by_node.values())

    assert remove(state, "k") is KeyStatus.NOT_READY
    assert remove(state, "k", force=True) is OK

    assert settled(state) == [CommitResult("k", slot.put_id, KeyStatus.STALE_PUT)]
    forgets = sent(state)
    assert all(isinstance(f, ForgetCommand) for f in forgets)
    assert sorted((f.node_id, f.objects) for f in forgets) == sorted(
        (p.node_id, p.objects) for p in persists
    ), "each node may have recorded it: each is told to forget it"
    assert used(state, "a/dram0") == used(state, "b/dram0") == 0
    for command in persists:  # the nodes' answers come late: they change nothing
        state.command_done(command.command_id, True)
    assert settled(state) == [] and exists(state, "k") is KeyStatus.NOT_FOUND


@pytest.mark.parametrize("ok", [True, False])
def test_a_late_persist_answer_for_a_force_removed_object_never_touches_the_new_owner_of_its_space(
    ok,
):
    state, _ = new_state()
    mount(state, "a")
    old, [persist] = start_commit(state, "k")
    assert remove(state, "k", force=True) is OK
    sent(state)
    new = put(state, "other")
    assert offset_of(new) == offset_of(old), "the space was free: the next put gets it"

    state.command_done(persist.command_id, ok)  # the node answers the removed object, late

    assert used(state, "a/dram0") == rounded(4 * KiB), "the new reservation keeps its buffer"
    assert state.segments["a/dram0"].owners == {offset_of(new): "other"}
    assert commit(state, "other", new) is OK


def test_the_commit_of_a_put_removed_by_prefix_while_committed_is_stale():
    state, _ = new_state()
    mount(state, "a")
    slot, _ = start_commit(state, "p/k")

    result = state.remove_prefix("p/", force=True)

    assert result.removed == 1
    assert settled(state) == [CommitResult("p/k", slot.put_id, KeyStatus.STALE_PUT)]


# ------------------------------------------------------------------ re-adoption


def stored(key: str, offset: int, size: int = 4 * KiB, generation: int = 1, crc32c=None):
    return StoredObject(key, offset, size, generation, crc32c)


def test_a_fresh_master_adopts_every_object_a_node_reports_at_its_exact_offset():
    state, _ = new_state()
    objects = [
        stored("k0", 0, 100, 5, 11),
        stored("k1", 4 * KiB, 4 * KiB, 9),
        stored("k2", 64 * KiB),
    ]

    info = mount_tier(state, "n1", 1 * MiB, Tier.NVME, stored=objects)

    for item in objects:
        location = get(state, item.key)
        assert location.status is OK
        assert location.size == item.size and location.crc32c == item.crc32c
        assert segments_of(location) == [info.segment_id]
        assert offset_of(location) == item.offset
    assert state.counters.objects_adopted == 3
    assert used(state, info.segment_id) == rounded(100) + 4 * KiB + 4 * KiB
    assert published(state) == {"k0", "k1", "k2"}


def test_adopted_objects_are_leased_for_one_lease_ttl_so_that_reads_begun_before_finish():
    state, clock = new_state()
    mount_tier(state, "n1", 1 * MiB, Tier.NVME, stored=[stored("k", 0)])

    assert state.stat("k").lease_remaining == CONFIG.lease_ttl
    assert remove(state, "k") is KeyStatus.HAS_LEASE
    clock.advance(CONFIG.lease_ttl)
    assert remove(state, "k") is OK


def test_an_overlapping_older_generation_is_dropped_and_the_node_told_to_forget_it():
    state, _ = new_state()
    info = replace(segment_info("n1", 1 * MiB, "n1/nvme0"), tier=Tier.NVME, persistent=True)
    older = stored("old", 0, 8 * KiB, generation=3)
    newer = stored("new", 4 * KiB, 4 * KiB, generation=4)  # written over old's second half

    assert state.mount_segment(info, [older, newer]) == ["old"]

    assert exists(state, "old") is KeyStatus.NOT_FOUND
    assert offset_of(get(state, "new")) == 4 * KiB
    assert state.counters.objects_adopted == 1


def test_an_older_generation_of_a_published_key_is_dropped():
    state, _ = new_state()
    mount_tier(state, "a", 1 * MiB, Tier.NVME, stored=[stored("k", 0, generation=7)])
    b = replace(segment_info("b", 1 * MiB, "b/nvme0"), tier=Tier.NVME, persistent=True)

    assert state.mount_segment(b, [stored("k", 0, generation=6)]) == ["k"]

    assert nodes_of(get(state, "k")) == ["a"]
    assert used(state, "b/nvme0") == 0


def test_the_same_generation_on_another_node_is_adopted_as_a_second_replica():
    state, _ = new_state()
    mount_tier(state, "a", 1 * MiB, Tier.NVME, stored=[stored("k", 0, generation=7)])
    mount_tier(state, "b", 1 * MiB, Tier.NVME, stored=[stored("k", 8 * KiB, generation=7)])

    location = get(state, "k")
    assert sorted(nodes_of(location)) == ["a", "b"]
    assert state.counters.objects_adopted == 2


def test_a_newer_generation_supersedes_the_adopted_object_whose_nodes_are_told_to_forget_it():
    # (both written by an earlier master: a report of this master's own term never
    # supersedes, tests/unit/test_master_adoption_trust.py)
    state, clock = new_state(epoch=1)
    mount_tier(state, "a", 1 * MiB, Tier.NVME, stored=[stored("k", 0, generation=3)])
    clock.advance(1)

    mount_tier(state, "b", 1 * MiB, Tier.NVME, stored=[stored("k", 0, generation=5)])

    assert nodes_of(get(state, "k")) == ["b"]
    [forget] = sent(state)
    assert isinstance(forget, ForgetCommand) and forget.node_id == "a"
    assert forget.objects == (stored("k", 0, generation=3)._replace(replicas=1),)
    assert used(state, "a/nvme0") == 4 * KiB, "the superseded object's lease still guards it"
    pass_time(state, clock, CONFIG.lease_ttl)
    assert used(state, "a/nvme0") == 0


def test_a_newer_generation_of_another_size_supersedes_the_adopted_object_too():
    state, _ = new_state(epoch=1)
    mount_tier(state, "a", 1 * MiB, Tier.NVME, stored=[stored("k", 0, 1 * KiB, generation=3)])

    mount_tier(state, "b", 1 * MiB, Tier.NVME, stored=[stored("k", 0, 2 * KiB, generation=5)])

    location = get(state, "k")
    assert (nodes_of(location), location.size) == (["b"], 2 * KiB), "the newest write wins"


def test_a_twin_of_another_size_under_the_same_generation_is_dropped():
    state, _ = new_state()
    mount_tier(state, "a", 1 * MiB, Tier.NVME, stored=[stored("k", 0, 1 * KiB, generation=3)])
    b = replace(segment_info("b", 1 * MiB, "b/nvme0"), tier=Tier.NVME, persistent=True)

    assert state.mount_segment(b, [stored("k", 0, 2 * KiB, generation=3)]) == ["k"]
    assert nodes_of(get(state, "k")) == ["a"]


@pytest.mark.parametrize("committed", [False, True])
def test_a_key_being_written_wins_over_a_reported_copy(committed):
    state, _ = new_state()
    mount(state, "a")
    slot = put(state, "k")
    if committed:
        assert state.put_end([Commit("k", slot.put_id, (True,))]) == [None]
    b = replace(segment_info("b", 1 * MiB, "b/nvme0"), tier=Tier.NVME, persistent=True)

    assert state.mount_segment(b, [stored("k", 0, generation=slot.put_id + 100)]) == ["k"]

    assert state.stat("k").state == ("committed" if committed else "reserved")
    assert used(state, "b/nvme0") == 0
    answer_nodes(state)
    assert commit(state, "k", slot) is OK
    assert nodes_of(get(state, "k")) == ["a"]


@pytest.mark.parametrize(
    "item",
    [
        stored("misaligned", 100),
        stored("past-the-end", 1 * MiB - 2 * KiB),
        stored("negative", -64),
    ],
)
def test_an_object_that_does_not_lie_inside_the_segment_on_an_aligned_offset_is_dropped(item):
    state, _ = new_state()
    info = replace(segment_info("n1", 1 * MiB, "n1/nvme0"), tier=Tier.NVME, persistent=True)

    assert state.mount_segment(info, [item]) == [item.key]
    assert used(state, "n1/nvme0") == 0


def test_a_later_put_gets_a_larger_generation_than_any_adopted_object():
    state, _ = new_state()
    adopted = (3 << 32) + 41  # written under master epoch 3
    mount_tier(state, "n1", 1 * MiB, Tier.NVME, stored=[stored("old", 0, generation=adopted)])

    slot = put(state, "new")

    assert slot.put_id > adopted


def test_a_new_masters_epoch_orders_its_writes_after_every_earlier_masters():
    clock = FakeClock()
    before = MasterState(CONFIG, clock=clock, epoch=1)
    mount(before, "n1")
    old = publish(before, "k")

    after = MasterState(CONFIG, clock=clock, epoch=2)
    mount(after, "n1")
    new = put(after, "k")

    assert new.put_id > old.put_id
    assert new.put_id >> 32 == 2


def test_a_fresh_master_rebuilds_its_index_from_what_the_nodes_recorded():
    state, clock = new_state()
    mount_tier(state, "n1", 1 * MiB, Tier.NVME)
    mount_tier(state, "n2", 1 * MiB, Tier.NVME)
    slot = put(state, "k", 4 * KiB, replicas=2)
    assert state.put_end([Commit("k", slot.put_id, (True, True), 5)]) == [None]
    recorded: dict[str, list[StoredObject]] = {}
    for command in sent(state):  # the nodes record what they are told, then answer
        recorded[command.segment_id] = list(command.objects)
        state.command_done(command.command_id, True)

    fresh = MasterState(CONFIG, clock=clock, epoch=1)
    for node in ("n1", "n2"):
        mount_tier(fresh, node, 1 * MiB, Tier.NVME, stored=recorded[f"{node}/nvme0"])

    location = get(fresh, "k")
    original = get(state, "k")
    assert (location.size, location.crc32c) == (original.size, original.crc32c)
    assert set(location.replicas) == set(original.replicas)
    assert put(fresh, "k2").put_id > slot.put_id


def test_a_node_that_restarts_after_being_declared_dead_gets_its_objects_back():
    state, clock = new_state()
    info = mount_tier(state, "n1", 1 * MiB, Tier.NVME)
    _, [persist] = start_commit(state, "k")
    state.command_done(persist.command_id, True)
    before = get(state, "k")
    pass_time(state, clock, CONFIG.lease_ttl + CONFIG.node_ttl, "n1")
    assert exists(state, "k") is KeyStatus.NOT_FOUND

    assert state.mount_segment(info, list(persist.objects)) == []

    assert get(state, "k") == before
    assert state.counters.objects_adopted == 1


def test_a_node_that_restarts_before_being_declared_dead_replaces_its_segment_and_keeps_objects():
    state, _ = new_state()
    info = mount_tier(state, "n1", 1 * MiB, Tier.NVME)
    _, [persist] = start_commit(state, "k")
    state.command_done(persist.command_id, True)
    reserved = put(state, "r")  # lost with the old segment: the node forgot it

    restarted = replace(info, base_address=0x20_0000, worker_address=b"new-worker")
    assert state.mount_segment(restarted, list(persist.objects)) == []

    location = get(state, "k")
    assert location.replicas[0].segment == restarted
    assert offset_of(location) == persist.objects[0].offset
    assert exists(state, "r") is KeyStatus.NOT_FOUND
    assert commit(state, "r", reserved) is KeyStatus.STALE_PUT


@pytest.mark.parametrize("listed", ["newest first", "oldest first"])
def test_objects_taken_back_are_evicted_oldest_first_and_before_anything_put_since(listed):
    """A new master, or a restarted node's, takes back what a node reports as the least
    recently used objects, the oldest first in line: taken back as the most recently used
    (in the newest-first order reports are adopted in), the oldest would have been evicted
    last and the newest first, a KV cache's hottest prefixes."""
    state, clock = new_state()
    reported = [StoredObject(f"o{i:02d}", i * 4 * KiB, 4 * KiB, i + 1) for i in range(20)]
    if listed == "newest first":
        reported.reverse()
    mount_tier(state, "n1", 24 * 4 * KiB, Tier.NVME, stored=reported)
    clock.advance(CONFIG.lease_ttl + 1)  # (past the hold of reads begun before the takeover)
    assert get(state, "o05").status is OK  # read since: as recent as a read makes it
    clock.advance(CONFIG.lease_ttl + 1)

    for i in range(6):
        publish(state, f"new{i}", 4 * KiB, options=NVME)

    oldest_first = [f"o{i:02d}" for i in range(20) if i != 5] + ["o05"]
    gone = set(oldest_first) - published(state)
    assert gone and gone == set(oldest_first[: len(gone)]), sorted(gone)
    assert {f"new{i}" for i in range(6)} <= published(state)


def test_a_new_masters_second_replicas_are_evicted_oldest_first_on_their_segment_too():
    """After a failover each node reports its replicas; the second node's are replicas of
    objects the first one's report brought back, read by no one since: they go in front of
    that segment's eviction order, the oldest first, as the first node's did."""
    state, _ = new_state()
    reported = {
        node: [StoredObject(f"o{i:02d}", i * 4 * KiB, 4 * KiB, i + 1, replicas=2) for i in range(6)]
        for node in ("n1", "n2")
    }
    for node, base in (("n1", 0x10_0000), ("n2", 0x90_0000)):
        mount_tier(state, node, 1 * MiB, Tier.NVME, base=base, stored=reported[node])

    for segment in ("n1/nvme0", "n2/nvme0"):
        order = list(state.segments[segment].lru.candidates())
        assert order == [f"o{i:02d}" for i in range(6)], (segment, order)


@pytest.mark.parametrize("parts", [1, 2])
def test_a_restarted_nodes_replicas_of_known_objects_keep_their_eviction_order(parts):
    """The node of one replica restarts and reports it again (the object lives on at the
    other): it rejoins its segment's eviction order as the object was last used, not in
    the report's newest-first order, which made the segment evict its newest first. A report
    in parts (newest first, as nodes send them) is ordered as a whole."""
    state, clock = new_state()
    n1 = mount_tier(state, "n1", 1 * MiB, Tier.NVME)
    mount_tier(state, "n2", 1 * MiB, Tier.NVME, base=0x90_0000)
    keys = [f"o{i:02d}" for i in range(6)]
    for key in keys:
        clock.advance(1)
        publish(state, key, 4 * KiB, options=PutOptions(tier=Tier.NVME, replicas=2))
    clock.advance(1)
    assert get(state, "o01").status is OK  # read since: the most recent now
    report = [stored_at(state, key, n1.segment_id) for key in reversed(keys)]
    clock.advance(1)
    restarted = replace(n1, incarnation="after a restart")
    size = len(report) // parts
    state.mount_segment(restarted, report[:size], remount=True, more=parts > 1)
    if parts > 1:
        assert state.report_more(restarted, report[size:], more=False) == []

    order = list(state.segments[n1.segment_id].lru.candidates())
    assert order == ["o00", "o02", "o03", "o04", "o05", "o01"], order


# ------------------------------------------------------------------ tiers


def two_tier_node(state: MasterState, node: str = "n1", dram: int = 100 * KiB, nvme: int = 1 * MiB):
    mount_tier(state, node, dram, Tier.DRAM)
    mount_tier(state, node, nvme, Tier.NVME)


@pytest.mark.parametrize(
    ("tier", "where"),
    [(Tier.DRAM, Tier.DRAM), (Tier.NVME, Tier.NVME), (Tier.UNSPECIFIED, Tier.DRAM)],
)
def test_a_put_goes_to_the_tier_it_asks_for_and_dram_first_when_it_does_not_say(tier, where):
    state, _ = new_state()
    two_tier_node(state)

    slot = put(state, "k", options=PutOptions(tier=tier))

    assert slot.status is OK and tiers_of(slot) == [where]


def test_a_put_that_does_not_say_goes_to_nvme_rather_than_evicting_from_dram():
    state, _ = new_state()
    two_tier_node(state)
    for i in range(25):
        publish(state, f"d{i:02d}", 4 * KiB, options=DRAM)  # DRAM full, everything evictable

    slot = put(state, "k", 4 * KiB)

    assert tiers_of(slot) == [Tier.NVME]
    assert state.counters.evictions == 0


def test_a_put_that_does_not_say_evicts_from_dram_when_no_tier_has_room():
    state, _ = new_state()
    mount_tier(state, "n1", 100 * KiB, Tier.DRAM)
    mount_tier(state, "n1", 8 * KiB, Tier.NVME)
    for i in range(25):
        publish(state, f"d{i:02d}", 4 * KiB, options=DRAM)
    for i in range(2):
        publish(state, f"v{i}", 4 * KiB, options=NVME)

    slot = put(state, "k", 4 * KiB)

    assert tiers_of(slot) == [Tier.DRAM]
    assert exists(state, "d00") is KeyStatus.NOT_FOUND, "the least recently used went"
    assert published(state) >= {"v0", "v1"}


def test_a_put_for_one_tier_evicts_only_from_that_tier():
    state, _ = new_state()
    mount_tier(state, "n1", 8 * KiB, Tier.DRAM)
    mount_tier(state, "n1", 8 * KiB, Tier.NVME)
    publish(state, "nvme-old", 4 * KiB, options=NVME)
    publish(state, "dram-a", 4 * KiB, options=DRAM)
    publish(state, "dram-b", 4 * KiB, options=DRAM)

    slot = put(state, "k", 4 * KiB, options=DRAM)

    assert tiers_of(slot) == [Tier.DRAM]
    assert published(state) == {"nvme-old", "dram-b"}


@pytest.mark.parametrize("tier", [Tier.DRAM, Tier.NVME])
def test_no_space_in_a_tier_without_segments_names_the_tier(tier):
    state, _ = new_state()
    other = Tier.NVME if tier is Tier.DRAM else Tier.DRAM
    mount_tier(state, "n1", 1 * MiB, other)

    slot = put(state, "k", options=PutOptions(tier=tier))

    assert slot.status is KeyStatus.NO_SPACE
    assert f"no storage node has mounted a segment in the {tier.name} tier yet" in slot.message


def test_no_space_in_a_full_tier_names_the_tier_and_counts_only_its_segments():
    state, _ = new_state()
    mount_tier(state, "n1", 8 * KiB, Tier.NVME)
    mount_tier(state, "n1", 1 * MiB, Tier.DRAM)

    slot = put(state, "k", 16 * KiB, options=NVME)

    assert slot.status is KeyStatus.NO_SPACE
    assert "no segment in the NVME tier can hold 16.0 KiB" in slot.message
    assert "in 1 segments" in slot.message


# ------------------------------------------------------------------ demotion

# Demotion tests use a node with a DRAM segment of 100 KiB (above the 90 % watermark past
# 92 KiB, brought back to 85 KiB) and an NVMe segment of 1 MiB, filled with 10 KiB objects;
# reads there promote nothing, so that each test sees only what it is about.
NO_PROMOTION = MasterConfig(promote_on_hit=False)


def fill_dram(state: MasterState, count: int = 10, options: PutOptions = DRAM) -> list[str]:
    keys = [f"k{i:02d}" for i in range(count)]
    for key in keys:
        publish(state, key, 10 * KiB, options=options)
    return keys


def demote_two(state: MasterState, clock: FakeClock) -> list[CopyCommand]:
    """Fills n1's DRAM (100 %): the next tick demotes k00 and k01 (down to 80 %)."""
    two_tier_node(state)
    fill_dram(state)
    pass_time(state, clock, 1)
    commands = sent(state)
    copies = only(commands, CopyCommand)
    assert [c.source.key for c in copies] == ["k00", "k01"] and len(commands) == 2
    return copies


def test_above_the_dram_watermark_the_lru_objects_are_demoted_to_nvme_on_the_same_node():
    state, clock = new_state(NO_PROMOTION)
    two_tier_node(state, "n1")
    two_tier_node(state, "n2")
    keys = fill_dram(state, options=PutOptions(tier=Tier.DRAM, preferred_hosts=(host("n1"),)))
    before = {key: state.stat(key).replicas for key in keys}

    report = pass_time(state, clock, 1)

    copies = only(sent(state), CopyCommand)
    assert [c.source.key for c in copies] == ["k00", "k01"], "least recently used first"
    assert report.objects_evicted == 0
    for copy in copies:
        key = copy.source.key
        assert (copy.node_id, copy.source_segment_id, copy.target_segment_id) == (
            "n1",
            "n1/dram0",
            "n1/nvme0",
        )
        [replica] = before[key]
        offset = replica.address - replica.segment.base_address
        assert copy.source == StoredObject(
            key, offset, 10 * KiB, copy.source.generation, replicas=1
        )
        assert copy.target.key == key and copy.target.size == 10 * KiB
        assert copy.target.generation == copy.source.generation
        assert state.awaiting(copy.command_id)
        # until the copy is acknowledged the object stays readable where it was
        assert get(state, key).replicas == before[key]
    assert state.segments["n1/dram0"].leaving == 20 * KiB
    assert used(state, "n1/nvme0") == 20 * KiB
    assert state.counters.demotions == 0


def test_an_acknowledged_demotion_moves_the_replica_and_frees_the_dram_bytes_after_the_lease():
    state, clock = new_state(NO_PROMOTION)
    copies = demote_two(state, clock)
    reader = get(state, "k00")  # a reader copies out of DRAM while the copy completes

    for copy in copies:
        state.command_done(copy.command_id, True)

    location = get(state, "k00")
    assert tiers_of(location) == [Tier.NVME]
    assert offset_of(location) == copies[0].target.offset
    assert state.counters.demotions == 2
    forgets = only(sent(state), ForgetCommand)
    assert sorted((f.segment_id, f.objects[0].key) for f in forgets) == [
        ("n1/dram0", "k00"),
        ("n1/dram0", "k01"),
    ]
    assert used(state, "n1/dram0") == 90 * KiB, "k00's bytes wait for its reader"
    assert state.segments["n1/dram0"].leaving == 0
    assert used(state, "n1/nvme0") == 20 * KiB
    assert reader.status is OK
    pass_time(state, clock, CONFIG.lease_ttl)
    assert used(state, "n1/dram0") == 80 * KiB


def test_demotions_in_flight_count_towards_the_watermark():
    state, clock = new_state(NO_PROMOTION)
    demote_two(state, clock)

    pass_time(state, clock, 1)  # the copies are still in flight: DRAM holds 100 KiB

    assert sent(state) == [], "no more demotions, and nothing evicted"
    assert published(state) == {f"k{i:02d}" for i in range(10)}


def test_a_failed_demotion_keeps_the_dram_replica_frees_the_nvme_bytes_and_is_tried_again():
    state, clock = new_state(NO_PROMOTION)
    copies = demote_two(state, clock)

    for copy in copies:
        state.command_done(copy.command_id, False)

    assert used(state, "n1/nvme0") == 0
    assert state.segments["n1/dram0"].leaving == 0
    assert tiers_of(get(state, "k00")) == [Tier.DRAM]
    assert state.counters.demotions == 0
    pass_time(state, clock, DEMOTION_PAUSE)
    assert [c.source.key for c in only(sent(state), CopyCommand)] == ["k01", "k02"]


def test_after_a_failed_demotion_its_segment_takes_none_for_a_while_and_the_watermark_evicts():
    """A node whose disk fails the copy (or whose file was cut short) is not asked the same
    copy again at every tick: the watermark is kept by evicting meanwhile."""
    state, clock = new_state(NO_PROMOTION)
    for copy in demote_two(state, clock):
        state.command_done(copy.command_id, False)

    report = pass_time(state, clock, 1)
    assert only(sent(state), CopyCommand) == [], "no demotion into the failing segment"
    assert report.objects_evicted == 2 and not published(state) & {"k00", "k01"}


def test_without_nvme_room_on_its_node_an_object_above_the_watermark_is_evicted():
    state, clock = new_state(NO_PROMOTION)
    mount_tier(state, "n1", 100 * KiB, Tier.DRAM)
    mount_tier(state, "n1", 8 * KiB, Tier.NVME)  # too small for a 10 KiB object
    mount_tier(state, "n2", 1 * MiB, Tier.NVME)  # room, but on another node
    fill_dram(state)

    report = pass_time(state, clock, 1)

    assert report.objects_evicted == 2
    assert only(sent(state), CopyCommand) == []
    assert not published(state) & {"k00", "k01"}
    assert state.counters.evictions == 2 and state.counters.demotions == 0


def test_a_replica_with_a_twin_on_another_node_is_dropped_not_demoted():
    state, clock = new_state(NO_PROMOTION)
    two_tier_node(state, "n1")
    mount_tier(state, "n2", 1 * MiB, Tier.DRAM)
    for i in range(10):
        publish(state, f"k{i:02d}", 10 * KiB, options=PutOptions(replicas=2, tier=Tier.DRAM))

    report = pass_time(state, clock, 1)

    assert report.objects_evicted == 0
    commands = sent(state)
    assert only(commands, CopyCommand) == []
    assert sorted((f.segment_id, f.objects[0].key) for f in commands) == [
        ("n1/dram0", "k00"),
        ("n1/dram0", "k01"),
    ]
    assert nodes_of(get(state, "k00")) == ["n2"]
    assert used(state, "n1/dram0") == 80 * KiB


def test_an_object_being_demoted_is_not_evicted_to_make_room_for_a_put():
    state, clock = new_state(NO_PROMOTION)
    copies = demote_two(state, clock)

    slot = put(state, "big", 20 * KiB, options=DRAM)  # two 10 KiB objects must go

    assert slot.status is OK
    assert published(state) >= {"k00", "k01"}, "the objects in flight stayed"
    assert not published(state) & {"k02", "k03"}
    for copy in copies:
        state.command_done(copy.command_id, True)
    assert tiers_of(get(state, "k00")) == [Tier.NVME]


def test_removing_an_object_while_it_is_demoted_cancels_the_copy_and_forgets_its_target():
    state, clock = new_state(NO_PROMOTION)
    copies = demote_two(state, clock)
    k00 = copies[0]

    assert remove(state, "k00") is OK

    forgets = only(sent(state), ForgetCommand)
    assert sorted((f.segment_id, f.objects[0].offset) for f in forgets) == sorted(
        [("n1/dram0", k00.source.offset), ("n1/nvme0", k00.target.offset)]
    ), "the node may record the copy before it hears of the removal"
    assert used(state, "n1/nvme0") == 20 * KiB, "k00's target waits: its node may be writing"
    assert used(state, "n1/dram0") == 90 * KiB
    assert state.segments["n1/dram0"].leaving == 10 * KiB, "only k01 is still leaving"
    other = put(state, "other", 10 * KiB, options=PutOptions(tier=Tier.NVME))
    assert other.status is OK and offset_of(other) != k00.target.offset

    state.command_done(k00.command_id, True)  # the node finished the copy meanwhile

    assert exists(state, "k00") is KeyStatus.NOT_FOUND
    assert used(state, "n1/nvme0") == 20 * KiB, "k01's copy and the other object"
    [forget] = only(sent(state), ForgetCommand)
    assert (forget.segment_id, forget.objects[0].offset) == ("n1/nvme0", k00.target.offset)
    assert state.segments["n1/dram0"].leaving == 10 * KiB
    assert state.counters.demotions == 0


def test_a_demotion_the_master_gave_up_waiting_for_keeps_its_target_for_the_reclaim_delay():
    state, clock = new_state(NO_PROMOTION)
    copies = demote_two(state, clock)

    for copy in copies:  # no answer in time: the node may still be copying
        state.command_expired(copy.command_id)

    assert tiers_of(get(state, "k00")) == [Tier.DRAM], "the DRAM replica stays"
    assert state.segments["n1/dram0"].leaving == 0
    forgets = only(sent(state), ForgetCommand)
    assert sorted((f.objects[0].key, f.objects[0].offset) for f in forgets) == [
        (c.target.key, c.target.offset) for c in copies
    ], "the node is told to forget what it may yet record"
    for forget in forgets:
        state.forget_answered(forget.command_id)
    pass_time(state, clock, CONFIG.reclaim_delay - 1)
    retries = only(sent(state), CopyCommand)
    assert [c.source.key for c in retries] == ["k01", "k02"], "tried again (k00 was just read)"
    assert {c.target.offset for c in retries}.isdisjoint(c.target.offset for c in copies)
    assert used(state, "n1/nvme0") == 40 * KiB, "the first targets are not reused yet"
    pass_time(state, clock, 1)
    assert used(state, "n1/nvme0") == 20 * KiB, "now they are free"


def test_no_copy_goes_where_an_unanswered_forget_of_the_same_object_waits():
    """The Forget of a copy given up on is refused at the segment's remounts until the node
    answers it, by key and generation: a later copy of the object there would be refused
    with it, and the node told to forget it (the object lost, if that was its last replica).
    So until the answer the object is not demoted there: above the watermark it goes."""
    state, clock = new_state(NO_PROMOTION)
    copies = demote_two(state, clock)
    for copy in copies:
        state.command_expired(copy.command_id)
    forgets = {f.objects[0].key: f for f in only(sent(state), ForgetCommand)}
    state.forget_answered(forgets["k00"].command_id)  # k01's Forget stays unanswered

    report = pass_time(state, clock, CONFIG.reclaim_delay + 1)

    retries = only(sent(state), CopyCommand)
    assert "k01" not in [c.source.key for c in retries], "not into n1/nvme0 again"
    assert "k01" not in published(state) and report.objects_evicted == 1
    state.validate()


def test_a_node_dying_during_a_demotion_loses_the_object_and_the_answer_changes_nothing():
    state, clock = new_state(NO_PROMOTION)
    copies = demote_two(state, clock)

    pass_time(state, clock, CONFIG.node_ttl + 1, "n1")
    for copy in copies:
        state.command_done(copy.command_id, True)

    assert published(state) == set()
    assert state.counters.demotions == 0


def test_unmounting_the_nvme_segment_during_a_demotion_keeps_the_dram_replica():
    state, clock = new_state(NO_PROMOTION)
    copies = demote_two(state, clock)

    assert state.unmount_segment("n1", "n1/nvme0") == (0, 0.0)

    assert state.segments["n1/dram0"].leaving == 0
    for copy in copies:  # the node's answers, late: they change nothing
        state.command_done(copy.command_id, True)
    assert tiers_of(get(state, "k00")) == [Tier.DRAM]
    assert state.counters.demotions == 0


# ------------------------------------------------------------------ promotion


def nvme_object(state: MasterState, key: str = "k", size: int = 10 * KiB) -> None:
    publish(state, key, size, options=NVME)
    assert sent(state) == []


def test_no_promotion_goes_where_the_forget_of_the_objects_demoted_replica_waits():
    """A demoted object's DRAM replica is forgotten at its node; until the node answers, a
    read promotes nothing into that segment (the copy would be refused with the old one at
    the segment's next mount, and the node told to forget it). Once it has, it does."""
    state, clock = new_state()
    copies = demote_two(state, clock)
    for copy in copies:
        state.command_done(copy.command_id, True)
    forgets = {f.objects[0].key: f for f in only(sent(state), ForgetCommand)}
    pass_time(state, clock, CONFIG.lease_ttl)  # (the demoted replicas' space is free)
    sent(state)

    assert tiers_of(get(state, "k00")) == [Tier.NVME]
    assert only(sent(state), CopyCommand) == [], "not promoted into n1/dram0 yet"

    state.forget_answered(forgets["k00"].command_id)
    assert tiers_of(get(state, "k00")) == [Tier.NVME]
    [copy] = only(sent(state), CopyCommand)
    assert (copy.source.key, copy.target_segment_id) == ("k00", "n1/dram0")
    state.validate()


def test_a_read_of_an_object_held_only_on_nvme_promotes_it_into_dram_on_the_same_node():
    state, _ = new_state()
    two_tier_node(state, "n1")
    two_tier_node(state, "n2")
    publish(state, "k", 10 * KiB, options=PutOptions(tier=Tier.NVME, preferred_hosts=(host("n2"),)))

    location = get(state, "k")

    assert tiers_of(location) == [Tier.NVME], "this read is served from NVMe"
    [copy] = sent(state)
    assert isinstance(copy, CopyCommand)
    assert (copy.node_id, copy.source_segment_id, copy.target_segment_id) == (
        "n2",
        "n2/nvme0",
        "n2/dram0",
    )
    assert get(state, "k").replicas == location.replicas, "until the copy is acknowledged"
    assert sent(state) == [], "one promotion at a time"

    state.command_done(copy.command_id, True, [0xABC])

    promoted = get(state, "k")
    assert sorted(tiers_of(promoted)) == [Tier.DRAM, Tier.NVME], "the NVMe copy stays"
    assert used(state, "n2/dram0") == 10 * KiB
    assert state.counters.promotions == 1
    assert promoted.crc32c is None, "a copy vouches for nothing: no writer checksum, none"
    assert sent(state) == [], "an object with a DRAM replica is not promoted again"


def test_exists_does_not_promote():
    state, _ = new_state()
    two_tier_node(state)
    nvme_object(state)

    assert exists(state, "k") is OK
    assert sent(state) == []


def test_no_promotion_when_it_would_take_dram_above_the_watermark():
    state, _ = new_state()
    two_tier_node(state)
    fill_dram(state, 8)
    publish(state, "small", 1 * KiB, options=DRAM)  # 81 KiB: 10 KiB more would pass 90 KiB
    nvme_object(state)

    assert get(state, "k").status is OK

    assert sent(state) == []
    assert state.counters.promotions == 0


def test_a_promotion_up_to_the_watermark_is_allowed():
    state, _ = new_state()
    two_tier_node(state)
    fill_dram(state, 8)
    nvme_object(state)

    assert get(state, "k").status is OK

    assert len(only(sent(state), CopyCommand)) == 1  # to 90 KiB of 100: at the watermark


def test_no_promotion_when_promote_on_hit_is_off():
    state, _ = new_state(NO_PROMOTION)
    two_tier_node(state)
    nvme_object(state)

    assert get(state, "k").status is OK

    assert sent(state) == []


def test_no_promotion_when_the_node_has_no_dram():
    state, _ = new_state()
    mount_tier(state, "n1", 1 * MiB, Tier.NVME)
    mount_tier(state, "n2", 1 * MiB, Tier.DRAM)  # DRAM, but on another node
    nvme_object(state)

    assert get(state, "k").status is OK

    assert sent(state) == []


def test_a_failed_promotion_frees_the_dram_bytes_and_a_later_read_tries_again():
    state, _ = new_state()
    two_tier_node(state)
    nvme_object(state)
    get(state, "k")
    [copy] = sent(state)

    state.command_done(copy.command_id, False)

    assert used(state, "n1/dram0") == 0
    assert tiers_of(get(state, "k")) == [Tier.NVME]
    assert len(only(sent(state), CopyCommand)) == 1


def test_a_promoted_replica_is_dropped_first_above_the_dram_watermark():
    state, clock = new_state()
    two_tier_node(state)
    nvme_object(state, "k", 10 * KiB)
    get(state, "k")
    [copy] = sent(state)
    state.command_done(copy.command_id, True)
    fill_dram(state, 9)  # 100 KiB of DRAM, the promoted copy the least recently used

    pass_time(state, clock, CONFIG.lease_ttl)  # k's lease (from the read) ends

    assert [r.segment.tier for r in state.stat("k").replicas] == [Tier.NVME], "its twin stays"
    commands = sent(state)
    assert [(f.segment_id, f.objects[0].key) for f in only(commands, ForgetCommand)] == [
        ("n1/dram0", "k")
    ]
    assert [c.source.key for c in only(commands, CopyCommand)] == ["k00"], "then k00 goes down"
    assert state.counters.evictions == 0


# ------------------------------------------------------------------ clients


def test_only_clients_holding_reservations_are_tracked():
    state, _ = new_state()
    mount(state, "a")
    state.client_heartbeat("reader")
    assert state.clients == {}

    slot = put(state, "k", client="writer")
    assert set(state.clients) == {"writer"}

    assert commit(state, "k", slot) is OK
    assert state.clients == {}, "its last reservation ended: it is dropped quietly"
    state.client_heartbeat("writer")
    assert state.clients == {}


def test_a_put_start_that_reserves_nothing_does_not_track_its_client():
    state, _ = new_state()
    mount(state, "a", 8 * KiB)

    [slot] = state.put_start("c1", ["big"], [1 * MiB])

    assert slot.status is KeyStatus.NO_SPACE
    assert state.clients == {}


# ------------------------------------------------------------------ eviction of replicated objects


def test_no_space_only_once_every_evictable_replica_in_the_tier_is_gone():
    state, _ = new_state()
    mount_tier(state, "a", 10 * KiB)
    mount_tier(state, "b", 10 * KiB)
    publish(state, "twin", 5 * KiB, options=PutOptions(replicas=2, preferred_hosts=(host("a"),)))
    publish(
        state, "pinned", 5 * KiB, options=PutOptions(pin=Pin.HARD, preferred_hosts=(host("a"),))
    )
    publish(state, "other", 4 * KiB, options=PutOptions(preferred_hosts=(host("b"),)))
    assert nodes_of(state.stat("twin")) == ["a", "b"]  # a: full; b: 1 KiB free

    slot = put(state, "new", 6 * KiB)  # fits on b once both other and twin's replica there go

    assert slot.status is OK, slot.message


def test_a_tick_brings_the_dram_pool_below_the_watermark_when_replicas_may_go():
    state, clock = new_state()
    mount_tier(state, "b", 100 * KiB)
    mount_tier(state, "c", 100 * KiB)
    publish(state, "twin", 5 * KiB, replicas=2)
    mount_tier(state, "a", 100 * KiB)
    for node, size in (("a", 100 * KiB), ("b", 85 * KiB), ("c", 85 * KiB)):
        pinned = PutOptions(pin=Pin.HARD, preferred_hosts=(host(node),))
        publish(state, f"pinned-{node}", size, options=pinned)
    # a: 100 %, nothing evictable; b and c: 90 %, not above; the pool: 280 of 300 KiB

    pass_time(state, clock, 1)

    dram = sum(used(state, f"{node}/dram0") for node in ("a", "b", "c"))
    assert dram <= CONFIG.high_watermark * 300 * KiB, "twin's replicas may both go"


def test_an_nvme_segment_that_demotions_push_above_the_watermark_is_brought_back_in_that_tick():
    state, clock = new_state(NO_PROMOTION)
    mount_tier(state, "n1", 100 * KiB, Tier.NVME)  # mounted before its DRAM
    mount_tier(state, "n1", 100 * KiB, Tier.DRAM)
    mount_tier(state, "n2", 1 * MiB, Tier.NVME)  # keeps the NVMe pool far below its watermark
    on_n1 = PutOptions(tier=Tier.NVME, preferred_hosts=(host("n1"),))
    for i in range(17):
        publish(state, f"v{i:02d}", 5 * KiB, options=on_n1)  # n1's NVMe: 85 %
    fill_dram(state)  # n1's DRAM: 100 %

    pass_time(state, clock, 1)  # k00 goes down to NVMe (95 %), k01 finds no room there

    assert [c.source.key for c in only(sent(state), CopyCommand)] == ["k00"]
    nvme = state.segments["n1/nvme0"]
    assert nvme.allocator.used <= CONFIG.high_watermark * nvme.allocator.capacity
    assert exists(state, "v00") is KeyStatus.NOT_FOUND, "the least recently used went"


def test_an_nvme_segment_that_pool_demotions_push_above_the_watermark_is_brought_back_too():
    state, clock = new_state(NO_PROMOTION)
    mount_tier(state, "n2", 100 * KiB, Tier.NVME)
    mount_tier(state, "n2", 100 * KiB, Tier.DRAM)
    mount_tier(state, "n1", 100 * KiB, Tier.DRAM)
    mount_tier(state, "n3", 1 * MiB, Tier.NVME)  # keeps the NVMe pool far below its watermark
    stuck = PutOptions(tier=Tier.DRAM, pin=Pin.HARD, preferred_hosts=(host("n1"),))
    publish(state, "pinned", 100 * KiB, options=stuck)  # n1's DRAM: 100 %, nothing evictable
    for i in range(17):
        on_n2 = PutOptions(tier=Tier.NVME, preferred_hosts=(host("n2"),))
        publish(state, f"v{i:02d}", 5 * KiB, options=on_n2)  # n2's NVMe: 85 %
    fill_dram(state, 9, PutOptions(tier=Tier.DRAM, preferred_hosts=(host("n2"),)))  # 90 %

    pass_time(state, clock, 1)  # the DRAM pool (95 %) demotes k00 to n2's NVMe, evicts k01

    assert [c.source.key for c in only(sent(state), CopyCommand)] == ["k00"]
    assert exists(state, "k01") is KeyStatus.NOT_FOUND
    nvme = state.segments["n2/nvme0"]
    assert nvme.allocator.used <= CONFIG.high_watermark * nvme.allocator.capacity
    assert exists(state, "v00") is KeyStatus.NOT_FOUND, "the least recently used went"


def test_a_demotion_refused_for_a_same_host_writers_lock_pauses_no_demotion():
    """Its target's range is held by a writer (storage_node/commands.py): neither the disk
    nor the source failed, so the segment keeps taking demotions and nothing is evicted for
    it."""
    from kvpool.common.status import WRITER_HOLDS_RANGE

    state, clock = new_state(NO_PROMOTION)
    held = []
    for copy in demote_two(state, clock):
        error = f"TimeoutError: {WRITER_HOLDS_RANGE} a lock on the range"
        state.command_done(copy.command_id, False, error=error)
        held.append(copy.target.offset)
    # no Forget of the object at its target: the node wrote nothing there, and the tombstone
    # a Forget notes would refuse the object's copy that lands elsewhere on that segment
    assert only(sent(state), ForgetCommand) == []

    report = pass_time(state, clock, 1)
    again = only(sent(state), CopyCommand)
    assert again, "demoted again, to the same segment"
    assert not {c.target.offset for c in again} & set(held), "not into the held ranges"
    assert report.objects_evicted == 0


def test_a_held_copy_target_is_not_placed_again_at_every_tick():
    """No quarantine may cover a held range (its Forget gone with a remount, or answered
    before the writer locked): each copy placed there costs the node a tenth of a second of
    its ordered commands, so the range is left alone for a while."""
    from kvpool.common.status import WRITER_HOLDS_RANGE

    error = f"TimeoutError: {WRITER_HOLDS_RANGE} a lock on the range"
    state, clock = new_state(NO_PROMOTION)
    held = set()
    for copy in demote_two(state, clock):
        held.add((copy.target_segment_id, copy.target.offset))
        state.command_done(copy.command_id, False, error=error)
    into_held = 0
    for _ in range(50):  # (5 s of ticks, the node answering every copy at once)
        pass_time(state, clock, 0.1)
        for copy in only(sent(state), CopyCommand):
            if (copy.target_segment_id, copy.target.offset) in held:
                into_held += 1
                state.command_done(copy.command_id, False, error=error)
            else:
                state.command_done(copy.command_id, True, [0])
    assert into_held == 0, f"{into_held} copies into the held ranges"
