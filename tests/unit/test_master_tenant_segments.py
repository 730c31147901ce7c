"""Segments of one tenant (a node's ``--tenant``): the master places, copies and adopts only
that tenant's objects there, so that mapping such a segment shows a client nothing of
another tenant's (security/mapping_grants.py). Segments without one take any tenant's."""

from __future__ import annotations

import dataclasses
import random

from state_helpers import FakeClock, KiB, MiB, get, nodes_of, publish, put, segment_info, stored
from test_master_rereplication import CONFIG, copies, kill

from kvpool.common.status import KeyStatus
from kvpool.master.state import MasterState


def _state() -> tuple[MasterState, FakeClock]:
    clock = FakeClock()
    return MasterState(CONFIG, clock=clock, rng=random.Random(0)), clock


def _mount(state: MasterState, node: str, tenant: str = "", size: int = 4 * MiB) -> None:
    state.mount_segment(dataclasses.replace(segment_info(node, size), tenant=tenant))


def test_a_tenant_s_segment_takes_its_objects_and_no_other_tenant_s():
    state, _ = _state()
    _mount(state, "shared")
    _mount(state, "of-a", tenant="a")
    a_nodes = {node for i in range(40) for node in nodes_of(publish(state, f"a/k{i}", 4 * KiB))}
    b_nodes = {node for i in range(40) for node in nodes_of(publish(state, f"b/k{i}", 4 * KiB))}
    assert a_nodes == {"shared", "of-a"}
    assert b_nodes == {"shared"}


def test_another_tenant_finds_no_space_where_every_segment_is_one_tenant_s():
    state, _ = _state()
    _mount(state, "of-a", tenant="a")
    refused = put(state, "b/k", 4 * KiB)
    assert refused.status is KeyStatus.NO_SPACE
    # it says why, and nothing of tenant a's segments (not their name, not their space)
    assert "no storage node takes tenant 'b'" in refused.message
    assert "--tenant" in refused.message
    assert "'a'" not in refused.message and "MiB" not in refused.message
    assert put(state, "a/k", 4 * KiB).status is KeyStatus.OK


def test_a_no_space_message_counts_the_segments_that_take_the_tenant_only():
    state, _ = _state()
    _mount(state, "of-a", tenant="a", size=64 * MiB)
    _mount(state, "shared", size=1 * MiB)
    refused = put(state, "b/big", 2 * MiB)
    assert refused.status is KeyStatus.NO_SPACE
    assert "of 1.0 MiB in 1 segments" in refused.message, refused.message


def test_a_copy_after_a_node_died_never_goes_to_another_tenant_s_segment():
    state, clock = _state()
    _mount(state, "n0")
    _mount(state, "n1")
    _mount(state, "of-a", tenant="a")
    slot = publish(state, "b/k", 64 * KiB, replicas=2)
    assert sorted(nodes_of(slot)) == ["n0", "n1"]
    state.outbox.clear()
    kill(state, clock, "n0")
    assert copies(state) == [], "the only spare node holds tenant a's objects alone"
    assert nodes_of(get(state, "b/k")) == ["n1"]


def test_a_tenant_s_segment_adopts_only_its_tenant_s_objects_when_it_mounts():
    state, _ = _state()
    _mount(state, "n0")
    publish(state, "a/mine", 4 * KiB)
    publish(state, "b/theirs", 4 * KiB)
    reported = [stored(state, "a/mine", "n0/dram0"), stored(state, "b/theirs", "n0/dram0")]
    other, _ = _state()
    info = dataclasses.replace(segment_info("n0", 4 * MiB), tenant="a")
    dropped = other.mount_segment(info, reported)
    assert dropped == ["b/theirs"]
    assert get(other, "a/mine").status is KeyStatus.OK
    assert get(other, "b/theirs").status is KeyStatus.NOT_FOUND
