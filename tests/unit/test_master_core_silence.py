"""A master that hears from no storage node any more (``MasterCore.client_refusal``).

When every node it had goes silent, the master cannot tell whether they died or whether it
is the one cut off from them (a partition around it). Answering every get "not found" and
every put "no space" meanwhile would tell clients their objects are gone, when a new leader,
or this one once it hears from the nodes again, still holds them. So for one node TTL it
turns clients away with UNAVAILABLE (they retry within their deadline), and with several
masters it steps down (tests/ha/test_leader_hearing_no_node.py); past that it answers from
what it holds, and a put that finds no space says that no node is heard, and which went.
"""

from __future__ import annotations

import pytest
from state_helpers import FakeClock, segment_info

from kvpool.common.status import KeyStatus, Tier
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.records import PutOptions
from kvpool.master.state import MasterState

NODE_TTL = 5.0


def cluster(*nodes: str) -> tuple[MasterCore, FakeClock]:
    clock = FakeClock()
    core = MasterCore(MasterState(MasterConfig(node_ttl=NODE_TTL), clock=clock))
    for call_id, node in enumerate(nodes, 1):
        core.mount_segment(call_id, segment_info(node, 1 << 20), [], False, 0.0)
    return core, clock


def all_go_silent(core: MasterCore, clock: FakeClock) -> None:
    clock.advance(NODE_TTL + 0.1)
    report, _ = core.tick()
    assert report.dead_nodes


def test_clients_are_taken_while_any_node_is_heard():
    core, clock = cluster("n1", "n2")
    assert core.client_refusal() is None
    clock.advance(NODE_TTL - 1)
    core.heartbeat(10, "n2", ["n2/dram0"])
    clock.advance(2)
    report, _ = core.tick()
    assert report.dead_nodes == ["n1"]
    assert core.client_refusal() is None, "n2 is still heard: clients are answered"


def test_when_every_node_goes_silent_clients_are_told_to_retry_for_one_node_ttl():
    core, clock = cluster("n1", "n2")
    all_go_silent(core, clock)
    why = core.client_refusal()
    assert why is not None
    assert "hears from no storage node" in why and "n1, n2" in why and "retry" in why
    clock.advance(NODE_TTL - 0.2)
    assert core.client_refusal() is not None
    clock.advance(0.3)
    assert core.client_refusal() is None, "past one node TTL, it answers from what it holds"


def test_a_node_heard_again_ends_the_refusal_at_once():
    core, clock = cluster("n1")
    all_go_silent(core, clock)
    assert core.client_refusal() is not None
    core.mount_segment(20, segment_info("n1", 1 << 20), [], True, NODE_TTL)
    assert core.client_refusal() is None
    assert core.state.all_silent is None


def test_nodes_that_unmount_leave_no_refusal_behind():
    """Nodes withdrawn on purpose (an unmount, a drain) are not silence."""
    core, _ = cluster("n1")
    core.unmount_segment(30, "n1", "n1/dram0")
    assert not core.state.nodes
    assert core.client_refusal() is None
    assert core.state.all_silent is None


def test_past_the_refusal_a_put_with_no_space_says_which_nodes_went_silent():
    core, clock = cluster(*(f"n{i}" for i in range(7)))
    all_go_silent(core, clock)
    clock.advance(NODE_TTL)
    assert core.client_refusal() is None
    [slot] = core.state.put_start("c1", ["k"], [100])
    assert slot.status is KeyStatus.NO_SPACE
    assert "hears from no storage node" in slot.message
    assert "n0, n1, n2, n3, n4 and 2 more" in slot.message
    assert "declared dead 5 s ago, after 5 s without a heartbeat" in slot.message


@pytest.mark.parametrize("tier", ["nvme", "dram"])
def test_a_cluster_that_never_had_a_node_still_says_to_start_one(tier):
    core, _ = cluster()
    options = PutOptions(tier=Tier.NVME if tier == "nvme" else Tier.DRAM)
    [slot] = core.state.put_start("c1", ["k"], [100], options)
    assert slot.status is KeyStatus.NO_SPACE
    assert "no storage node has mounted a segment" in slot.message


def test_a_leader_that_hears_from_no_node_wants_to_step_down_until_one_is_heard():
    """With several masters, another may reach the nodes (tests/ha/
    test_leader_hearing_no_node.py hands the term on through etcd)."""
    core, clock = cluster("n1", "n2")
    assert core.step_down_reason() is None
    all_go_silent(core, clock)
    why = core.step_down_reason()
    assert why is not None and "hears from no storage node" in why
    clock.advance(3 * NODE_TTL)
    assert core.step_down_reason() is not None, "past the refusal too"
    core.mount_segment(40, segment_info("n2", 1 << 20), [], True, NODE_TTL)
    assert core.step_down_reason() is None
