"""Specification of the master core's self-checks and memory: the table of legal object
transitions (master/transitions.py), ``MasterState.validate`` (master/invariants.py) and the
per-key story (master/story.py, served by master/story_rpc.py).

As in the other specifications of the core, a fake clock and seeded placement make every run
the same; corruptions are made by hand, the way a bug would, to see each check name what broke.
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
    get,
    mount,
    new_state,
    publish,
    put,
    remove,
    segment_info,
)

from kvpool.common.status import KeyStatus, Pin, Tier
from kvpool.master.config import MasterConfig
from kvpool.master.invariants import InvariantViolation
from kvpool.master.records import (
    Commit,
    CopyCommand,
    ObjectState,
    PutOptions,
    PutSlot,
    Replica,
    StoredObject,
)
from kvpool.master.state import EVENTS, MasterState
from kvpool.master.story import FIELDS, StoryLog, format_value
from kvpool.master.story_rpc import story_response
from kvpool.master.transitions import GONE, LEGAL, IllegalTransition

RESERVED, COMMITTED, PUBLISHED = ObjectState.RESERVED, ObjectState.COMMITTED, ObjectState.PUBLISHED


def events(state: MasterState, key: str) -> list[str]:
    return [event.event for event in state.story(key)]


def healthy_state() -> tuple[MasterState, FakeClock]:
    """A small cluster that went through most of what can happen to objects."""
    state, clock = new_state()
    mount(state, "n1")
    mount(state, "n2")
    publish(state, "published", replicas=2)
    publish(state, "leased")
    get(state, "leased")
    put(state, "reserved")
    publish(state, "removed")
    remove(state, "removed")  # its space comes back at once: nobody leases it
    publish(state, "read-then-removed")
    get(state, "read-then-removed")
    remove(state, "read-then-removed", force=True)  # its space waits for the lease
    revoked = put(state, "revoked")
    state.put_revoke(["revoked"], [revoked.put_id])
    committed = put(state, "committed")
    state.put_end([_commit("committed", committed)])  # its nodes have not answered yet
    assert state.objects["committed"].state is COMMITTED
    return state, clock


def _commit(key: str, slot: PutSlot) -> Commit:
    """The writer's report that it wrote every replica (the nodes have yet to answer)."""
    return Commit(key, slot.put_id, (True,) * len(slot.replicas))


# ------------------------------------------------------------------ the transitions table


def test_the_table_lets_objects_only_move_forward_or_end():
    assert LEGAL.keys() == {GONE, *ObjectState}, "every state has its row"
    assert LEGAL[GONE] == {RESERVED, PUBLISHED}  # a put; an object a node reports
    assert LEGAL[RESERVED] == {COMMITTED, GONE}
    assert LEGAL[COMMITTED] == {PUBLISHED, GONE}
    assert LEGAL[PUBLISHED] == {GONE}
    for state in (RESERVED, COMMITTED, PUBLISHED):
        assert GONE in LEGAL[state], f"{state} objects can always end"
        assert state not in LEGAL[state]


def test_an_illegal_transition_is_refused_and_names_the_key_and_both_states():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")
    record = state.objects["k"]

    with pytest.raises(IllegalTransition) as refused:
        state._transition(record, RESERVED, (0.0, "reserved", 1, "c1", ()))

    assert (refused.value.key, refused.value.from_state, refused.value.to_state) == (
        "k",
        PUBLISHED,
        RESERVED,
    )
    assert "'k': published -> reserved" in str(refused.value)
    assert isinstance(refused.value, AssertionError), "a bug, not an answer to a client"
    assert record.state is PUBLISHED and state.objects["k"] is record, "nothing changed"
    state.validate()


def test_a_committed_object_cannot_be_reserved_again():
    state, _ = new_state()
    mount(state, "n1")
    slot = put(state, "k")
    state.put_end([_commit("k", slot)])

    with pytest.raises(IllegalTransition, match="committed -> reserved"):
        state._transition(state.objects["k"], RESERVED, (0.0, "reserved", 1, "c1", ()))


def test_an_object_cannot_be_created_where_another_lives_nor_end_twice():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")
    record = state.objects["k"]
    intruder = replace(record, state=RESERVED, replicas=list(record.replicas))

    with pytest.raises(IllegalTransition, match="another object holds the key"):
        state._transition(intruder, RESERVED, (0.0, "reserved", 1, "c1", ()))
    assert state.objects["k"] is record

    remove(state, "k")
    with pytest.raises(IllegalTransition, match="gone -> gone"):
        state._transition(record, GONE, (0.0, "removed", record.put_id, PUBLISHED, False))


def test_every_state_change_of_the_core_goes_through_the_table():
    """No bare assignment of ``.state`` (nor creation or deletion of records) is left in
    the core but the one in ``_transition``."""
    import inspect

    import kvpool.master.state as core

    source = inspect.getsource(core)
    assert source.count(".state = ") == 1
    assert source.count("del self.objects[") == 1
    assert source.count("self.objects[key] = record") == 1
    assert "self.objects[item.key] =" not in source


# ------------------------------------------------------------------ validate()


def test_validate_passes_on_a_healthy_state():
    state, clock = healthy_state()
    state.validate()
    clock.advance(CONFIG.reservation_timeout + 1)
    state.tick()  # reclaims "reserved"; its space waits for the reclaim delay
    state.validate()
    clock.advance(CONFIG.reclaim_delay + 1)
    answer_nodes(state)
    state.tick()
    state.validate()


def corrupt_and_check(corrupt, invariant: str) -> InvariantViolation:
    state, _ = healthy_state()
    state.validate()
    corrupt(state)
    with pytest.raises(InvariantViolation) as broken:
        state.validate()
    assert broken.value.invariant == invariant
    assert invariant in str(broken.value)
    return broken.value


def test_validate_names_a_published_object_missing_from_the_key_index():
    broken = corrupt_and_check(
        lambda state: state._published_keys.remove("published"),
        "published keys index == published objects",
    )
    assert "not indexed: ['published']" in broken.detail


def test_validate_names_a_buffer_allocated_but_owned_by_nobody():
    def leak(state):
        state.segments["n1/dram0"].allocator.allocate(4 * KiB)

    corrupt_and_check(leak, "every allocated buffer is owned or waiting to be freed")


def test_validate_names_a_replica_its_segment_does_not_know():
    def disown(state):
        replica = state.objects["published"].replicas[0]
        del state.segments[replica.segment_id].owners[replica.offset]

    corrupt_and_check(disown, "a segment owns each replica at its offset")


def test_validate_names_a_published_replica_in_an_unmounted_segment():
    def move_away(state):
        record = state.objects["leased"]
        record.replicas[0] = Replica("gone/dram0", record.replicas[0].offset)

    corrupt_and_check(move_away, "replicas lie in mounted segments")


def test_validate_names_a_reservation_missing_from_its_queue():
    corrupt_and_check(
        lambda state: state._reservations.pop("reserved"),
        "reservations index == reserved objects",
    )


def test_validate_names_a_committed_object_waiting_for_a_node_without_its_replica():
    def await_elsewhere(state):
        record = state.objects["committed"]
        record.unacked = record.unacked | {"elsewhere/dram0"}

    corrupt_and_check(await_elsewhere, "a committed object awaits nodes that hold its replicas")


def test_validate_names_a_bare_state_change():
    def skip_commit(state):
        state.objects["reserved"].state = PUBLISHED  # as a bare assignment would

    corrupt_and_check(skip_commit, "published keys index == published objects")


def test_validate_names_allocator_accounting_that_drifted():
    def drift(state):
        state.segments["n2/dram0"].allocator.used += 64

    corrupt_and_check(drift, "allocator used bytes = sum of allocations")


def test_with_validate_each_event_a_corruption_is_caught_at_the_next_event():
    state, _ = new_state(MasterConfig(validate_each_event=True))
    mount(state, "n1")
    publish(state, "k")
    state.segments["n1/dram0"].allocator.allocate(4 * KiB)  # a bug leaks a buffer

    with pytest.raises(InvariantViolation, match="owned or waiting to be freed"):
        state.heartbeat("n1", ["n1/dram0"])


def test_validate_each_event_costs_nothing_when_off():
    """Off (the default), the event methods are the class's own: no wrapper to call."""
    state, _ = new_state()
    assert not set(EVENTS) & set(vars(state))
    checked, _ = new_state(MasterConfig(validate_each_event=True))
    assert set(EVENTS) <= set(vars(checked))
    for name in EVENTS:
        assert callable(getattr(MasterState, name)), f"{name} is an event method"


# ------------------------------------------------------------------ story(key)


def test_the_story_of_a_put_read_and_removal():
    state, clock = new_state()
    mount(state, "n1")
    mount(state, "n2")
    started = clock.now
    slot = put(state, "k", replicas=2)
    clock.advance(0.5)
    state.put_end([_commit("k", slot)])
    clock.advance(0.25)
    answer_nodes(state)
    for _ in range(5):
        get(state, "k")  # reads are not noted
    clock.advance(20)
    assert remove(state, "k") is KeyStatus.OK

    story = state.story("k")

    assert [e.event for e in story] == ["reserved", "committed", "published", "removed"]
    assert [e.time for e in story] == [started, started + 0.5, started + 0.75, started + 20.75]
    reserved, committed, published, removed = (e.details for e in story)
    assert reserved["put_id"] == slot.put_id and reserved["client"] == "c1"
    assert {r.segment_id for r in reserved["replicas"]} == {"n1/dram0", "n2/dram0"}
    assert committed == {"put_id": slot.put_id, "unwritten": 0}
    assert set(published["replicas"]) == set(reserved["replicas"])
    assert removed == {"put_id": slot.put_id, "state": PUBLISHED, "force": False}


def test_a_key_written_again_keeps_one_story_across_its_objects():
    state, _ = new_state()
    mount(state, "n1")
    first = publish(state, "k")
    remove(state, "k")
    second = publish(state, "k")

    story = state.story("k")

    assert [e.event for e in story] == [
        *("reserved", "committed", "published", "removed"),
        *("reserved", "committed", "published"),
    ]
    assert [e.details["put_id"] for e in story] == [first.put_id] * 4 + [second.put_id] * 3


def test_the_story_says_why_an_object_ended():
    state, clock = new_state(MasterConfig(client_ttl=100.0))
    mount(state, "n1")
    revoked = put(state, "revoked")
    state.put_revoke(["revoked"], [revoked.put_id])
    put(state, "timed-out")
    unwritten = put(state, "unwritten")
    assert commit(state, "unwritten", unwritten, False) is KeyStatus.NO_REPLICA
    unrecorded = put(state, "unrecorded")
    state.put_end([_commit("unrecorded", unrecorded)])
    answer_nodes(state, ok=False)
    clock.advance(CONFIG.reservation_timeout + 1)
    state.tick()

    assert events(state, "revoked") == ["reserved", "revoked"]
    assert events(state, "unwritten") == ["reserved", "write_failed"]
    assert events(state, "unrecorded") == [
        "reserved",
        "committed",
        "persist_failed",
        "not_recorded",
    ]
    assert state.story("unrecorded")[2].details == {
        "put_id": unrecorded.put_id,
        "segment": "n1/dram0",
        "expired": False,
    }
    assert events(state, "timed-out") == ["reserved", "reclaimed"]
    assert state.story("timed-out")[-1].details["reason"] == "timed out"


def test_the_story_tells_a_silent_writer_and_a_dead_node_apart():
    state, clock = new_state()
    mount(state, "n1")
    mount(state, "n2")
    put(state, "abandoned", client="quiet")
    publish(state, "kept", replicas=2)
    publish(state, "sole", options=PutOptions(preferred_hosts=("n2.cluster.local",)))
    clock.advance(CONFIG.client_ttl + 1)
    state.heartbeat("n1", ["n1/dram0"])
    state.tick()  # the writer is silent past its TTL; n2 still within its TTL
    clock.advance(CONFIG.node_ttl - 1)
    state.heartbeat("n1", ["n1/dram0"])
    clock.advance(2)
    state.heartbeat("n1", ["n1/dram0"])
    state.tick()  # n2 is silent past its TTL: dead

    assert state.story("abandoned")[-1].details["reason"] == "writer silent"
    assert events(state, "kept")[-1] == "replica_lost"
    assert state.story("kept")[-1].details["segment"] == "n2/dram0"
    assert events(state, "sole")[-1] == "lost"
    assert state.story("sole")[-1].details == {
        "put_id": state.story("sole")[0].details["put_id"],
        "state": PUBLISHED,
        "segment": "n2/dram0",
    }


def test_the_story_of_an_eviction():
    state, clock = new_state()
    mount(state, "n1", 100 * KiB)
    for i in range(10):
        publish(state, f"k{i}", 10 * KiB)
    clock.advance(CONFIG.lease_ttl + 1)  # their leases end
    state.heartbeat("n1", ["n1/dram0"])
    state.tick()

    assert events(state, "k0") == ["reserved", "committed", "published", "evicted"]
    assert events(state, "k9") == ["reserved", "committed", "published"]


def test_the_story_of_a_demotion_and_an_adoption():
    state, clock = new_state(MasterConfig(promote_on_hit=False))
    mount(state, "n1", 100 * KiB)
    nvme = replace(segment_info("n1", 1 * MiB, "n1/nvme0"), tier=Tier.NVME, persistent=True)
    state.mount_segment(nvme)
    for i in range(10):
        publish(state, f"k{i:02d}", 10 * KiB, options=PutOptions(tier=Tier.DRAM))
    clock.advance(1)
    state.tick()
    [copy, _] = [c for c in state.outbox if isinstance(c, CopyCommand)]
    state.outbox.clear()
    state.command_done(copy.command_id, True)

    story = state.story("k00")
    assert [e.event for e in story][-2:] == ["demoting", "demoted"]
    assert story[-1].details["replica"] == Replica("n1/nvme0", copy.target.offset)

    other = replace(segment_info("n2", 1 * MiB, "n2/nvme0"), tier=Tier.NVME, persistent=True)
    generation = state.story("k05")[0].details["put_id"]
    state.mount_segment(other, [StoredObject("k05", 0, 10 * KiB, generation)], remount=True)
    state.mount_segment(
        replace(other, segment_id="n2/nvme1", base_address=0x90_0000),
        [StoredObject("fresh", 0, 10 * KiB, generation + 100)],
        remount=True,
    )
    assert events(state, "k05")[-1] == "replica_adopted"
    assert events(state, "fresh") == ["adopted"]
    state.validate()


def test_an_ended_soft_pin_is_in_the_story():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k", options=PutOptions(pin=Pin.SOFT, pin_ttl=3.0))
    clock.advance(4)
    state.tick()

    assert events(state, "k")[-1] == "pin_ended"


def test_the_story_keeps_the_last_events_of_each_key():
    state, _ = new_state(MasterConfig(story_events_per_key=5))
    mount(state, "n1")
    slots = []
    for _ in range(3):
        slots.append(publish(state, "k"))
        remove(state, "k")

    story = state.story("k")

    assert len(story) == 5
    assert [e.event for e in story] == ["removed", "reserved", "committed", "published", "removed"]
    assert story[-1].details["put_id"] == slots[-1].put_id


def test_the_story_keeps_the_last_events_of_all_keys_the_oldest_go_first():
    state, _ = new_state(MasterConfig(story_events=6))
    mount(state, "n1")
    publish(state, "a")
    publish(state, "b")
    remove(state, "a")
    publish(state, "c")  # ten events in all: the first four are gone

    assert events(state, "a") == ["removed"]
    assert events(state, "b") == ["committed", "published"]
    assert events(state, "c") == ["reserved", "committed", "published"]


@pytest.mark.parametrize("batches", [[1, 1, 1, 1, 1, 1, 1], [3, 4, 2], [2, 6], [9], [4, 4, 4, 4]])
def test_the_ring_keeps_the_last_events_in_order_however_they_are_folded(batches):
    log = StoryLog(per_key=100, capacity=5)
    noted = 0
    for size in batches:
        for _ in range(size):
            log.note(("k", float(noted), "pin_ended", noted))
            noted += 1
        log.fold()

    kept = [e.time for e in log.story("k")]
    assert kept == [float(i) for i in range(max(0, noted - 5), noted)]
    assert len(log) == min(noted, 5)


def test_a_story_of_no_events_keeps_nothing_and_changes_nothing():
    state, _ = new_state(MasterConfig(story_events=0))
    mount(state, "n1")
    publish(state, "k")
    assert state.story("k") == []
    assert get(state, "k").status is KeyStatus.OK


def test_story_bounds_must_make_sense():
    with pytest.raises(ValueError, match="story_events_per_key"):
        MasterConfig(story_events_per_key=0)
    with pytest.raises(ValueError, match="story_events"):
        MasterConfig(story_events=-1)
    with pytest.raises(ValueError):
        StoryLog(per_key=0)


def test_every_event_names_its_details():
    log = StoryLog(per_key=len(FIELDS), capacity=len(FIELDS))
    for event, names in FIELDS.items():
        log.add(("k", 1.0, event, *range(len(names))))
    assert [tuple(e.details) for e in log.story("k")] == list(FIELDS.values())


def test_an_unknown_key_has_no_story():
    state, _ = new_state()
    assert state.story("never-seen") == []


# ------------------------------------------------------------------ the Story RPC


def test_the_story_rpc_gives_ages_and_readable_details():
    state, clock = new_state()
    mount(state, "n1")
    slot = publish(state, "k")
    clock.advance(3)

    response = story_response(state, "k")

    assert [e.event for e in response.events] == ["reserved", "committed", "published"]
    assert [round(e.age_s, 3) for e in response.events] == [3.0, 3.0, 3.0]
    reserved = response.events[0]
    assert reserved.details["put_id"] == str(slot.put_id)
    assert reserved.details["client"] == "c1"
    offset = slot.replicas[0].address - slot.replicas[0].segment.base_address
    assert reserved.details["replicas"] == f"n1/dram0@{offset:#x}"
    assert story_response(state, "nothing").events == []


def test_details_read_plainly():
    assert format_value(Replica("n1/dram0", 4096)) == "n1/dram0@0x1000"
    assert format_value((Replica("a", 0), Replica("b", 64))) == "a@0x0, b@0x40"
    assert format_value(()) == "-"
    assert format_value(None) == "-"
    assert format_value(True) == "yes"
    assert format_value(PUBLISHED) == "published"
    assert format_value(12) == "12"
