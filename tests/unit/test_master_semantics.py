"""Specification of the master's rules for leases, eviction, placement, writers, integrity,
node liveness, batches, listing and removal (``master/state.py``).

Each test is one rule, spelled against ``MasterState`` with a fake clock: time passes only when
a test says so, and what is due (timeouts, ended leases and pins, dead nodes and clients,
eviction above the watermark) happens only when the master ticks. ``pass_time`` does both the
way a healthy cluster would: every mounted node keeps heartbeating, then the master ticks.

The production defaults (``MasterConfig()``) are the vocabulary: a lease of 10 s (600 s at
most), a high watermark of 90 % with 5 % evicted below it, a client TTL of 10 s, a reservation
timeout of 30 s and a reclaim delay of 60 s, a node TTL of 5 s.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from state_helpers import (
    CONFIG,
    MOST_FREE,
    FakeClock,
    KiB,
    MiB,
    commit,
    exists,
    get,
    mount,
    new_state,
    nodes_of,
    publish,
    put,
    remove,
    used,
)

from kvpool.common.status import KeyStatus, Pin
from kvpool.master.records import PrefixRemoval, PutOptions, StoredObject, TickReport
from kvpool.master.state import MAX_REMOVAL_PAGE, MasterState

OK = KeyStatus.OK

# ------------------------------------------------------------------ helpers


def pass_time(
    state: MasterState, clock: FakeClock, seconds: float, *, clients: tuple[str, ...] = ()
) -> TickReport:
    """``seconds`` pass in a healthy cluster: every mounted node heartbeats (and so do
    ``clients``), then the master ticks."""
    clock.advance(seconds)
    for node_id, node in list(state.nodes.items()):
        state.heartbeat(node_id, sorted(node.segment_ids))
    for client in clients:
        state.client_heartbeat(client)
    return state.tick()


def published(state: MasterState) -> set[str]:
    """Every readable key (without granting a lease or touching recency)."""
    return set(state.list_keys(limit=100_000).keys)


def on(*hosts: str, pin: Pin = Pin.NONE, pin_ttl: float = 0.0) -> PutOptions:
    """Put options that place the first replica on a node of one of ``hosts``."""
    return PutOptions(preferred_hosts=hosts, pin=pin, pin_ttl=pin_ttl)


def host(node: str) -> str:
    return f"{node}.cluster.local"  # what state_helpers.segment_info says


SOFT = PutOptions(pin=Pin.SOFT, pin_ttl=1000.0)
HARD = PutOptions(pin=Pin.HARD)

# The eviction tests use one segment of 100 KiB: it passes the 90 % watermark above 92 KiB and
# eviction brings it back to 85 KiB (85 %).
SEGMENT = 100 * KiB
LOW = (CONFIG.high_watermark - CONFIG.eviction_ratio) * SEGMENT


def fill(
    state: MasterState, prefix: str, count: int, size: int, options: PutOptions | None = None
) -> list[str]:
    keys = [f"{prefix}{i:02d}" for i in range(count)]
    for key in keys:
        publish(state, key, size, options=options)
    return keys


# ------------------------------------------------------------------ leases


def test_get_replicas_grants_a_lease_of_the_configured_default():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")

    [location], ttl = state.get_replicas(["k"])

    assert location.status is OK
    assert ttl == CONFIG.lease_ttl
    assert state.stat("k").lease_remaining == CONFIG.lease_ttl


def test_exists_grants_a_lease_of_the_configured_default():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")

    assert state.exists(["k"]) == [OK]

    assert state.stat("k").lease_remaining == CONFIG.lease_ttl


@pytest.mark.parametrize("read", ["get_replicas", "exists"])
@pytest.mark.parametrize(
    ("asked", "granted"),
    [
        (0.0, CONFIG.lease_ttl),  # not asked: the default
        (-1.0, CONFIG.lease_ttl),
        (3.0, 3.0),
        (120.0, 120.0),  # longer than the default is fine...
        (CONFIG.max_lease_ttl, CONFIG.max_lease_ttl),
        (1e9, CONFIG.max_lease_ttl),  # ...up to the maximum
    ],
)
def test_a_lease_asked_for_is_granted_up_to_max_lease_ttl(read, asked, granted):
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")

    if read == "get_replicas":
        assert state.get_replicas(["k"], asked)[1] == granted
    else:
        assert state.exists(["k"], asked) == [OK]

    assert state.stat("k").lease_remaining == granted


def test_exists_without_a_lease_grants_none():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")

    assert state.exists(["k", "missing"], 60.0, grant_lease=False) == [OK, KeyStatus.NOT_FOUND]

    assert state.stat("k").lease_remaining == 0.0
    assert remove(state, "k") is OK, "nothing protects it"


def test_a_leased_object_is_not_removed_unless_forced():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "read")
    publish(state, "checked")
    get(state, "read")
    exists(state, "checked")

    assert state.remove(["read", "checked"]) == [KeyStatus.HAS_LEASE] * 2
    assert state.stat("read").status is OK
    assert state.stat("checked").status is OK

    assert state.remove(["read", "checked"], force=True) == [OK, OK]
    assert state.stat("read").status is KeyStatus.NOT_FOUND
    assert exists(state, "checked") is KeyStatus.NOT_FOUND


def test_after_a_force_remove_the_space_is_not_reused_until_the_lease_ends():
    state, clock = new_state()
    info = mount(state, "n1", 8 * KiB)
    old = publish(state, "old", 8 * KiB)
    get(state, "old", lease_ttl=20)

    assert remove(state, "old", force=True) is OK

    assert put(state, "new", 8 * KiB).status is KeyStatus.NO_SPACE, "a reader may be copying"
    assert pass_time(state, clock, 19.5).buffers_released == 0
    assert put(state, "new", 8 * KiB).status is KeyStatus.NO_SPACE
    assert used(state, info.segment_id) == 8 * KiB

    assert pass_time(state, clock, 0.5).buffers_released == 1  # the lease ended
    new = put(state, "new", 8 * KiB)
    assert new.status is OK
    assert new.replicas[0].address == old.replicas[0].address


def test_reading_again_extends_the_lease_and_a_shorter_one_never_shortens_it():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k")
    get(state, "k", lease_ttl=10)

    clock.advance(6)
    assert exists(state, "k", lease_ttl=10) is OK  # renewed: now ends 10 s from here
    assert state.stat("k").lease_remaining == 10

    clock.advance(6)  # past the first lease, within the renewed one
    assert remove(state, "k") is KeyStatus.HAS_LEASE
    assert get(state, "k", lease_ttl=1).status is OK
    assert state.stat("k").lease_remaining == 4, "a shorter lease does not shorten it"

    clock.advance(4)
    assert remove(state, "k") is OK


def test_lease_expiries_counts_leases_that_ran_out_once_a_tick_sees_them_not_extensions():
    state, clock = new_state()
    mount(state, "n1")
    for key in ("a", "b", "c"):
        publish(state, key)
    get(state, "a", lease_ttl=10)
    exists(state, "b", lease_ttl=10)
    state.exists(["c"], grant_lease=False)

    assert pass_time(state, clock, 5) is not None
    assert state.counters.lease_expiries == 0
    get(state, "a", lease_ttl=10)  # extends a's lease to 15 s from the start

    clock.advance(5)
    assert state.counters.lease_expiries == 0, "counted by a tick, not by the clock"
    pass_time(state, clock, 0)
    assert state.counters.lease_expiries == 1  # b's; a's was extended

    pass_time(state, clock, 5)
    assert state.counters.lease_expiries == 2  # a's, once, extension included

    pass_time(state, clock, 100)
    assert state.counters.lease_expiries == 2


def test_a_lease_that_ran_out_is_counted_at_the_next_tick_even_if_the_object_was_read_again():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k")
    get(state, "k", lease_ttl=10)

    clock.advance(12)  # the lease ran out at 10 s; no tick since
    get(state, "k", lease_ttl=10)  # a new lease, not an extension
    pass_time(state, clock, 0)

    assert state.counters.lease_expiries == 1


def test_a_lease_that_ran_out_is_counted_even_if_the_object_was_removed_before_the_tick():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k")
    get(state, "k", lease_ttl=10)

    clock.advance(12)  # the lease ran out at 10 s; no tick since
    assert remove(state, "k") is OK
    pass_time(state, clock, 0)

    assert state.counters.lease_expiries == 1


def test_a_lease_that_ran_out_is_counted_once_though_a_replica_is_adopted_before_the_tick():
    """A node restarted and reported a replica of a leased object after its lease ran out,
    before a tick counted it: the adoption holds the object for one lease TTL, which must
    not revive the old lease (a read then starts a new one, counted on its own)."""
    state, clock = new_state()
    mount(state, "n1")
    n2 = mount(state, "n2")
    publish(state, "k", replicas=2)
    [held] = [r for r in state.objects["k"].replicas if r and r.segment_id == n2.segment_id]
    get(state, "k", lease_ttl=10)

    clock.advance(12)  # the lease ran out at 10 s; no tick since
    restarted = replace(n2, base_address=n2.base_address + 64 * MiB)  # (a new mapping)
    reported = StoredObject("k", held.offset, 4 * KiB, state.objects["k"].put_id)
    assert state.mount_segment(restarted, [reported]) == []
    assert state.counters.lease_expiries == 1
    get(state, "k", lease_ttl=10)  # a new lease
    pass_time(state, clock, 100)

    assert state.counters.lease_expiries == 2
    assert sorted(nodes_of(get(state, "k"))) == ["n1", "n2"]


# ------------------------------------------------------------------ eviction


def test_above_the_high_watermark_a_tick_evicts_lru_objects_down_to_the_eviction_ratio():
    state, clock = new_state()
    info = mount(state, "n1", SEGMENT)
    keys = fill(state, "k", 17, 5 * KiB)  # 85 %
    assert pass_time(state, clock, 1).objects_evicted == 0, "below the watermark"

    keys += fill(state, "x", 2, 5 * KiB)  # 95 %: above it
    report = pass_time(state, clock, 1)

    assert report.objects_evicted == 2
    assert state.counters.evictions == 2
    assert published(state) == set(keys[2:]), "the two least recently used went"
    assert used(state, info.segment_id) == 85 * KiB
    assert used(state, info.segment_id) <= LOW
    assert pass_time(state, clock, 1).objects_evicted == 0, "back below: nothing more"


def test_an_eviction_pass_reports_what_took_the_segment_space():
    """The log of a pass says how much of the segment was published objects, and how much
    was space that no eviction frees (removed objects waiting out their readers' leases)."""
    state, clock = new_state()
    info = mount(state, "n1", SEGMENT)
    fill(state, "k", 17, 5 * KiB)  # 85 %
    get(state, "k16", lease_ttl=5)
    assert remove(state, "k16", force=True) == OK  # its space waits for the lease
    fill(state, "x", 2, 5 * KiB)  # 95 %

    [space] = pass_time(state, clock, 1).passes_started

    assert space["segment"] == info.segment_id
    assert space["used"] == 95 * KiB
    assert space["published"] == 90 * KiB
    assert space["awaiting_release"] == 5 * KiB
    assert pass_time(state, clock, 1).passes_started == [], "one report per pass"


def test_reads_refresh_recency():
    state, clock = new_state()
    mount(state, "n1", SEGMENT)
    keys = fill(state, "k", 19, 5 * KiB)  # 95 %
    exists(state, "k00", lease_ttl=1)
    get(state, "k01", lease_ttl=1)

    report = pass_time(state, clock, 2)  # both leases are over: only recency is left

    assert report.objects_evicted == 2
    assert published(state) == set(keys) - {"k02", "k03"}


def test_a_leased_object_is_never_evicted_even_when_least_recently_used():
    state, clock = new_state()
    mount(state, "n1", SEGMENT)
    keys = fill(state, "k", 19, 5 * KiB)  # 95 %
    get(state, "k00", lease_ttl=100)
    exists(state, "k01", lease_ttl=100)
    for key in keys[2:]:
        get(state, key, lease_ttl=1)  # more recent than k00 and k01, and soon unleased

    report = pass_time(state, clock, 2)

    assert report.objects_evicted == 2
    assert published(state) == set(keys) - {"k02", "k03"}


def test_an_unpublished_reservation_is_never_evicted():
    state, clock = new_state()
    mount(state, "n1", SEGMENT)
    slots = {f"r{i:02d}": put(state, f"r{i:02d}", 5 * KiB, client="w") for i in range(19)}
    assert all(slot.status is OK for slot in slots.values())

    report = pass_time(state, clock, 1, clients=("w",))  # 95 %, all of it reserved

    assert report.objects_evicted == 0
    assert state.snapshot().reservations == 19
    for key in list(slots)[10:]:
        state.put_revoke([key], [slots.pop(key).put_id])
    keys = fill(state, "k", 9, 5 * KiB)  # 95 % again: 10 reservations, 9 objects
    report = pass_time(state, clock, 1, clients=("w",))

    assert report.objects_evicted == 2
    assert published(state) == set(keys[2:])
    assert all(commit(state, key, slot) is OK for key, slot in slots.items())


def test_soft_pinned_objects_are_evicted_only_after_every_unpinned_one():
    state, clock = new_state()
    mount(state, "n1", SEGMENT)
    pinned = fill(state, "s", 10, 5 * KiB, SOFT)  # the least recently used
    unpinned = fill(state, "u", 9, 5 * KiB)  # 95 %

    report = pass_time(state, clock, 1)

    assert report.objects_evicted == 2
    assert published(state) == set(pinned) | set(unpinned[2:])


def test_soft_pinned_objects_go_in_lru_order_once_no_unpinned_one_may_go():
    state, clock = new_state()
    mount(state, "n1", SEGMENT)
    pinned = fill(state, "s", 10, 5 * KiB, SOFT)
    unpinned = fill(state, "u", 9, 5 * KiB)  # 95 %
    state.get_replicas(unpinned, 100)  # leased: they may not go

    report = pass_time(state, clock, 1)

    assert report.objects_evicted == 2
    assert published(state) == set(pinned[2:]) | set(unpinned)


@pytest.mark.parametrize(
    ("elapsed", "evicted"),
    [(4.0, "pinned-long"), (5.0, "pinned-short")],
    ids=["short-pin-still-on", "short-pin-ended"],
)
def test_an_ended_soft_pin_makes_the_object_an_ordinary_candidate(elapsed, evicted):
    state, clock = new_state()
    mount(state, "n1", SEGMENT)
    publish(state, "pinned-long", 10 * KiB, options=SOFT)  # the least recently used
    publish(state, "pinned-short", 10 * KiB, options=PutOptions(pin=Pin.SOFT, pin_ttl=5))
    others = fill(state, "u", 7, 10 * KiB) + fill(state, "t", 1, 1 * KiB)  # 91 %
    state.get_replicas(others, 100)  # leased: only the two pinned objects may go

    report = pass_time(state, clock, elapsed)

    assert report.objects_evicted == 1, "one 10 KiB object brings the segment to 81 %"
    assert published(state) == {"pinned-long", "pinned-short", *others} - {evicted}
    if evicted == "pinned-short":
        assert state.stat("pinned-long").pin is Pin.SOFT


def test_a_soft_pin_ends_after_pin_ttl_at_a_tick():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k", options=PutOptions(pin=Pin.SOFT, pin_ttl=5))
    assert (state.stat("k").pin, state.stat("k").pin_remaining) == (Pin.SOFT, 5)

    pass_time(state, clock, 4)
    assert (state.stat("k").pin, state.stat("k").pin_remaining) == (Pin.SOFT, 1)
    pass_time(state, clock, 1)
    assert (state.stat("k").pin, state.stat("k").pin_remaining) == (Pin.NONE, 0)


def test_a_soft_pin_without_a_ttl_lasts_the_configured_default():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k", options=PutOptions(pin=Pin.SOFT))
    assert state.stat("k").pin_remaining == CONFIG.soft_pin_ttl


def test_hard_pinned_objects_are_never_evicted_and_a_pool_full_of_them_has_no_space():
    state, clock = new_state()
    mount(state, "n1", SEGMENT)
    keys = fill(state, "h", 10, 10 * KiB, HARD)  # 100 %

    report = pass_time(state, clock, 1)

    assert report.objects_evicted == 0
    slot = put(state, "x", 1 * KiB)
    assert slot.status is KeyStatus.NO_SPACE
    assert "even after evicting what may be evicted" in slot.message
    assert published(state) == set(keys)
    assert state.counters.evictions == 0


def test_a_put_that_does_not_fit_evicts_lru_objects_first():
    state, _ = new_state()
    mount(state, "n1", SEGMENT)
    slots = {key: publish(state, key, 10 * KiB) for key in [f"k{i}" for i in range(10)]}  # 100 %

    x = put(state, "x", 10 * KiB)

    assert x.status is OK
    assert published(state) == set(slots) - {"k0"}
    assert x.replicas[0].address == slots["k0"].replicas[0].address
    assert state.counters.evictions == 1

    get(state, "k1")  # leased: skipped
    y = put(state, "y", 20 * KiB)  # needs two evictions (k2 and k3: adjacent, so they merge)
    assert y.status is OK
    assert published(state) == set(slots) - {"k0", "k2", "k3"}
    assert state.counters.evictions == 3


def test_no_space_only_when_nothing_evictable_is_left():
    state, clock = new_state()
    mount(state, "n1", SEGMENT)
    fill(state, "h", 5, 10 * KiB, HARD)
    leased = fill(state, "l", 5, 10 * KiB)  # 100 %
    state.get_replicas(leased, 20)

    assert put(state, "x", 1 * KiB).status is KeyStatus.NO_SPACE
    assert state.counters.evictions == 0
    assert published(state) >= set(leased)

    clock.advance(20)  # the leases ended (no tick needed)
    assert put(state, "x", 1 * KiB).status is OK
    assert published(state) >= set(leased) - {"l00"}
    assert state.counters.evictions == 1


def test_a_zero_byte_put_into_a_full_pool_evicts_like_any_other():
    state, _ = new_state()
    mount(state, "n1", 10 * KiB)
    keys = fill(state, "k", 10, 1 * KiB)  # full: not one free byte

    slot = put(state, "empty", 0)  # needs one alignment unit, like a 1-byte put (which works)

    assert slot.status is OK, slot.message
    assert published(state) == set(keys) - {"k00"}


def test_the_pool_watermark_evicts_across_segments():
    state, clock = new_state()
    mount(state, "a", SEGMENT)
    mount(state, "b", SEGMENT)
    fill(state, "a", 10, 10 * KiB, on(host("a"), pin=Pin.HARD))  # a: 100 %, nothing evictable
    keys = fill(state, "b", 17, 5 * KiB, on(host("b")))  # b: 85 %, not above the watermark
    assert {node for key in keys for node in nodes_of(state.stat(key))} == {"b"}

    report = pass_time(state, clock, 1)  # the pool: 185 KiB of 200 KiB = 92.5 %

    assert report.objects_evicted == 3  # down to 85 % of the pool: 170 KiB
    assert published(state) >= set(keys[3:])
    assert not published(state) & set(keys[:3])
    assert used(state, "a/dram0") + used(state, "b/dram0") == 170 * KiB
    assert state.counters.evictions == 3


def test_an_eviction_pass_in_steps_goes_on_below_the_high_watermark_down_to_the_low_mark():
    """The master ticks with a step (master/main.py): each call takes at most that many
    objects, and a pass cut short goes on at the next call, though the segment is back
    under the high watermark by then, until it reaches the low mark: the same objects
    leave as in one whole pass, in the same order."""
    whole, _ = new_state()
    stepped, _ = new_state()
    for state in (whole, stepped):
        mount(state, "n1", SEGMENT)
        fill(state, "k", 17, 2 * KiB)  # 34 %
        fill(state, "x", 28, 2 * KiB)  # 90 %, and 2 KiB more goes past the watermark:
        fill(state, "y", 1, 2 * KiB)  # 92 %: down to 85 % is 4 objects
    assert whole.tick().objects_evicted == 4

    first = stepped.tick(step=3)
    assert (first.objects_evicted, first.unfinished) == (3, True)
    assert used(stepped, "n1/dram0") == 86 * KiB, "under the high watermark, above the low"
    second = stepped.tick(step=3)
    assert (second.objects_evicted, second.unfinished) == (1, False)
    assert published(stepped) == published(whole)
    assert used(stepped, "n1/dram0") <= LOW

    third = stepped.tick(step=3)
    assert (third.objects_evicted, third.unfinished) == (0, False), "pass over"


def test_a_pass_cut_short_takes_nothing_more_once_removals_brought_the_segment_down():
    state, _ = new_state()
    mount(state, "n1", SEGMENT)
    keys = fill(state, "k", 46, 2 * KiB)  # 92 %: a pass down to 85 % takes 4 objects
    assert state.tick(step=1).unfinished
    assert state.remove(keys[-4:]) == [OK] * 4  # the newest go: 82 %, under the low mark

    report = state.tick(step=1)

    assert (report.objects_evicted, report.unfinished) == (0, False)
    assert published(state) == set(keys[1:-4])


def test_a_pass_with_nothing_left_to_evict_is_over_not_unfinished():
    """Leased objects stay: a stepped pass that finds nothing more to take ends (the master
    waits a whole tick before trying again, rather than spinning)."""
    state, _ = new_state()
    mount(state, "n1", SEGMENT)
    keys = fill(state, "k", 19, 5 * KiB)  # 95 %
    for key in keys:
        get(state, key, lease_ttl=100)

    report = state.tick(step=1)

    assert (report.objects_evicted, report.unfinished) == (0, False)
    with pytest.raises(ValueError, match="at least 1"):
        state.tick(step=0)


def test_frees_that_fall_due_together_are_released_in_steps_too():
    """Objects removed (by force) while leased keep their space until their leases end; when
    thousands end together, a stepped tick releases them (and counts the ended leases) a step
    at a time."""
    state, clock = new_state()
    mount(state, "n1", SEGMENT)
    keys = fill(state, "k", 5, 5 * KiB)
    for key in keys:
        get(state, key, lease_ttl=1)
    assert state.remove(keys, force=True) == [OK] * 5
    assert used(state, "n1/dram0") == 25 * KiB, "the readers may still be copying"
    clock.advance(2)
    for node_id, node in list(state.nodes.items()):
        state.heartbeat(node_id, sorted(node.segment_ids))

    steps = [state.tick(step=2)]
    while steps[-1].unfinished:  # 5 frees and 5 ended leases, 2 a step
        assert len(steps) < 10
        steps.append(state.tick(step=2))

    assert [r.buffers_released for r in steps[:3]] == [2, 2, 1]
    assert len(steps) >= 5
    assert used(state, "n1/dram0") == 0
    assert state.counters.lease_expiries == 5


def test_a_pool_pass_in_steps_takes_the_same_objects_as_a_whole_one():
    state, _ = new_state()
    mount(state, "a", SEGMENT)
    mount(state, "b", SEGMENT)
    fill(state, "a", 10, 10 * KiB, on(host("a"), pin=Pin.HARD))  # a: 100 %, nothing evictable
    keys = fill(state, "b", 17, 5 * KiB, on(host("b")))  # the pool: 92.5 %

    steps = [state.tick(step=1) for _ in range(4)]

    assert [(r.objects_evicted, r.unfinished) for r in steps] == [
        (1, True),
        (1, True),
        (1, False),
        (0, False),
    ]
    assert not published(state) & set(keys[:3])
    assert used(state, "a/dram0") + used(state, "b/dram0") == 170 * KiB


# ------------------------------------------------------------------ placement


def test_replicas_go_to_distinct_nodes():
    state, _ = new_state()
    mount(state, "n1", segment="n1/dram0")
    mount(state, "n1", segment="n1/dram1")
    mount(state, "n2")
    mount(state, "n3")

    for i in range(20):
        slot = put(state, f"k{i}", 1 * KiB, replicas=3)
        assert sorted(nodes_of(slot)) == ["n1", "n2", "n3"]


def test_random_placement_spreads_objects_and_replica_pairs():
    state, _ = new_state(seed=7)
    for node in ("n1", "n2", "n3", "n4"):
        mount(state, node, 4 * MiB)

    singles = Counter(nodes_of(put(state, f"s{i}", 1 * KiB))[0] for i in range(200))
    pairs = Counter(
        tuple(sorted(nodes_of(put(state, f"p{i}", 1 * KiB, replicas=2)))) for i in range(120)
    )

    assert set(singles) == {"n1", "n2", "n3", "n4"}
    assert min(singles.values()) >= 30, singles
    assert len(pairs) == 6, "every pair of nodes is used"
    assert min(pairs.values()) >= 8, pairs


def test_random_placement_over_many_nodes_spreads_a_batch_and_finds_the_few_with_room():
    """Placement draws nodes rather than scanning them all (master/placement.py): objects
    still spread over every node, and when all but a few nodes are full, the few still
    take every object."""
    state, _ = new_state(seed=11)
    for i in range(40):
        mount(state, f"n{i}", 64 * KiB)
    counts = Counter(
        node for i in range(400) for node in nodes_of(put(state, f"k{i}", 1 * KiB, replicas=2))
    )
    assert set(counts) == {f"n{i}" for i in range(40)}, "every node gets objects"
    assert min(counts.values()) >= 5, counts

    state, _ = new_state(seed=12)
    for i in range(40):
        mount(state, f"n{i}", 64 * KiB)
    for i in range(37):  # all but n37..n39 full (hard-pinned: nothing can be evicted)
        publish(state, f"fill{i}", 64 * KiB, options=on(host(f"n{i}"), pin=Pin.HARD))
    slots = [put(state, f"late{i}", 1 * KiB) for i in range(30)]
    assert {node for slot in slots for node in nodes_of(slot)} == {"n37", "n38", "n39"}
    pair = put(state, "pair", 1 * KiB, replicas=3)
    assert sorted(nodes_of(pair)) == ["n37", "n38", "n39"]


def test_random_placement_with_the_same_seed_makes_the_same_choices():
    def placements(seed: int) -> list[list[str]]:
        state, _ = new_state(seed=seed)
        for node in ("n1", "n2", "n3"):
            mount(state, node)
        return [nodes_of(put(state, f"k{i}", replicas=2)) for i in range(20)]

    assert placements(3) == placements(3)
    assert placements(3) != placements(4)


def test_most_free_placement_picks_the_freest_node():
    state, _ = new_state(MOST_FREE)
    mount(state, "big", 1 * MiB)
    mount(state, "medium", 512 * KiB)
    mount(state, "small", 256 * KiB)

    assert nodes_of(publish(state, "first", 600 * KiB)) == ["big"]  # big: 424 KiB free now
    assert nodes_of(put(state, "second", 1 * KiB)) == ["medium"]
    assert nodes_of(put(state, "pair", 1 * KiB, replicas=2)) == ["medium", "big"]


def test_most_free_placement_over_many_nodes_always_takes_the_freest_as_space_shrinks():
    """Most-free ranks the nodes once per call and takes the top for each object: within a
    batch, as each object shrinks its node's free space, the next goes to the freest then."""
    state, _ = new_state(MOST_FREE)
    for i in range(40):
        mount(state, f"n{i}", (64 + i) * KiB)

    def freest() -> set[str]:
        free = {s.node_id: s.allocator.largest_free for s in state.segments.values()}
        top = max(free.values())
        return {node for node, room in free.items() if room == top}

    for batch in range(6):
        keys = [f"b{batch}/{i}" for i in range(16)]
        expected = []
        slots = []
        for key in keys:  # one object at a time: what the freest node is before each
            expected.append(freest())
            [slot] = state.put_start("c1", [key], [4 * KiB], PutOptions())
            slots.append(slot)
        for slot, allowed in zip(slots, expected, strict=True):
            assert nodes_of(slot)[0] in allowed
    batch_keys = [f"together/{i}" for i in range(16)]
    before = {s.node_id: s.allocator.largest_free for s in state.segments.values()}
    together = state.put_start("c1", batch_keys, [4 * KiB] * 16, PutOptions())
    placed = [nodes_of(slot)[0] for slot in together]
    # One batch makes the same choices as the objects one by one: the 16 freest, each once
    # here (every node has room for several 4 KiB objects, and they differ by 1 KiB).
    assert sorted(placed, key=lambda node: -before[node]) == placed
    assert len(set(placed)) == 16


@pytest.mark.parametrize("config", [CONFIG, MOST_FREE], ids=["random", "most-free"])
def test_a_preferred_host_gets_the_first_replica(config):
    state, _ = new_state(config)
    mount(state, "n1", 1 * MiB)
    mount(state, "n2", 64 * KiB)  # the least free: most-free would never pick it first
    mount(state, "n3", 1 * MiB)

    for i in range(10):
        assert nodes_of(put(state, f"one{i}", 1 * KiB, options=on(host("n2")))) == ["n2"]
    pair = put(
        state, "pair", 1 * KiB, options=PutOptions(replicas=2, preferred_hosts=(host("n2"),))
    )
    assert nodes_of(pair)[0] == "n2"
    assert nodes_of(pair)[1] in {"n1", "n3"}


def test_a_preferred_host_with_several_nodes_gets_the_first_replica_on_one_of_them():
    state, _ = new_state()
    mount(state, "n1")
    mount(state, "rack7-a", host="rack7")
    mount(state, "rack7-b", host="rack7")
    mount(state, "n4")

    firsts = {nodes_of(put(state, f"k{i}", 1 * KiB, options=on("rack7")))[0] for i in range(20)}

    assert firsts == {"rack7-a", "rack7-b"}


def test_a_preferred_host_without_room_falls_back_to_other_nodes():
    state, _ = new_state()
    mount(state, "n1", 1 * MiB)
    mount(state, "n2", 8 * KiB)
    publish(state, "filler", 8 * KiB, options=on(host("n2"), pin=Pin.HARD))  # n2 is full

    slot = put(state, "k", 4 * KiB, options=on(host("n2")))

    assert slot.status is OK
    assert nodes_of(slot) == ["n1"]
    assert published(state) == {"filler"}, "nothing was evicted to honour the preference"


def test_replicas_are_best_effort_when_fewer_nodes_than_asked():
    state, _ = new_state()
    mount(state, "n1")
    mount(state, "n2")

    slot = put(state, "k", replicas=3)

    assert slot.status is OK
    assert sorted(nodes_of(slot)) == ["n1", "n2"]
    assert commit(state, "k", slot) is OK
    assert sorted(nodes_of(get(state, "k"))) == ["n1", "n2"]


# ------------------------------------------------------------------ reclaim and writers


def test_a_client_that_heartbeats_keeps_its_reservations():
    state, clock = new_state()
    mount(state, "n1")
    slot = put(state, "k", client="writer")

    for _ in range(5):  # 25 s: well past client_ttl, within the reservation timeout
        report = pass_time(state, clock, 5, clients=("writer",))
        assert (report.dead_clients, report.reservations_reclaimed) == ([], [])

    assert state.stat("k").state == "reserved"
    assert commit(state, "k", slot) is OK
    assert state.counters.clients_died == 0


def test_a_silent_client_loses_its_reservations_at_the_next_tick_key_first_space_later():
    state, clock = new_state()
    info = mount(state, "n1")
    a = put(state, "a", client="writer")
    b = put(state, "b", client="writer")
    c = put(state, "c", client="other")

    report = pass_time(state, clock, CONFIG.client_ttl, clients=("other",))
    assert report.dead_clients == [], "silent for exactly client_ttl: not yet"

    report = pass_time(state, clock, 0.5, clients=("other",))

    assert report.dead_clients == ["writer"]
    assert sorted(report.reservations_reclaimed) == ["a", "b"]
    assert state.counters.clients_died == 1
    assert state.counters.reservations_reclaimed == 2
    # The keys are free at once...
    assert state.stat("a").status is KeyStatus.NOT_FOUND
    assert commit(state, "a", a) is KeyStatus.STALE_PUT
    assert commit(state, "b", b) is KeyStatus.STALE_PUT
    again = put(state, "a", client="writer2")
    assert again.status is OK
    assert again.replicas[0].address not in {a.replicas[0].address, b.replicas[0].address}
    # ... the space is quarantined: the silent writer may still be copying into it.
    assert used(state, info.segment_id) == 4 * 4 * KiB
    assert commit(state, "c", c) is OK, "the other client is undisturbed"
    assert commit(state, "a", again) is OK

    report = pass_time(state, clock, CONFIG.reclaim_delay - 0.5, clients=("writer2", "other"))
    assert report.buffers_released == 0
    report = pass_time(state, clock, 0.5, clients=("writer2", "other"))
    assert report.buffers_released == 2
    assert used(state, info.segment_id) == 2 * 4 * KiB


def test_a_reservation_nobody_commits_times_out_even_if_its_client_heartbeats():
    state, clock = new_state()
    info = mount(state, "n1")
    slot = put(state, "k", client="writer")

    report = pass_time(state, clock, CONFIG.reservation_timeout - 0.5, clients=("writer",))
    assert report.reservations_reclaimed == []

    report = pass_time(state, clock, 0.5, clients=("writer",))

    assert report.reservations_reclaimed == ["k"]
    assert report.dead_clients == []
    assert state.counters.reservations_reclaimed == 1
    assert state.stat("k").status is KeyStatus.NOT_FOUND
    assert commit(state, "k", slot) is KeyStatus.STALE_PUT
    assert used(state, info.segment_id) == 4 * KiB, "quarantined"
    assert pass_time(state, clock, CONFIG.reclaim_delay, clients=("writer",)).buffers_released == 1
    assert used(state, info.segment_id) == 0


def test_no_heartbeat_keeps_a_reservation_made_without_a_client_id_past_its_timeout():
    """The empty client id is every caller's (the handlers qualify the others by their
    caller's identity): a heartbeat or a put of it by anyone, another tenant's included,
    says nothing of that writer. Its reservations end by their timeout."""
    state, clock = new_state()
    mount(state, "n1")
    put(state, "k", client="")
    assert state.clients == {}, "nobody's liveness is tracked under the empty id"

    for second in range(5, int(CONFIG.reservation_timeout), 5):  # (past client_ttl)
        report = pass_time(state, clock, 5, clients=("",))
        assert report.reservations_reclaimed == [] and report.dead_clients == []
        put(state, f"other{second}", client="")  # (a put of the empty id, too)
    assert pass_time(state, clock, 5, clients=("",)).reservations_reclaimed == ["k"]


@pytest.mark.parametrize("how", ["put_revoke", "force-remove"])
def test_a_commit_after_the_reservation_was_revoked_is_stale(how):
    state, _ = new_state()
    mount(state, "n1")
    slot = put(state, "k")
    if how == "put_revoke":
        assert state.put_revoke(["k"], [slot.put_id]) == [OK]
    else:
        assert remove(state, "k", force=True) is OK

    assert commit(state, "k", slot) is KeyStatus.STALE_PUT
    assert state.stat("k").status is KeyStatus.NOT_FOUND


def test_a_client_without_reservations_that_goes_quiet_is_not_declared_dead():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k")  # client c1: its only put is committed

    report = pass_time(state, clock, CONFIG.client_ttl + 1)

    assert report.dead_clients == []
    assert state.counters.clients_died == 0


# ------------------------------------------------------------------ integrity


def test_a_checksum_sent_with_the_commit_is_kept_and_returned():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k", crc32c=0xDEADBEEF)
    publish(state, "zero", crc32c=0)

    assert get(state, "k").crc32c == 0xDEADBEEF
    assert state.stat("k").crc32c == 0xDEADBEEF
    assert get(state, "zero").crc32c == 0, "a checksum of 0 is a checksum"
    assert state.stat("zero").crc32c == 0


def test_no_checksum_when_the_writer_sent_none():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")

    assert get(state, "k").crc32c is None
    assert state.stat("k").crc32c is None


# ------------------------------------------------------------------ node liveness


def test_unmount_returns_the_longest_remaining_lease_on_its_objects_as_drain_time():
    state, clock = new_state()
    mount(state, "n1")
    mount(state, "n2")
    publish(state, "short", options=on(host("n1")))
    publish(state, "long", options=on(host("n1")))
    publish(state, "elsewhere", options=on(host("n2")))
    get(state, "short", lease_ttl=10)
    get(state, "long", lease_ttl=30)
    get(state, "elsewhere", lease_ttl=500)  # another segment: not this drain's business
    clock.advance(5)

    assert state.unmount_segment("n1", "n1/dram0") == (2, 25.0)
    assert state.stat("long").status is KeyStatus.NOT_FOUND


def test_unmount_drain_time_covers_a_force_removed_objects_lease():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k")
    get(state, "k", lease_ttl=50)
    assert remove(state, "k", force=True) is OK
    clock.advance(10)

    assert state.unmount_segment("n1", "n1/dram0") == (0, 40.0)


def test_unmount_drain_time_covers_a_quarantined_reservation():
    state, clock = new_state()
    mount(state, "n1")
    put(state, "k", client="writer")
    assert pass_time(state, clock, CONFIG.reservation_timeout).reservations_reclaimed == ["k"]
    clock.advance(10)

    assert state.unmount_segment("n1", "n1/dram0") == (0, CONFIG.reclaim_delay - 10)


def test_unmount_of_a_segment_nobody_reads_needs_no_drain():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k")
    get(state, "k", lease_ttl=10)
    clock.advance(10)

    assert state.unmount_segment("n1", "n1/dram0") == (1, 0.0)


def test_a_node_silent_for_node_ttl_is_dropped_at_the_next_tick():
    state, clock = new_state()
    n1 = mount(state, "n1")
    n2 = mount(state, "n2")
    publish(state, "only-n1", options=on(host("n1")))
    publish(state, "both", replicas=2)

    clock.advance(CONFIG.node_ttl)
    state.heartbeat("n2", [n2.segment_id])  # n1 stays silent
    assert state.tick().dead_nodes == [], "silent for exactly node_ttl: not yet"
    clock.advance(0.5)
    state.heartbeat("n2", [n2.segment_id])
    assert state.stat("only-n1").status is OK, "nothing happens before the tick"

    report = state.tick()

    assert report.dead_nodes == ["n1"]
    assert report.objects_lost == 1
    assert state.counters.nodes_died == 1
    assert state.stat("only-n1").status is KeyStatus.NOT_FOUND
    assert nodes_of(state.stat("both")) == ["n2"]
    assert [u.info.segment_id for u in state.snapshot().segments] == [n2.segment_id]
    assert state.heartbeat("n1", [n1.segment_id]) == [n1.segment_id], "it must mount again"


# ------------------------------------------------------------------ batches


def test_one_put_start_answers_every_key_in_order_with_mixed_outcomes():
    state, _ = new_state()
    info = mount(state, "n1", 16 * KiB)
    publish(state, "old", 4 * KiB)
    get(state, "old")  # leased: it may not be evicted to make room

    slots = state.put_start(
        "c1",
        ["a", "", "old", "a", "huge", "b", "c"],
        [4 * KiB, 1, 1, 1, 1 * MiB, 4 * KiB, 8 * KiB],
    )

    assert [slot.status for slot in slots] == [
        OK,
        KeyStatus.INVALID_KEY,
        KeyStatus.ALREADY_EXISTS,  # published
        KeyStatus.ALREADY_EXISTS,  # reserved earlier in this very batch
        KeyStatus.NO_SPACE,  # larger than any segment
        OK,
        KeyStatus.NO_SPACE,  # 4 KiB left: the rest is reserved or leased
    ]
    assert [bool(slot.put_id) for slot in slots] == [True, False, False, False, False, True, False]
    assert all(slot.message for slot in slots if slot.status is not OK)
    # What succeeded stands: two reservations, ready to commit.
    assert state.snapshot().reservations == 2
    assert used(state, info.segment_id) == 12 * KiB
    assert commit(state, "a", slots[0]) is OK
    assert commit(state, "b", slots[5]) is OK
    assert published(state) == {"old", "a", "b"}
    assert state.stat("c").status is KeyStatus.NOT_FOUND


# ------------------------------------------------------------------ listing and removal


def test_remove_prefix_removes_only_keys_with_that_prefix():
    state, _ = new_state()
    mount(state, "n1")
    for key in ("A/1", "`x", "a", "a/1", "a/2", "a/2/deep", "ab", "b/1"):
        publish(state, key, 1)

    assert state.remove_prefix("a/") == PrefixRemoval(3, 0, 0)

    assert published(state) == {"A/1", "`x", "a", "ab", "b/1"}
    assert state.counters.objects_removed == 3


def test_remove_prefix_keeps_leased_objects_and_reservations_unless_forced():
    state, clock = new_state()
    info = mount(state, "n1")
    publish(state, "p/plain")
    publish(state, "p/leased")
    get(state, "p/leased", lease_ttl=30)
    reserved = put(state, "p/reserved", client="writer")
    publish(state, "q/other")

    assert state.remove_prefix("p/") == PrefixRemoval(removed=1, leased=1, not_ready=1)
    assert published(state) == {"p/leased", "q/other"}
    assert state.stat("p/reserved").state == "reserved"

    assert state.remove_prefix("p/", force=True) == PrefixRemoval(removed=2, leased=0, not_ready=0)
    assert published(state) == {"q/other"}
    assert commit(state, "p/reserved", reserved) is KeyStatus.STALE_PUT
    # Their space waits: for the reader's lease, and for the writer's reclaim delay.
    assert used(state, info.segment_id) == 3 * 4 * KiB
    assert pass_time(state, clock, 30).buffers_released == 1
    assert pass_time(state, clock, CONFIG.reclaim_delay - 30).buffers_released == 1
    assert used(state, info.segment_id) == 4 * KiB


def test_remove_prefix_of_the_empty_string_removes_everything():
    state, _ = new_state()
    mount(state, "n1")
    for key in ("a", "b/1", "zz"):
        publish(state, key, 1)
    publish(state, "leased", 1)
    get(state, "leased")
    put(state, "reserved", 1)

    assert state.remove_prefix("") == PrefixRemoval(removed=3, leased=1, not_ready=1)
    assert state.remove_prefix("", force=True) == PrefixRemoval(removed=2, leased=0, not_ready=0)

    snapshot = state.snapshot()
    assert (snapshot.objects, snapshot.reservations) == (0, 0)
    assert state.remove_prefix("") == PrefixRemoval(0, 0, 0)


def test_remove_prefix_goes_page_by_page_and_the_last_page_takes_the_reservations():
    """A removal takes at most ``most`` published keys per call and says where to go on;
    leased keys are passed over (the cursor moves past them), and the objects being written
    are looked at on the last page only."""
    state, _ = new_state()
    mount(state, "n1")
    for key in ("p/1", "p/2", "p/3", "p/4", "p/5", "q/1"):
        publish(state, key, 1)
    get(state, "p/2", lease_ttl=30)
    put(state, "p/reserved", 1, client="writer")

    first = state.remove_prefix("p/", most=2)
    assert first == PrefixRemoval(removed=1, leased=1, not_ready=0, next_start_after="p/2")
    second = state.remove_prefix("p/", start_after=first.next_start_after, most=2)
    assert second == PrefixRemoval(removed=2, leased=0, not_ready=0, next_start_after="p/4")
    last = state.remove_prefix("p/", start_after=second.next_start_after, most=2)
    assert last == PrefixRemoval(removed=1, leased=0, not_ready=1, next_start_after="")

    assert published(state) == {"p/2", "q/1"}
    assert state.stat("p/reserved").state == "reserved"


def test_remove_prefix_takes_at_most_a_page_whatever_the_caller_asks():
    state, _ = new_state()
    mount(state, "n1", size=1 << 30)
    count = MAX_REMOVAL_PAGE + 3
    for i in range(count):
        publish(state, f"k/{i:06d}", 1)

    first = state.remove_prefix("k/", most=10 * MAX_REMOVAL_PAGE)
    assert first.removed == MAX_REMOVAL_PAGE
    assert first.next_start_after == f"k/{MAX_REMOVAL_PAGE - 1:06d}"
    rest = state.remove_prefix("k/", start_after=first.next_start_after)
    assert rest == PrefixRemoval(removed=3, leased=0, not_ready=0)
    assert published(state) == set()


def test_stat_reports_everything_the_master_knows_about_an_object():
    state, clock = new_state()
    mount(state, "n1")
    mount(state, "n2")
    slot = put(state, "k", 1000, options=PutOptions(replicas=2, pin=Pin.SOFT, pin_ttl=100))
    clock.advance(1)
    assert commit(state, "k", slot, crc32c=7) is OK
    clock.advance(2)
    get(state, "k", lease_ttl=20)
    clock.advance(4)

    info = state.stat("k")

    assert info.status is OK
    assert info.size == 1000
    assert info.state == "published"
    assert info.replicas == slot.replicas
    assert sorted((r.segment.segment_id, r.segment.node_id) for r in info.replicas) == [
        ("n1/dram0", "n1"),
        ("n2/dram0", "n2"),
    ]
    assert info.lease_remaining == 16
    assert (info.pin, info.pin_remaining) == (Pin.SOFT, 93)
    assert info.crc32c == 7
    assert info.age == 7, "since the put started"
    assert info.idle == 4, "since the last read"


def test_stat_of_a_reservation_a_hard_pin_and_a_missing_key():
    state, clock = new_state()
    mount(state, "n1")
    put(state, "reserved", 10)
    publish(state, "hard", 10, options=HARD)
    clock.advance(3)

    reserved = state.stat("reserved")
    assert (reserved.status, reserved.state, reserved.size) == (OK, "reserved", 10)
    assert (reserved.age, reserved.idle, reserved.lease_remaining) == (3, 3, 0)
    hard = state.stat("hard")
    assert (hard.state, hard.pin, hard.pin_remaining) == ("published", Pin.HARD, 0)
    assert state.stat("missing").status is KeyStatus.NOT_FOUND
