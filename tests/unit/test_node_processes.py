"""Which process of a node may hold its command stream (master/node_processes.py): the
table of processes heard from stays bounded whatever node ids heartbeats name, and a
process id longer than any node makes is refused."""

from __future__ import annotations

from kvpool.master import node_processes
from kvpool.master.node_processes import (
    MAX_INCARNATION,
    Attached,
    NodeProcesses,
    incarnation_problem,
)


def test_the_node_ids_remembered_are_bounded_the_least_lately_heard_going_first(monkeypatch):
    monkeypatch.setattr(node_processes, "MAX_NODES", 3)
    processes = NodeProcesses(node_ttl=10.0)
    for i in range(10):
        processes.heard(f"n{i}", "p", float(i))
    processes.heard("n7", "p", 11.0)  # (heard again: now the most lately heard)
    processes.heard("n10", "p", 12.0)
    assert list(processes._heard) == ["n9", "n7", "n10"]  # (n8 went: heard least lately)
    attached = Attached("p", "peer")
    assert processes.refusal("n7", "q", attached, 12.0) is not None, "n7's process is alive"


def test_an_incarnation_longer_than_any_node_makes_is_refused():
    assert incarnation_problem("a" * 32) is None
    assert incarnation_problem("") is None
    problem = incarnation_problem("a" * (MAX_INCARNATION + 1))
    assert problem is not None and f"at most {MAX_INCARNATION} characters" in problem
