"""The master's object table is bounded (``MasterConfig.max_objects``, ``--max-objects``):
whatever the objects' sizes, the master's memory is. A put into a full table evicts the least
recently used published objects, whole (every replica), leaving leased, moving and
being-written ones; when none may go, the put is refused with NO_SPACE saying what to do.
With quotas, eviction for room in the table is fair: another tenant's objects go only while
it holds more than an equal split of the table.
"""

from __future__ import annotations

import dataclasses

from state_helpers import CONFIG, MiB, get, mount, new_state, publish, put

from kvpool.common.status import KeyStatus
from kvpool.master.quotas import Quotas
from kvpool.master.records import ForgetCommand

TABLE = dataclasses.replace(CONFIG, max_objects=4, validate_each_event=True)


def test_a_put_into_a_full_table_evicts_the_least_recently_used_object():
    state, clock = new_state(TABLE)
    mount(state, "n1", 64 * MiB)
    for i in range(4):
        publish(state, f"t/{i}")
        clock.advance(1)
    get(state, "t/0")  # (read: now the most recently used)

    publish(state, "t/4")
    assert sorted(state.objects) == ["t/0", "t/2", "t/3", "t/4"]
    assert get(state, "t/1").status is KeyStatus.NOT_FOUND
    assert state.counters.evictions == state.counters.evictions_for_table == 1


def test_every_replica_of_an_evicted_object_is_forgotten_at_its_node():
    state, _ = new_state(TABLE)
    for node in ("n1", "n2"):
        mount(state, node, 64 * MiB)
    publish(state, "t/two", replicas=2)
    for i in range(3):
        publish(state, f"t/{i}")
    state.outbox.clear()

    assert put(state, "t/new").status is KeyStatus.OK
    assert "t/two" not in state.objects
    forgets = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert sorted(c.segment_id for c in forgets) == ["n1/dram0", "n2/dram0"]


def test_leased_and_unpublished_objects_stay_and_a_put_is_refused_when_none_may_go():
    state, _ = new_state(TABLE)
    mount(state, "n1", 64 * MiB)
    publish(state, "t/leased")
    assert get(state, "t/leased", lease_ttl=60).status is KeyStatus.OK
    assert put(state, "t/writing").status is KeyStatus.OK
    publish(state, "t/old")
    publish(state, "t/newer")

    publish(state, "t/next")  # room: t/old goes, the leased one and the reservation stay
    assert "t/old" not in state.objects
    assert {"t/leased", "t/writing", "t/newer", "t/next"} == set(state.objects)

    get(state, "t/newer", lease_ttl=60)
    get(state, "t/next", lease_ttl=60)
    refused = put(state, "t/more")
    assert refused.status is KeyStatus.NO_SPACE
    assert "--max-objects" in refused.message and "retry shortly" in refused.message
    assert set(state.objects) == {"t/leased", "t/writing", "t/newer", "t/next"}


def test_a_put_refused_for_space_costs_a_full_table_no_object():
    state, _ = new_state(TABLE)
    mount(state, "n1", 64 * MiB)
    for i in range(4):
        publish(state, f"t/{i}")

    refused = put(state, "t/huge", size=128 * MiB)
    assert refused.status is KeyStatus.NO_SPACE
    assert sorted(state.objects) == ["t/0", "t/1", "t/2", "t/3"], "nothing evicted for it"
    assert state.counters.evictions_for_table == 0


def test_with_quotas_a_flood_of_small_objects_leaves_another_tenant_within_half_the_table():
    state, _ = new_state(dataclasses.replace(TABLE, max_objects=8))
    state.set_quotas(Quotas())
    mount(state, "n1", 64 * MiB)
    for i in range(4):
        publish(state, f"b/{i}")
    for i in range(20):
        publish(state, f"a/{i}")  # each evicts one of a's own, never one of b's

    assert sorted(k for k in state.objects if k.startswith("b/")) == [f"b/{i}" for i in range(4)]
    assert sorted(k for k in state.objects if k.startswith("a/")) == [
        f"a/{i}" for i in range(16, 20)
    ]


def test_a_table_found_over_the_bound_takes_puts_and_is_brought_down_at_the_ticks():
    """A new leader adopts whatever the nodes hold, or the bound was lowered: each put
    evicts one object for itself, and the ticks evict the rest in steps."""
    state, _ = new_state(dataclasses.replace(TABLE, max_objects=None))
    mount(state, "n1", 64 * MiB)
    for i in range(200):
        publish(state, f"t/{i:03}")
    state.config = dataclasses.replace(state.config, max_objects=50)

    assert put(state, "t/new").status is KeyStatus.OK
    assert len(state.objects) == 200 and "t/000" not in state.objects
    report = state.tick(step=64)
    assert len(state.objects) == 200 - 64, "a step's budget"
    assert report.objects_evicted == 64
    while len(state.objects) > 50:
        state.tick(step=64)
    assert len(state.objects) == 50 and "t/new" in state.objects
    assert state.counters.evictions_for_table == 151


def test_a_table_over_the_bound_is_trimmed_in_lru_order_whatever_the_tenants_shares():
    """The bound is the master's memory: many small tenants holding the oldest objects (each
    within an equal split) do not hold the trim up."""
    state, _ = new_state(dataclasses.replace(TABLE, max_objects=None))
    state.set_quotas(Quotas())
    mount(state, "n1", 64 * MiB)
    for i in range(30):
        publish(state, f"small{i}/k")
    for i in range(30):
        publish(state, f"big/{i}")
    state.config = dataclasses.replace(state.config, max_objects=40)
    while len(state.objects) > 40:
        assert state.tick(step=16).objects_evicted > 0
    assert sum(k.startswith("small") for k in state.objects) == 10


def test_without_a_bound_the_table_grows_as_space_allows():
    state, _ = new_state(dataclasses.replace(TABLE, max_objects=None))
    mount(state, "n1", 64 * MiB)
    for i in range(50):
        publish(state, f"t/{i}")
    assert len(state.objects) == 50 and state.counters.evictions == 0
