"""Story calls scan the master's whole event ring on its event loop (master/story.py): all
callers' Story calls together get STORY_BUDGET of each second (master/handlers.py), each
tenant's at most STORY_SHARE of it, and are refused RESOURCE_EXHAUSTED past it, which clients
retry."""

from __future__ import annotations

import grpc
import pytest
from state_helpers import new_state

from kvpool.master import handlers as handlers_module
from kvpool.master.core import MasterCore
from kvpool.master.driver import CallRefused, CoreDriver
from kvpool.master.handlers import MasterHandlers
from kvpool.proto import master_pb2 as pb
from kvpool.security.identity import Identity, Role


def test_story_calls_share_a_budget_of_the_masters_time_and_are_refused_past_it(monkeypatch):
    monkeypatch.setattr(handlers_module, "STORY_BUDGET", 1e-9)
    state, _ = new_state()
    handlers = MasterHandlers(CoreDriver(MasterCore(state)))
    reader = Identity(name="alice", role=Role.CLIENT, tenant="a")
    handlers.Story(pb.StoryRequest(key="k"), reader)  # (the first takes the second's budget)
    with pytest.raises(CallRefused) as refused:
        handlers.Story(pb.StoryRequest(key="k"), reader)
    assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry in a second" in refused.value.details
    handlers._story_window -= 1.0  # (a second later)
    handlers.Story(pb.StoryRequest(key="k"), reader)


def test_one_tenants_story_calls_leave_the_others_their_share(monkeypatch):
    clock = iter(x * 0.03 for x in range(1000))  # (each story takes 0.03 s of the master)
    monkeypatch.setattr(handlers_module.time, "perf_counter", lambda: next(clock))
    state, _ = new_state()
    handlers = MasterHandlers(CoreDriver(MasterCore(state)))
    greedy = Identity(name="mallory", role=Role.CLIENT, tenant="a")
    other = Identity(name="bob", role=Role.CLIENT, tenant="b")
    handlers.Story(pb.StoryRequest(key="k"), greedy)  # (0.03 s: past a's 0.025 s)
    with pytest.raises(CallRefused) as refused:
        handlers.Story(pb.StoryRequest(key="k"), greedy)
    assert "each tenant's 25%" in refused.value.details
    handlers.Story(pb.StoryRequest(key="k"), other)  # b's share is its own
