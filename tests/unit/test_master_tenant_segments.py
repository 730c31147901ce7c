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


def _full(state: MasterState, clock, node: str, tenant: str, prefix: str, objects: int) -> None:
    """``objects`` of 256 KiB into ``node``'s (1 MiB) segment, and a second of age."""
    _mount(state, node, tenant=tenant, size=1 * MiB)
    for i in range(objects):
        assert nodes_of(publish(state, f"{prefix}/k{i}", 256 * KiB)) == [node]
    clock.advance(1)


def test_a_put_evicts_nothing_from_a_segment_its_object_cannot_go_to():
    """Tenant b's own node full of b's objects, older than a's on the shared node: a's put
    evicts a's least recently used object, not b's (which would free room a cannot use,
    and leave a's put without room anyway)."""
    state, clock = _state()
    _full(state, clock, "of-b", "b", "b", 4)
    _full(state, clock, "shared", "", "a", 4)
    slot = put(state, "a/new", 256 * KiB)
    assert slot.status is KeyStatus.OK, slot.message
    assert nodes_of(slot) == ["shared"]
    assert sorted(k for k in state.objects if k.startswith("b/")) == [f"b/k{i}" for i in range(4)]
    assert "a/k0" not in state.objects, "a's oldest made the room"


def test_room_on_another_tenant_s_segment_is_no_room_for_a_put():
    """(The room check counted every segment: b's free extent made a's put look as if it
    fitted, nothing was evicted, and the put found no space.)"""
    state, clock = _state()
    _full(state, clock, "of-b", "b", "b", 3)  # (a quarter of b's node free)
    _full(state, clock, "shared", "", "a", 4)
    slot = put(state, "a/new", 256 * KiB)
    assert slot.status is KeyStatus.OK, slot.message
    assert nodes_of(slot) == ["shared"]


def test_another_tenant_s_node_reporting_what_it_holds_does_not_fence_a_put():
    """A's put with no room anywhere is told NO_SPACE, not to retry for a node of b's that
    a's objects could never go to (nor that such a node is restarting)."""
    state, _ = _state()
    _mount(state, "shared", size=1 * MiB)
    for i in range(4):
        publish(state, f"a/k{i}", 256 * KiB)
    for i in range(4):
        assert get(state, f"a/k{i}", lease_ttl=600).status is KeyStatus.OK  # (not evictable)
    info = dataclasses.replace(segment_info("of-b", 1 * MiB), tenant="b")
    state.mount_segment(info, [], more=True)  # (its report comes in parts: fenced meanwhile)
    refused = put(state, "a/x", 256 * KiB)
    assert refused.status is KeyStatus.NO_SPACE, refused.message
    assert "reporting" not in refused.message
    assert put(state, "b/x", 256 * KiB).status is KeyStatus.FENCED, "b's own put waits for it"


def test_a_client_s_cluster_status_counts_only_the_nodes_that_take_its_tenant_s_objects():
    from kvpool.master.core import MasterCore
    from kvpool.master.driver import CoreDriver
    from kvpool.master.handlers import MasterHandlers
    from kvpool.proto import master_pb2 as pb
    from kvpool.security.identity import Identity, Role

    state, _ = _state()
    _mount(state, "shared", size=1 * MiB)
    _mount(state, "of-b", tenant="b", size=2 * MiB)
    publish(state, "b/k", 256 * KiB)  # (on either node)
    handlers = MasterHandlers(CoreDriver(MasterCore(state)))

    def status(tenant: str) -> tuple[int, int]:
        identity = Identity(f"engine-{tenant}", Role.CLIENT, tenant=tenant)
        answer = handlers.ClusterStatus(pb.ClusterStatusRequest(), identity)
        return answer.nodes, sum(s.capacity for s in answer.segments)

    assert status("a") == (1, 1 * MiB), "b's node is none of a's business"
    assert status("b") == (2, 3 * MiB)
