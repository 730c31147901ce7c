"""Specification of the master's sans-IO metadata core (master/state.py).

Every test drives ``MasterState`` with a fake clock and a seeded random generator: time passes
only when a test says so, timeouts, leases and node deaths take effect only when the test calls
``tick``, and random placement makes the same choices on every run. Tests that depend on where
replicas go say so by asking for most-free-first placement.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from state_helpers import (
    CONFIG,
    MOST_FREE,
    FakeClock,
    KiB,
    MiB,
    commit,
    end_puts,
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
    total_used,
    usage,
    used,
)

from kvpool.common.keys import MAX_KEY_BYTES, STORED_KEY_BYTES
from kvpool.common.status import KeyStatus, Tier
from kvpool.master.config import MasterConfig
from kvpool.master.records import Commit, PutOptions, PutSlot
from kvpool.master.state import MasterState

# ------------------------------------------------------------------ mounting segments


def test_a_mounted_segment_shows_up_empty_in_the_snapshot():
    state, _ = new_state()
    info = mount(state, "n1", 1 * MiB)
    snapshot = state.snapshot()
    assert snapshot.nodes == 1
    assert snapshot.objects == snapshot.reservations == 0
    [segment] = snapshot.segments
    assert segment.info == info
    assert (segment.capacity, segment.used, segment.objects) == (1 * MiB, 0, 0)
    assert segment.largest_free == 1 * MiB


def test_remounting_a_segment_with_identical_info_is_a_no_op():
    state, _ = new_state()
    info = mount(state, "n1")
    publish(state, "k")
    before = usage(state, info.segment_id)

    state.mount_segment(info)  # e.g. a node retrying its mount call

    assert get(state, "k").status is KeyStatus.OK
    assert usage(state, info.segment_id) == before
    assert state.snapshot().nodes == 1


def test_remounting_a_changed_segment_under_the_same_id_drops_its_objects():
    state, _ = new_state()
    info = mount(state, "n1")
    publish(state, "k")

    # The node restarted: same segment id, but new memory (a new base address and remote key).
    changed = segment_info("n1", info.size, info.segment_id, base=0x90_0000)
    state.mount_segment(changed)

    assert get(state, "k").status is KeyStatus.NOT_FOUND
    assert usage(state, info.segment_id).info == changed
    assert used(state, info.segment_id) == 0
    assert state.snapshot().objects == 0


def test_a_new_process_of_a_node_drops_the_memory_of_the_one_before():
    """A node restarted under its id within the node TTL (a crash, an OOM kill): its new
    process keeps the node alive, so only its mount can tell that the earlier process's
    DRAM (a new id in every process) is gone. Left, placement would choose it, and copies
    in it would count as replicas."""
    state, _ = new_state()
    old = replace(segment_info("n1", MiB, "n1/dram-old"), incarnation="process-1")
    disk = replace(
        segment_info("n1", MiB, "n1/nvme", base=0x90_0000), incarnation="process-1",
        persistent=True, tier=Tier.NVME,
    )  # fmt: skip
    state.mount_segment(old)
    state.mount_segment(disk)
    mount(state, "n2")
    publish(state, "k", replicas=2, options=PutOptions(replicas=2, tier=Tier.DRAM))
    lost_before = state.counters.objects_lost

    new = replace(segment_info("n1", MiB, "n1/dram-new", base=0xA0_0000), incarnation="process-2")
    state.mount_segment(new)

    assert set(state.nodes["n1"].segment_ids) == {"n1/dram-new", "n1/nvme"}, (
        "the persistent segment stays: the new process mounts it again under its id"
    )
    assert segments_of(get(state, "k")) == ["n2/dram0"], "a gone copy is no replica"
    assert state.counters.objects_lost == lost_before
    for i in range(8):
        assert "n1/dram-old" not in segments_of(publish(state, f"after-{i}", replicas=2))


def test_a_mount_from_the_same_process_or_one_that_does_not_say_drops_nothing():
    state, _ = new_state()
    first = replace(segment_info("n1", MiB, "n1/dram-a"), incarnation="process-1")
    state.mount_segment(first)
    state.mount_segment(replace(segment_info("n1", MiB, "n1/dram-b", base=0x90_0000),
                                incarnation="process-1"))  # fmt: skip
    state.mount_segment(segment_info("n1", MiB, "n1/dram-c", base=0xA0_0000))
    assert state.nodes["n1"].segment_ids == {"n1/dram-a", "n1/dram-b", "n1/dram-c"}


def test_a_segment_can_move_to_another_node_under_the_same_id():
    state, _ = new_state()
    mount(state, "n1", segment="shared")
    publish(state, "k")
    mount(state, "n2", segment="shared")

    assert get(state, "k").status is KeyStatus.NOT_FOUND
    assert nodes_of(publish(state, "k2")) == ["n2"]


# ------------------------------------------------------------------ placing replicas


def test_put_start_reserves_one_buffer_per_replica_on_distinct_nodes():
    state, _ = new_state()
    infos = {node: mount(state, node) for node in ("n1", "n2", "n3")}

    slot = put(state, "k", 4 * KiB, replicas=3)

    assert slot.status is KeyStatus.OK
    assert slot.put_id > 0
    assert sorted(nodes_of(slot)) == ["n1", "n2", "n3"]
    for replica in slot.replicas:
        info = infos[replica.segment.node_id]
        assert replica.segment == info, "a replica carries what a client needs to reach it"
        offset = replica.address - info.base_address
        assert offset >= 0 and offset + 4 * KiB <= info.size
        assert offset % CONFIG.alignment == 0
    assert total_used(state) == 3 * 4 * KiB


def test_two_segments_on_one_node_never_hold_two_replicas_of_an_object():
    state, _ = new_state()
    mount(state, "n1", segment="n1/dram0")
    mount(state, "n1", segment="n1/dram1")
    mount(state, "n2")

    slot = put(state, "k", replicas=3)

    assert slot.status is KeyStatus.OK
    assert sorted(nodes_of(slot)) == ["n1", "n2"]
    assert len(set(segments_of(slot))) == 2


def test_a_single_node_with_many_segments_gives_one_replica():
    state, _ = new_state()
    for i in range(4):
        mount(state, "n1", segment=f"n1/dram{i}")

    slot = put(state, "k", replicas=2)

    assert slot.status is KeyStatus.OK
    assert nodes_of(slot) == ["n1"]


def test_replicas_are_best_effort_when_fewer_nodes_than_asked():
    state, _ = new_state()
    mount(state, "n1")
    mount(state, "n2")

    slot = put(state, "k", replicas=3)

    assert slot.status is KeyStatus.OK
    assert len(slot.replicas) == 2
    assert commit(state, "k", slot) is KeyStatus.OK
    assert sorted(nodes_of(get(state, "k"))) == ["n1", "n2"]


def test_replicas_are_best_effort_when_some_nodes_are_full():
    state, _ = new_state()
    mount(state, "n1", 8 * KiB)
    mount(state, "n2", 64 * KiB)
    publish(state, "filler", 60 * KiB)  # most free first: lands on n2, leaving it 4 KiB

    slot = put(state, "k", 6 * KiB, replicas=2)

    assert slot.status is KeyStatus.OK
    assert nodes_of(slot) == ["n1"]


def test_zero_replicas_means_the_configured_default():
    state, _ = new_state(MasterConfig(default_replicas=2))
    mount(state, "n1")
    mount(state, "n2")
    mount(state, "n3")

    assert len(put(state, "k", replicas=0).replicas) == 2


def test_most_free_first_spreads_objects_over_nodes():
    state, _ = new_state(MOST_FREE)
    mount(state, "n1", 1 * MiB)
    mount(state, "n2", 1 * MiB)

    placements = [nodes_of(publish(state, f"k{i}", 4 * KiB)) for i in range(6)]

    assert sorted(node for [node] in placements) == ["n1"] * 3 + ["n2"] * 3
    for earlier, later in itertools.pairwise(placements):
        assert earlier != later, "each put goes to the node with more free space"


def test_most_free_first_prefers_the_node_with_the_largest_free_extent():
    state, _ = new_state(MOST_FREE)
    mount(state, "small", 64 * KiB)
    mount(state, "big", 1 * MiB)
    mount(state, "medium", 512 * KiB)

    assert nodes_of(put(state, "k", replicas=2)) == ["big", "medium"]


@pytest.mark.parametrize("config", [CONFIG, MOST_FREE], ids=["random", "most-free"])
def test_within_a_node_the_segment_with_the_largest_free_extent_is_used(config):
    state, _ = new_state(config)
    mount(state, "n1", 64 * KiB, segment="n1/small")
    mount(state, "n1", 1 * MiB, segment="n1/big")
    mount(state, "n1", 512 * KiB, segment="n1/medium")

    assert segments_of(put(state, "k")) == ["n1/big"]


def test_random_placement_spreads_objects_over_all_nodes():
    state, _ = new_state(CONFIG)
    for node in ("n1", "n2", "n3", "n4"):
        mount(state, node, 4 * MiB)

    counts = {"n1": 0, "n2": 0, "n3": 0, "n4": 0}
    for i in range(400):
        [node] = nodes_of(publish(state, f"k{i}", 1 * KiB))
        counts[node] += 1

    assert all(count >= 50 for count in counts.values()), counts


def test_random_placement_is_reproducible_with_the_same_generator():
    def placements(seed: int) -> list[list[str]]:
        state, _ = new_state(CONFIG, seed)
        for node in ("n1", "n2", "n3"):
            mount(state, node)
        return [nodes_of(put(state, f"k{i}", replicas=2)) for i in range(20)]

    assert placements(1) == placements(1)
    assert placements(1) != placements(2)


def test_a_zero_byte_object_occupies_one_alignment_unit():
    state, _ = new_state()
    info = mount(state, "n1")
    publish(state, "empty", 0)
    assert used(state, info.segment_id) == CONFIG.alignment
    assert get(state, "empty").size == 0


def test_a_zero_byte_object_is_placed_whenever_some_node_has_room():
    state, _ = new_state(CONFIG)
    mount(state, "full", 64)
    publish(state, "filler", 1)  # "full" has no free byte left
    mount(state, "roomy", 1 * MiB)

    statuses = [put(state, f"empty{i}", 0).status for i in range(10)]

    assert statuses == [KeyStatus.OK] * 10


# ------------------------------------------------------------------ refusing puts


def test_no_space_when_no_segment_can_hold_the_object_says_how_much_there_is():
    state, _ = new_state()
    mount(state, "n1", 64 * KiB)
    mount(state, "n2", 32 * KiB)
    publish(state, "filler", 40 * KiB)  # only n1 can hold it

    slot = put(state, "big", 100 * KiB)

    assert slot.status is KeyStatus.NO_SPACE
    assert slot.replicas == ()
    assert "100.0 KiB (102400 bytes)" in slot.message, slot.message
    assert "largest free extent is 32.0 KiB (32768 bytes)" in slot.message, slot.message
    assert "56.0 KiB free of 96.0 KiB in 2 segments" in slot.message, slot.message
    assert state.snapshot().reservations == 0


def test_every_key_of_a_refused_batch_says_what_comes_free_found_once_per_batch(monkeypatch):
    # (finding what comes free walks every buffer waiting: once per key, a tenant's batch of
    # keys that cannot fit held the master's loop for seconds)
    state, _ = new_state()
    mount(state, "n1", 64 * KiB)
    publish(state, "read", 48 * KiB)
    assert get(state, "read", lease_ttl=10.0).status is KeyStatus.OK
    assert remove(state, "read", force=True) is KeyStatus.OK  # its space waits for the lease
    walks = []
    walk = state._coming_free
    monkeypatch.setattr(state, "_coming_free", lambda segments: walks.append(1) or walk(segments))

    slots = state.put_start("c", [f"big{i}" for i in range(100)], [100 * KiB] * 100)

    assert {slot.status for slot in slots} == {KeyStatus.NO_SPACE}
    assert all("48.0 KiB more comes free" in slot.message for slot in slots)
    assert len(walks) == 1


def test_no_space_says_how_much_comes_free_once_readers_leases_on_removed_objects_end():
    state, clock = new_state()
    mount(state, "n1", 64 * KiB)
    publish(state, "read", 48 * KiB)
    assert get(state, "read", lease_ttl=10.0).status is KeyStatus.OK
    assert remove(state, "read", force=True) is KeyStatus.OK  # its space waits for the lease
    clock.advance(2.0)
    assert state.heartbeat("n1", ["n1/dram0"]) == []

    slot = put(state, "big", 32 * KiB)

    assert slot.status is KeyStatus.NO_SPACE
    assert "48.0 KiB more comes free within 8.0 s" in slot.message, slot.message
    assert "retry then" in slot.message
    for _ in range(8):  # (the node heartbeats meanwhile)
        clock.advance(1.0)
        assert state.heartbeat("n1", ["n1/dram0"]) == []
    state.tick()
    assert put(state, "big", 32 * KiB).status is KeyStatus.OK


def test_no_space_without_any_segment_tells_the_user_to_start_a_storage_node():
    state, _ = new_state()

    slot = put(state, "k")

    assert slot.status is KeyStatus.NO_SPACE
    assert "no storage node has mounted a segment" in slot.message
    assert "kvpool node" in slot.message


def test_removing_an_object_makes_room_for_a_new_one():
    state, clock = new_state()
    mount(state, "n1", 8 * KiB)
    publish(state, "a", 8 * KiB)
    assert get(state, "a").status is KeyStatus.OK  # leased: it cannot be evicted
    assert put(state, "b", 8 * KiB).status is KeyStatus.NO_SPACE

    clock.advance(CONFIG.lease_ttl)
    assert remove(state, "a") is KeyStatus.OK

    assert put(state, "b", 8 * KiB).status is KeyStatus.OK


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("", "empty"),
        # (the master holds keys behind their tenant's prefix: its limit is STORED_KEY_BYTES)
        ("x" * (STORED_KEY_BYTES + 1), f"{STORED_KEY_BYTES + 1} bytes"),
        ("é" * 545, "1090 bytes"),  # 545 characters, but 1090 bytes of UTF-8
        ("bad\udc80", "UTF-8"),
    ],
)
def test_invalid_keys_are_refused(key, problem):
    state, _ = new_state()
    mount(state, "n1")

    slot = put(state, key)

    assert slot.status is KeyStatus.INVALID_KEY
    assert problem in slot.message
    assert state.snapshot().reservations == 0
    assert total_used(state) == 0


@pytest.mark.parametrize("key", ["k", "x" * MAX_KEY_BYTES, "é" * 512, "a/b c\n?"])
def test_keys_up_to_1024_bytes_of_utf8_are_accepted(key):
    state, _ = new_state()
    mount(state, "n1")
    assert put(state, key).status is KeyStatus.OK


@pytest.mark.parametrize("replicas", [-1, CONFIG.max_replicas + 1])
def test_a_bad_replica_count_is_an_invalid_argument_for_every_key(replicas):
    state, _ = new_state()
    mount(state, "n1")

    slots = state.put_start("c1", ["a", "b"], [1, 1], replicas)

    assert [s.status for s in slots] == [KeyStatus.INVALID_ARGUMENT] * 2
    assert f"between 1 and {CONFIG.max_replicas}" in slots[0].message
    assert total_used(state) == 0


def test_a_negative_size_is_an_invalid_argument():
    state, _ = new_state()
    mount(state, "n1")
    slot = put(state, "k", -1)
    assert slot.status is KeyStatus.INVALID_ARGUMENT
    assert "negative" in slot.message


def test_putting_a_published_key_again_is_already_exists():
    state, _ = new_state()
    mount(state, "n1")
    first = publish(state, "k")

    again = put(state, "k")

    assert again.status is KeyStatus.ALREADY_EXISTS
    assert "exists" in again.message
    assert get(state, "k").replicas == first.replicas, "the object is not overwritten"


def test_putting_a_reserved_key_again_is_already_exists():
    state, _ = new_state()
    mount(state, "n1")
    first = put(state, "k")

    again = put(state, "k", client="c2")

    assert again.status is KeyStatus.ALREADY_EXISTS
    assert "being written" in again.message and "this client" not in again.message
    assert commit(state, "k", first) is KeyStatus.OK, "the first writer is undisturbed"


def test_a_put_again_by_the_client_holding_the_reservation_is_told_it_is_its_own():
    """Most likely the same put, whose answer was lost (the call timed out while the master
    stalled): the refusal says no other put holds the key, and when it is free again."""
    state, clock = new_state()
    mount(state, "n1")
    first = put(state, "k")
    clock.advance(10.0)

    again = put(state, "k")

    assert again.status is KeyStatus.ALREADY_EXISTS
    assert "this client's own earlier put" in again.message
    left = state.config.reservation_timeout - 10.0
    assert f"within {left:.0f} s" in again.message, again.message
    assert commit(state, "k", first) is KeyStatus.OK, "the first put is undisturbed"


def test_a_put_again_of_a_key_its_client_committed_and_not_yet_published_is_told_so():
    """As when PutEnd's answer was lost: the object waits for its nodes, by this client."""
    state, _ = new_state()
    mount(state, "n1")
    first = put(state, "k")
    [waiting] = state.put_end([Commit("k", first.put_id, (True,), None)])
    assert waiting is None, "committed: the nodes are to record it"

    again = put(state, "k")

    assert again.status is KeyStatus.ALREADY_EXISTS
    assert "this client's own earlier put" in again.message and "committed" in again.message
    assert "is being written" in put(state, "k", client="c2").message


def test_callers_without_a_client_id_are_never_told_a_reservation_is_their_own():
    state, _ = new_state()
    mount(state, "n1")
    put(state, "k", client="")

    again = put(state, "k", client="")

    assert again.message.endswith(" is being written"), "no id: nobody to tell apart"


def test_a_batch_reports_each_key_on_its_own():
    state, _ = new_state()
    mount(state, "n1", 16 * KiB)
    publish(state, "old")

    slots = state.put_start("c1", ["new", "", "old", "new", "huge"], [1, 1, 1, 1, 1 * MiB])

    assert [s.status for s in slots] == [
        KeyStatus.OK,
        KeyStatus.INVALID_KEY,
        KeyStatus.ALREADY_EXISTS,
        KeyStatus.ALREADY_EXISTS,
        KeyStatus.NO_SPACE,
    ]


# ------------------------------------------------------------------ publishing


def test_readers_never_see_a_reserved_object():
    state, _ = new_state()
    mount(state, "n1")
    slot = put(state, "k", 100)

    assert get(state, "k").status is KeyStatus.NOT_READY
    assert get(state, "k").replicas == ()
    assert exists(state, "k") is KeyStatus.NOT_READY
    assert state.list_keys().keys == []
    assert state.snapshot().objects == 0
    assert state.snapshot().reservations == 1

    assert commit(state, "k", slot) is KeyStatus.OK

    location = get(state, "k")
    assert location.status is KeyStatus.OK
    assert location.size == 100
    assert location.replicas == slot.replicas
    assert exists(state, "k") is KeyStatus.OK
    assert state.list_keys().keys == ["k"]
    assert state.snapshot().objects == 1
    assert state.snapshot().reservations == 0


def test_put_end_with_a_wrong_put_id_is_stale_and_changes_nothing():
    state, _ = new_state()
    mount(state, "n1")
    slot = put(state, "k")

    statuses = end_puts(
        state, [Commit("k", slot.put_id + 1, (True,)), Commit("never-started", 1, (True,))]
    )

    assert statuses == [KeyStatus.STALE_PUT, KeyStatus.STALE_PUT]
    assert exists(state, "k") is KeyStatus.NOT_READY
    assert commit(state, "k", slot) is KeyStatus.OK


def test_put_end_reporting_the_wrong_number_of_replicas_is_an_invalid_argument():
    state, _ = new_state()
    mount(state, "n1")
    mount(state, "n2")
    slot = put(state, "k", replicas=2)

    assert commit(state, "k", slot, True) is KeyStatus.INVALID_ARGUMENT
    assert exists(state, "k") is KeyStatus.NOT_READY
    assert commit(state, "k", slot, True, True) is KeyStatus.OK


def test_put_end_with_every_replica_failed_is_no_replica_and_frees_the_space():
    state, _ = new_state()
    mount(state, "n1")
    mount(state, "n2")
    slot = put(state, "k", replicas=2)
    assert total_used(state) == 2 * 4 * KiB

    assert commit(state, "k", slot, False, False) is KeyStatus.NO_REPLICA

    assert total_used(state) == 0
    assert exists(state, "k") is KeyStatus.NOT_FOUND
    assert state.snapshot().reservations == 0
    assert put(state, "k").status is KeyStatus.OK, "the key is free again"


def test_put_end_with_one_replica_failed_publishes_the_other_and_frees_the_failed_one():
    state, _ = new_state()
    mount(state, "n1")
    mount(state, "n2")
    slot = put(state, "k", replicas=2)
    good, bad = slot.replicas

    assert commit(state, "k", slot, True, False) is KeyStatus.OK

    assert get(state, "k").replicas == (good,)
    assert used(state, good.segment.segment_id) == 4 * KiB
    assert used(state, bad.segment.segment_id) == 0


def test_a_retried_put_end_is_ok():
    state, _ = new_state()
    mount(state, "n1")
    slot = put(state, "k")
    assert commit(state, "k", slot) is KeyStatus.OK

    assert commit(state, "k", slot) is KeyStatus.OK

    assert get(state, "k").replicas == slot.replicas
    assert state.counters.puts_published == 1


def test_put_revoke_frees_the_space_and_the_key_at_once():
    state, _ = new_state()
    info = mount(state, "n1")
    slot = put(state, "k")
    assert used(state, info.segment_id) == 4 * KiB

    assert state.put_revoke(["k"], [slot.put_id]) == [KeyStatus.OK]

    assert used(state, info.segment_id) == 0
    assert exists(state, "k") is KeyStatus.NOT_FOUND
    assert commit(state, "k", slot) is KeyStatus.STALE_PUT
    assert put(state, "k").status is KeyStatus.OK


def test_put_revoke_of_someone_elses_or_a_published_put_is_stale():
    state, _ = new_state()
    mount(state, "n1")
    reserved = put(state, "reserved")
    published = publish(state, "published")

    statuses = state.put_revoke(
        ["reserved", "published", "missing"], [reserved.put_id + 100, published.put_id, 1]
    )

    assert statuses == [KeyStatus.STALE_PUT] * 3
    assert exists(state, "reserved") is KeyStatus.NOT_READY
    assert exists(state, "published") is KeyStatus.OK


def test_a_tenant_looks_up_its_keys_as_its_clients_name_them_and_no_one_elses():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "a/k")
    put(state, "a/pending")
    publish(state, "b/k")
    publish(state, "k")  # (a key without a tenant)

    found = state.exists(["k", "pending", "b/k", "missing"], grant_lease=False, tenant="a")

    assert found == [KeyStatus.OK, KeyStatus.NOT_READY, KeyStatus.NOT_FOUND, KeyStatus.NOT_FOUND]
    assert state.exists(["k"], grant_lease=False, tenant="c") == [KeyStatus.NOT_FOUND]
    assert state.exists(["k"], 5.0, tenant="b") == [KeyStatus.OK]
    assert state.stat("b/k").lease_remaining == pytest.approx(5.0)
    assert remove(state, "a/k", force=True) is KeyStatus.OK
    assert state.exists(["k"], grant_lease=False, tenant="a") == [KeyStatus.NOT_FOUND]
    state.validate()


# ------------------------------------------------------------------ reservation timeout


def test_an_uncommitted_reservation_times_out_key_first_space_later():
    state, clock = new_state()
    info = mount(state, "n1")
    slot = put(state, "k")

    clock.advance(CONFIG.reservation_timeout - 0.5)
    state.heartbeat("n1", [info.segment_id])
    state.client_heartbeat("c1")  # a live writer that just never commits
    assert state.tick().reservations_reclaimed == []
    assert exists(state, "k") is KeyStatus.NOT_READY

    clock.advance(0.5)
    state.heartbeat("n1", [info.segment_id])
    state.client_heartbeat("c1")
    report = state.tick()

    # The key is free at once ...
    assert report.reservations_reclaimed == ["k"]
    assert exists(state, "k") is KeyStatus.NOT_FOUND
    assert commit(state, "k", slot) is KeyStatus.STALE_PUT, "the slow writer lost its put"
    # ... but the space stays quarantined: the slow writer may still be copying into it.
    assert used(state, info.segment_id) == 4 * KiB
    assert state.snapshot().reservations == 0

    clock.advance(CONFIG.reclaim_delay - 0.5)
    state.heartbeat("n1", [info.segment_id])
    assert state.tick().buffers_released == 0
    assert used(state, info.segment_id) == 4 * KiB

    clock.advance(0.5)
    state.heartbeat("n1", [info.segment_id])
    assert state.tick().buffers_released == 1
    assert used(state, info.segment_id) == 0


def test_a_new_put_of_a_timed_out_key_gets_different_space():
    state, clock = new_state()
    info = mount(state, "n1")
    old = put(state, "k")
    clock.advance(CONFIG.reservation_timeout)
    state.heartbeat("n1", [info.segment_id])
    state.tick()

    new = put(state, "k")

    assert new.status is KeyStatus.OK
    assert new.put_id != old.put_id
    assert new.replicas[0].address != old.replicas[0].address


def test_only_reservations_older_than_the_timeout_are_reclaimed():
    state, clock = new_state()
    info = mount(state, "n1")
    put(state, "old")
    clock.advance(20)
    put(state, "young")
    clock.advance(CONFIG.reservation_timeout - 20)
    state.heartbeat("n1", [info.segment_id])

    assert state.tick().reservations_reclaimed == ["old"]
    assert exists(state, "young") is KeyStatus.NOT_READY


# ------------------------------------------------------------------ leases and removal


def test_get_replicas_grants_a_lease_of_the_default_ttl():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")

    locations, ttl = state.get_replicas(["k", "missing"])

    assert ttl == CONFIG.lease_ttl
    assert [loc.status for loc in locations] == [KeyStatus.OK, KeyStatus.NOT_FOUND]
    assert (state.counters.hits, state.counters.misses) == (1, 1)


@pytest.mark.parametrize(
    ("asked", "granted"),
    [(0.0, CONFIG.lease_ttl), (-5.0, CONFIG.lease_ttl), (3.0, 3.0), (1e9, CONFIG.max_lease_ttl)],
)
def test_a_requested_lease_is_granted_up_to_the_maximum(asked, granted):
    state, _ = new_state()
    assert state.get_replicas([], asked)[1] == granted


def test_a_leased_object_cannot_be_removed_until_the_lease_ends():
    state, clock = new_state()
    info = mount(state, "n1")
    publish(state, "k")
    get(state, "k", lease_ttl=10)

    assert remove(state, "k") is KeyStatus.HAS_LEASE
    assert get(state, "k", lease_ttl=1).status is KeyStatus.OK, "a shorter lease does not shorten"

    clock.advance(9)
    assert remove(state, "k") is KeyStatus.HAS_LEASE
    clock.advance(1)  # the lease ends exactly now
    assert remove(state, "k") is KeyStatus.OK
    assert used(state, info.segment_id) == 0, "no reader left: the space returns at once"


def test_a_later_read_extends_the_lease():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k")
    get(state, "k", lease_ttl=10)
    clock.advance(8)
    get(state, "k", lease_ttl=10)
    clock.advance(8)
    assert remove(state, "k") is KeyStatus.HAS_LEASE


def test_force_remove_of_a_leased_object_keeps_its_space_until_the_lease_ends():
    state, clock = new_state()
    info = mount(state, "n1")
    publish(state, "k", 8 * KiB)
    get(state, "k", lease_ttl=10)

    assert remove(state, "k", force=True) is KeyStatus.OK

    assert get(state, "k").status is KeyStatus.NOT_FOUND
    assert usage(state, info.segment_id).objects == 0
    assert used(state, info.segment_id) == 8 * KiB, "a reader may still be copying out"
    clock.advance(9)
    state.heartbeat("n1", [info.segment_id])
    state.tick()
    assert used(state, info.segment_id) == 8 * KiB
    clock.advance(1)
    state.heartbeat("n1", [info.segment_id])
    assert state.tick().buffers_released == 1
    assert used(state, info.segment_id) == 0


def test_removing_a_missing_key_is_not_found():
    state, _ = new_state()
    assert remove(state, "missing") is KeyStatus.NOT_FOUND
    assert remove(state, "missing", force=True) is KeyStatus.NOT_FOUND


def test_a_reserved_key_is_only_removed_by_force_and_its_space_is_quarantined():
    state, clock = new_state()
    info = mount(state, "n1")
    slot = put(state, "k")

    assert remove(state, "k") is KeyStatus.NOT_READY
    assert exists(state, "k") is KeyStatus.NOT_READY

    assert remove(state, "k", force=True) is KeyStatus.OK
    assert exists(state, "k") is KeyStatus.NOT_FOUND
    assert commit(state, "k", slot) is KeyStatus.STALE_PUT
    assert used(state, info.segment_id) == 4 * KiB, "the writer may still be copying in"
    clock.advance(CONFIG.reclaim_delay)
    state.heartbeat("n1", [info.segment_id])
    state.tick()
    assert used(state, info.segment_id) == 0


def test_remove_reports_each_key_of_a_batch():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "a")
    publish(state, "leased")
    put(state, "reserved")
    get(state, "leased")

    statuses = state.remove(["a", "missing", "leased", "reserved"])

    assert statuses == [
        KeyStatus.OK,
        KeyStatus.NOT_FOUND,
        KeyStatus.HAS_LEASE,
        KeyStatus.NOT_READY,
    ]
    assert state.counters.objects_removed == 1


# ------------------------------------------------------------------ node liveness


def test_a_dead_nodes_objects_are_lost_unless_another_node_holds_a_replica():
    state, clock = new_state()
    b = mount(state, "b", 64 * KiB)
    publish(state, "only-on-b")  # the only node yet
    a = mount(state, "a", 1 * MiB)
    publish(state, "only-on-a", 128 * KiB)  # too large for b
    publish(state, "on-both", replicas=2)
    assert nodes_of(get(state, "only-on-a")) == ["a"]
    assert nodes_of(get(state, "only-on-b")) == ["b"]
    assert sorted(nodes_of(get(state, "on-both"))) == ["a", "b"]

    clock.advance(CONFIG.node_ttl + 0.1)
    state.heartbeat("b", [b.segment_id])  # a stays silent
    report = state.tick()

    assert report.dead_nodes == ["a"]
    assert report.objects_lost == 1
    assert get(state, "only-on-a").status is KeyStatus.NOT_FOUND
    survivor = get(state, "on-both")
    assert survivor.status is KeyStatus.OK
    assert nodes_of(survivor) == ["b"]
    assert get(state, "only-on-b").status is KeyStatus.OK
    snapshot = state.snapshot()
    assert snapshot.nodes == 1
    assert [u.info.segment_id for u in snapshot.segments] == [b.segment_id]
    assert snapshot.objects == 2
    assert a.segment_id not in {u.info.segment_id for u in snapshot.segments}
    assert state.counters.nodes_died == 1


def test_a_node_is_declared_dead_only_after_node_ttl_of_silence():
    state, clock = new_state()
    mount(state, "n1")
    clock.advance(CONFIG.node_ttl)
    assert state.tick().dead_nodes == []
    clock.advance(0.001)
    assert state.tick().dead_nodes == ["n1"]
    assert state.snapshot().nodes == 0


def test_heartbeats_keep_a_node_alive():
    state, clock = new_state()
    info = mount(state, "n1")
    publish(state, "k")
    for _ in range(20):
        clock.advance(CONFIG.node_ttl * 0.9)
        assert state.heartbeat("n1", [info.segment_id]) == []
        assert state.tick().dead_nodes == []
    assert get(state, "k").status is KeyStatus.OK


def test_a_heartbeat_from_an_unknown_node_asks_it_to_remount_every_segment():
    state, _ = new_state()
    assert state.heartbeat("stranger", ["s0", "s1"]) == ["s0", "s1"]
    assert state.snapshot().nodes == 0, "a heartbeat alone does not make a node"


def test_a_heartbeat_asks_a_known_node_to_remount_only_what_the_master_lacks():
    state, _ = new_state()
    info = mount(state, "n1")
    assert state.heartbeat("n1", [info.segment_id, "n1/new"]) == ["n1/new"]


def test_a_node_declared_dead_is_asked_to_remount_when_it_comes_back():
    state, clock = new_state()
    info = mount(state, "n1")
    publish(state, "k")
    clock.advance(CONFIG.node_ttl + 1)
    state.tick()

    assert state.heartbeat("n1", [info.segment_id]) == [info.segment_id]
    state.mount_segment(info)

    assert state.snapshot().nodes == 1
    assert get(state, "k").status is KeyStatus.NOT_FOUND, "the index forgot what the node held"
    assert used(state, info.segment_id) == 0
    assert put(state, "k").status is KeyStatus.OK


def test_a_reservation_that_loses_one_replica_publishes_the_surviving_one():
    state, clock = new_state()
    a = mount(state, "a")
    b = mount(state, "b")
    slot = put(state, "k", replicas=2)
    [on_b] = [r for r in slot.replicas if r.segment.node_id == "b"]

    clock.advance(CONFIG.node_ttl + 1)
    state.heartbeat("b", [b.segment_id])
    assert state.tick().objects_lost == 0
    assert exists(state, "k") is KeyStatus.NOT_READY

    assert commit(state, "k", slot, True, True) is KeyStatus.OK
    assert get(state, "k").replicas == (on_b,)
    assert a.segment_id not in {u.info.segment_id for u in state.snapshot().segments}


def test_a_reservation_that_loses_every_replica_is_gone():
    state, clock = new_state()
    mount(state, "a")
    slot = put(state, "k")

    clock.advance(CONFIG.node_ttl + 1)
    state.tick()

    assert exists(state, "k") is KeyStatus.NOT_FOUND
    assert state.snapshot().reservations == 0
    assert commit(state, "k", slot) is KeyStatus.STALE_PUT


def test_unmounting_a_segment_drops_its_objects():
    state, _ = new_state()
    mount(state, "n1", segment="n1/dram0")
    mount(state, "n1", 64 * KiB, segment="n1/dram1")
    publish(state, "k")
    assert segments_of(get(state, "k")) == ["n1/dram0"]

    # one object gone; the reader leased it just now, so the node keeps the memory that long
    assert state.unmount_segment("n1", "n1/dram0") == (1, CONFIG.lease_ttl)

    assert get(state, "k").status is KeyStatus.NOT_FOUND
    assert [u.info.segment_id for u in state.snapshot().segments] == ["n1/dram1"]
    assert state.snapshot().nodes == 1

    assert state.unmount_segment("n1", "n1/dram1") == (0, 0.0)
    assert state.snapshot().nodes == 0, "a node without segments is forgotten"


def test_unmount_by_another_node_or_of_an_unknown_segment_changes_nothing():
    state, _ = new_state()
    info = mount(state, "n1")
    publish(state, "k")

    assert state.unmount_segment("n2", info.segment_id) == (0, 0.0)
    assert state.unmount_segment("n1", "unknown") == (0, 0.0)

    assert get(state, "k").status is KeyStatus.OK


# ------------------------------------------------------------------ listing and snapshot


def test_list_keys_returns_published_keys_with_a_prefix_in_order_with_sizes():
    state, _ = new_state()
    mount(state, "n1")
    for key, size in [("b/2", 20), ("a/1", 10), ("b/1", 30), ("c", 40), ("b", 50)]:
        publish(state, key, size)
    put(state, "b/reserved")

    page = state.list_keys(prefix="b/")

    assert page.keys == ["b/1", "b/2"]
    assert page.sizes == [30, 20]
    assert page.next_start_after == ""
    assert state.list_keys().keys == ["a/1", "b", "b/1", "b/2", "c"]
    assert state.list_keys(prefix="zzz").keys == []


def test_list_keys_pages_through_every_key_exactly_once():
    state, _ = new_state()
    mount(state, "n1", 4 * MiB)
    wanted = sorted(f"doc/{i:03d}" for i in range(47))
    for key in [*wanted, "do", "doc", "dob/1", "doz/1"]:
        publish(state, key, 1)

    seen: list[str] = []
    start_after = ""
    pages = 0
    while True:
        page = state.list_keys(prefix="doc/", limit=10, start_after=start_after)
        pages += 1
        assert len(page.keys) <= 10
        seen += page.keys
        if not page.next_start_after:
            break
        assert page.next_start_after == page.keys[-1]
        start_after = page.next_start_after

    assert seen == wanted
    assert pages == 5


def test_list_keys_says_there_is_no_next_page_when_a_page_ends_exactly_at_the_last_key():
    state, _ = new_state()
    mount(state, "n1")
    for key in ("p1", "p2", "p3", "q"):
        publish(state, key, 1)
    first = state.list_keys(prefix="p", limit=3)
    assert first.keys == ["p1", "p2", "p3"]
    assert first.next_start_after == ""


def test_list_keys_uses_the_configured_page_size_by_default():
    state, _ = new_state(MasterConfig(list_page_size=2))
    mount(state, "n1")
    for key in ("a", "b", "c"):
        publish(state, key, 1)
    page = state.list_keys()
    assert page.keys == ["a", "b"]
    assert page.next_start_after == "b"
    assert state.list_keys(start_after="b").keys == ["c"]


def test_snapshot_counts_objects_reservations_nodes_and_usage():
    state, _ = new_state()
    mount(state, "n1", 64 * KiB)
    mount(state, "n2", 64 * KiB)
    mount(state, "n2", 16 * KiB, segment="n2/dram1")
    publish(state, "p1", 1000, replicas=2)
    publish(state, "p2", 1000)
    put(state, "r1", 100)

    snapshot = state.snapshot()

    assert (snapshot.objects, snapshot.reservations, snapshot.nodes) == (2, 1, 2)
    assert len(snapshot.segments) == 3
    assert sum(u.objects for u in snapshot.segments) == 4  # buffers: 2 + 1 + 1
    assert sum(u.used for u in snapshot.segments) == 3 * rounded(1000) + rounded(100)
    assert sum(u.capacity for u in snapshot.segments) == 144 * KiB
    for u in snapshot.segments:
        assert u.largest_free == u.capacity - u.used  # nothing freed yet: no holes


# ------------------------------------------------------------------ deferred frees and remounts


def test_a_deferred_free_never_lands_in_a_remounted_segment_with_the_same_id():
    state, clock = new_state()
    info = mount(state, "n1", 64 * KiB)

    # Two buffers wait for a deferred free: a force-removed, leased object (until the lease
    # ends) and a timed-out reservation (until the reclaim delay has passed).
    publish(state, "leased", 8 * KiB)
    get(state, "leased", lease_ttl=CONFIG.max_lease_ttl)
    assert remove(state, "leased", force=True) is KeyStatus.OK
    put(state, "abandoned", 8 * KiB)
    clock.advance(CONFIG.reservation_timeout)
    state.heartbeat("n1", [info.segment_id])
    assert state.tick().reservations_reclaimed == ["abandoned"]
    assert used(state, info.segment_id) == 16 * KiB

    # The node goes silent and is declared dead, then comes back with the very same segment.
    clock.advance(CONFIG.node_ttl + 1)
    assert state.tick().dead_nodes == ["n1"]
    state.mount_segment(info)
    assert used(state, info.segment_id) == 0
    # New objects now occupy the same offsets the old buffers had.
    fresh = [publish(state, f"fresh{i}", 8 * KiB) for i in range(3)]
    assert used(state, info.segment_id) == 24 * KiB
    allocations_before = state.segments[info.segment_id].allocator.allocations()

    # Let every old deferred free come due.
    clock.advance(CONFIG.max_lease_ttl + CONFIG.reclaim_delay)
    state.heartbeat("n1", [info.segment_id])
    report = state.tick()

    assert report.dead_nodes == []
    assert report.buffers_released == 0
    assert used(state, info.segment_id) == 24 * KiB
    assert state.segments[info.segment_id].allocator.allocations() == allocations_before
    for i, slot in enumerate(fresh):
        assert get(state, f"fresh{i}").replicas == slot.replicas
    # And the new segment's space is still handed out without overlap.
    more = publish(state, "more", 8 * KiB)
    assert more.replicas[0].address not in {s.replicas[0].address for s in fresh}


def test_a_deferred_free_of_an_unmounted_then_remounted_segment_is_dropped():
    state, clock = new_state()
    info = mount(state, "n1", 16 * KiB)
    publish(state, "leased", 8 * KiB)
    get(state, "leased", lease_ttl=10)
    remove(state, "leased", force=True)

    state.unmount_segment("n1", info.segment_id)
    state.mount_segment(info)
    publish(state, "fresh", 8 * KiB)

    clock.advance(10)
    state.heartbeat("n1", [info.segment_id])
    assert state.tick().buffers_released == 0
    assert used(state, info.segment_id) == 8 * KiB
    assert get(state, "fresh").status is KeyStatus.OK


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "bad",
    [
        {"lease_ttl": 0},
        {"reservation_timeout": -1},
        {"node_ttl": 0},
        {"reclaim_delay": -0.1},
        {"default_replicas": 0},
        {"default_replicas": 9},
        {"placement": "round-robin"},
    ],
)
def test_master_config_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        MasterConfig(**bad)


# ------------------------------------------------------------------ properties


class MasterStateMachine(RuleBasedStateMachine):
    """Random sequences of events never break the bookkeeping of objects, buffers and space."""

    CONFIG = CONFIG
    NODES = ("a", "b", "c")
    SEGMENTS = ("s0", "s1", "s2", "s3", "s4")
    KEYS = "pqrstu"

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.state = MasterState(self.CONFIG, clock=self.clock, rng=random.Random(0))
        self.slots: dict[str, PutSlot] = {}  # key -> its latest successful put_start

    def heartbeat_all(self, except_node: str | None = None) -> None:
        for node, record in list(self.state.nodes.items()):
            if node != except_node:
                self.state.heartbeat(node, sorted(record.segment_ids))

    # -- events

    @initialize()
    def start_cluster(self):
        for i, node in enumerate(self.NODES):
            self.state.mount_segment(segment_info(node, 4096, self.SEGMENTS[i]))

    @rule(
        node=st.sampled_from(NODES),
        segment=st.sampled_from(SEGMENTS),
        size=st.sampled_from([0, 1024, 4096, 16384]),
    )
    def mount(self, node, segment, size):
        # Segment ids are shared between nodes, so a segment may also move to another node;
        # the same node, id and size is an identical remount.
        self.state.mount_segment(segment_info(node, size, segment))

    @rule(node=st.sampled_from(NODES), segment=st.sampled_from(SEGMENTS))
    def unmount(self, node, segment):
        self.state.unmount_segment(node, segment)

    @rule(key=st.sampled_from(KEYS), size=st.integers(0, 1500), replicas=st.integers(0, 4))
    def put_start(self, key, size, replicas):
        slot = put(self.state, key, size, replicas)
        if slot.status is KeyStatus.OK:
            assert len(set(nodes_of(slot))) == len(slot.replicas) >= 1
            self.slots[key] = slot

    @precondition(lambda self: self.slots)
    @rule(data=st.data())
    def put_end(self, data):
        key = data.draw(st.sampled_from(sorted(self.slots)))
        slot = self.slots[key]
        ok = data.draw(st.lists(st.booleans(), min_size=len(slot.replicas)))
        ok = ok[: len(slot.replicas)]
        [status] = end_puts(self.state, [Commit(key, slot.put_id, tuple(ok))])
        assert status in {KeyStatus.OK, KeyStatus.NO_REPLICA, KeyStatus.STALE_PUT}
        if status is KeyStatus.OK:
            assert exists(self.state, key) is KeyStatus.OK

    @precondition(lambda self: self.slots)
    @rule(data=st.data())
    def put_revoke(self, data):
        key = data.draw(st.sampled_from(sorted(self.slots)))
        self.state.put_revoke([key], [self.slots[key].put_id])

    @rule(key=st.sampled_from(KEYS), ttl=st.sampled_from([0.0, 1.0, 100.0]))
    def read(self, key, ttl):
        location = get(self.state, key, ttl)
        if location.status is KeyStatus.OK:
            assert len(set(nodes_of(location))) == len(location.replicas) >= 1

    @rule(key=st.sampled_from(KEYS), force=st.booleans())
    def remove(self, key, force):
        status = remove(self.state, key, force)
        if status is KeyStatus.OK:
            assert exists(self.state, key) is KeyStatus.NOT_FOUND

    @rule(seconds=st.sampled_from([0.5, 5.0, 20.0, 40.0]))
    def time_passes(self, seconds):
        self.clock.advance(seconds)
        self.heartbeat_all()
        self.state.tick()

    @rule(node=st.sampled_from(NODES))
    def node_goes_silent(self, node):
        self.clock.advance(self.CONFIG.node_ttl + 1)
        self.heartbeat_all(except_node=node)
        report = self.state.tick()
        assert set(report.dead_nodes) <= {node}, "only the silent node dies"
        assert node not in self.state.nodes

    @rule()
    def settle(self):
        """Long enough for every lease, reservation and quarantine to end: no space leaks."""
        for _ in range(2):
            self.clock.advance(self.CONFIG.max_lease_ttl + self.CONFIG.reservation_timeout)
            self.heartbeat_all()
            self.state.tick()
        assert self.state.snapshot().reservations == 0
        for segment in self.state.segments.values():
            owned = {offset: segment.allocator.size_of(offset) for offset in segment.owners}
            assert segment.allocator.allocations() == owned, f"{segment.segment_id} leaks"

    # -- what always holds

    @invariant()
    def objects_and_buffers_agree(self):
        state = self.state
        for key, record in state.objects.items():
            live = [r for r in record.replicas if r is not None]
            assert live, f"{key} has no replica left"
            nodes = [state.segments[r.segment_id].node_id for r in live]
            assert len(set(nodes)) == len(nodes), f"{key} has two replicas on one node"
            for replica in live:
                segment = state.segments[replica.segment_id]
                assert segment.owners.get(replica.offset) == key
                assert segment.allocator.size_of(replica.offset) >= record.size
        for segment in state.segments.values():
            assert segment.segment_id in state.nodes[segment.node_id].segment_ids
            allocations = segment.allocator.allocations()
            for offset, key in segment.owners.items():
                assert offset in allocations
                assert any(
                    r is not None and (r.segment_id, r.offset) == (segment.segment_id, offset)
                    for r in state.objects[key].replicas
                )
            assert segment.allocator.used == sum(allocations.values())
        for node in state.nodes.values():
            assert all(state.segments[s].node_id == node.node_id for s in node.segment_ids)

    @invariant()
    def counts_agree(self):
        snapshot = self.state.snapshot()
        assert snapshot.objects + snapshot.reservations == len(self.state.objects)
        published = [
            k for k, r in self.state.objects.items() if exists(self.state, k) is KeyStatus.OK
        ]
        assert sorted(published) == self.state.list_keys().keys
        assert snapshot.nodes == len(self.state.nodes)


class MostFreeMasterStateMachine(MasterStateMachine):
    CONFIG = MOST_FREE


MACHINE_SETTINGS = settings(
    max_examples=100, stateful_step_count=50, derandomize=True, deadline=None
)
MasterStateMachine.TestCase.settings = MACHINE_SETTINGS
MostFreeMasterStateMachine.TestCase.settings = MACHINE_SETTINGS
test_master_state_machine_with_random_placement = MasterStateMachine.TestCase
test_master_state_machine_with_most_free_placement = MostFreeMasterStateMachine.TestCase
