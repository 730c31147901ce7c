"""A writer that cannot reach a node asks the master to place its objects elsewhere.

The master learns that a node died only when the node misses heartbeats for the node TTL; a
client whose transfer to it failed knows sooner, and names it in PutStart's ``avoid_nodes``
(client/put_path.py). No replica goes to an avoided node, whatever the placement policy or
the preferred hosts; when no other node has room the answer is the usual NO_SPACE.
"""

from __future__ import annotations

import pytest
from state_helpers import CONFIG, MOST_FREE, MiB, mount, new_state, nodes_of, put

from kvpool.common.status import KeyStatus
from kvpool.master.records import PutOptions

POLICIES = pytest.mark.parametrize("config", [CONFIG, MOST_FREE], ids=["random", "most-free"])


@POLICIES
def test_no_replica_goes_to_an_avoided_node(config):
    state, _ = new_state(config)
    for node in ("n0", "n1", "n2"):
        mount(state, node, 8 * MiB)
    options = PutOptions(replicas=1, avoid_nodes=frozenset({"n0"}))
    nodes = {nodes_of(put(state, f"k{i}", options=options))[0] for i in range(60)}
    assert nodes == {"n1", "n2"}


@POLICIES
def test_replicas_are_best_effort_over_the_nodes_not_avoided(config):
    state, _ = new_state(config)
    for node in ("n0", "n1", "n2"):
        mount(state, node)
    slot = put(state, "k", options=PutOptions(replicas=3, avoid_nodes=frozenset({"n1"})))
    assert slot.status is KeyStatus.OK
    assert sorted(nodes_of(slot)) == ["n0", "n2"]


def test_an_avoided_node_on_a_preferred_host_is_passed_over():
    state, _ = new_state()
    mount(state, "n0", host="here")
    mount(state, "n1", host="elsewhere")
    options = PutOptions(replicas=1, preferred_hosts=("here",), avoid_nodes=frozenset({"n0"}))
    assert nodes_of(put(state, "k", options=options)) == ["n1"]


@POLICIES
def test_no_space_when_every_node_with_room_is_avoided(config):
    state, _ = new_state(config)
    mount(state, "n0", 8 * MiB)
    mount(state, "n1", 1 * MiB)
    slot = put(state, "big", 4 * MiB, options=PutOptions(avoid_nodes=frozenset({"n0"})))
    assert slot.status is KeyStatus.NO_SPACE
    assert "largest free extent" in slot.message
    assert put(state, "big", 4 * MiB).status is KeyStatus.OK  # not avoided: n0 takes it
