"""A client remembers, for a few seconds, the storage nodes it could not reach, so that its
next puts ask the master to avoid them at once (client/unreachable_nodes.py)."""

from __future__ import annotations

from kvpool.client.unreachable_nodes import UnreachableNodes


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_node_is_avoided_for_a_few_seconds_then_tried_again():
    clock = FakeClock()
    nodes = UnreachableNodes(remember_for=5.0, clock=clock)
    nodes.add("n0")
    assert nodes.current() == ["n0"]
    clock.now += 4.9
    assert "n0" in nodes
    clock.now += 0.1
    assert nodes.current() == []


def test_failing_again_extends_the_time_and_succeeding_ends_it():
    clock = FakeClock()
    nodes = UnreachableNodes(remember_for=5.0, clock=clock)
    nodes.add("n0")
    clock.now += 4.0
    nodes.add("n0")
    clock.now += 4.0
    assert nodes.current() == ["n0"]
    nodes.forget("n0")
    assert nodes.current() == []


def test_only_the_latest_few_nodes_are_remembered():
    nodes = UnreachableNodes(limit=3, clock=FakeClock())
    for node in ("n0", "n1", "n2", "n3", "n1"):
        nodes.add(node)
    assert nodes.current() == ["n2", "n3", "n1"]
