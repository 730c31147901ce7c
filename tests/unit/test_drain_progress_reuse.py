"""A draining node's progress (which reads every object of the node, on the master's event
loop) is worked out at most every DRAIN_PROGRESS_EVERY seconds for its heartbeats' answers
(master/handlers.py), however often it heartbeats."""

from __future__ import annotations

from state_helpers import mount, new_state, publish

from kvpool.master import handlers as handlers_module
from kvpool.master.core import MasterCore
from kvpool.master.driver import CoreDriver
from kvpool.master.handlers import MasterHandlers


def test_heartbeats_of_a_draining_node_reuse_its_progress_for_a_while(monkeypatch):
    state, _ = new_state()
    mount(state, "n1")
    mount(state, "n2")
    publish(state, "k", 4096)
    state.drain("n1")
    handlers = MasterHandlers(CoreDriver(MasterCore(state)))
    worked_out = []
    real = state.drain_progress
    monkeypatch.setattr(state, "drain_progress", lambda n: worked_out.append(n) or real(n))
    now = [100.0]
    monkeypatch.setattr(handlers_module.time, "monotonic", lambda: now[0])

    first = handlers._drain_progress("n1")
    for _ in range(5):  # (heartbeats within the second)
        assert handlers._drain_progress("n1") == first
    assert worked_out == ["n1"]
    now[0] += handlers_module.DRAIN_PROGRESS_EVERY
    handlers._drain_progress("n1")
    assert worked_out == ["n1", "n1"], "worked out again once the time is up"


def test_a_node_that_begins_to_drain_is_answered_draining_at_once(monkeypatch):
    """(Its progress from before, "not draining", was reused for two seconds: its first
    answers said the drain was refused, and the node left with its objects.)"""
    state, _ = new_state()
    mount(state, "n1")
    mount(state, "n2")
    mount(state, "n3")  # (a node that takes copies while n1 and n2 drain)
    publish(state, "k", 4096)
    handlers = MasterHandlers(CoreDriver(MasterCore(state)))
    now = [100.0]
    monkeypatch.setattr(handlers_module.time, "monotonic", lambda: now[0])
    state.drain("n2")  # another node drains: n1's heartbeats are answered with its progress
    before = handlers._drain_progress("n1")
    assert before is not None and not before.draining
    state.drain("n1")
    now[0] += 0.1
    after = handlers._drain_progress("n1")
    assert after is not None and after.draining
