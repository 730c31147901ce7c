"""Story calls scan the master's whole event ring on its event loop (master/story.py): all
callers' Story calls together get STORY_BUDGET of each second (master/handlers.py), and are
refused RESOURCE_EXHAUSTED past it, which clients retry."""

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
