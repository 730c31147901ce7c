"""A client's gRPC channel to the master is closed, when replaced (a new leader, or a fresh
channel after failures), only once the calls running on it have ended
(client/master_link.py): closed under them, it cancelled them, and a call sent again after
that might run twice (a PutStart would find its own reservation)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kvpool.client.master_link import MasterLink
from kvpool.errors import ClientClosed
from kvpool.security.caller import CallerCredentials


class FakeChannel:
    def __init__(self, target: str) -> None:
        self.target = target
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:  # (what a stub asks for)
        return lambda *a, **k: None

    unary_stream = stream_unary = stream_stream = unary_unary


@pytest.fixture
def link(monkeypatch) -> MasterLink:
    made: list[FakeChannel] = []

    def channel(self: CallerCredentials, target: str, options: Any) -> FakeChannel:
        made.append(FakeChannel(target))
        return made[-1]

    monkeypatch.setattr(CallerCredentials, "channel", channel)
    return MasterLink("a:1,b:2", credentials=CallerCredentials())


def test_a_channel_replaced_while_a_call_runs_on_it_closes_when_the_call_ends(link):
    deadline = time.monotonic() + 5
    _, leader, first = link._stub_for_leader(deadline)  # a call begins on it
    assert leader == "a:1"
    link._new_channel()  # another thread's failures ask for a fresh channel
    _, _, second = link._stub_for_leader(deadline)
    assert second is not first
    assert not first.closed, "closed under the call that runs on it"
    link._release_channel(second)
    link._release_channel(first)  # the call on it ends
    assert first.closed and not second.closed


def test_a_channel_replaced_with_no_call_on_it_closes_at_once(link):
    deadline = time.monotonic() + 5
    _, _, first = link._stub_for_leader(deadline)
    link._release_channel(first)
    link._resolver.failed(tried="a:1")  # a new leader
    _, leader, second = link._stub_for_leader(deadline)
    assert leader == "b:2" and first.closed
    link._release_channel(second)


def test_a_closed_link_opens_no_channel(link):
    link.close()
    with pytest.raises(ClientClosed):
        link._stub_for_leader(time.monotonic() + 5)
