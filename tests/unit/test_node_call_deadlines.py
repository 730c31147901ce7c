"""How long a storage node waits for the master, and when it gives up on it
(storage_node/node.py ``call_deadline``, ``gives_up``, ``StorageNode._answer_of``).

The master says its node TTL in its mount and heartbeat answers; the node waits for the
master's answers about that long, and leaves the master only once it has not answered for
about the TTL (a refused connection, a standby's refusal, or etcd naming another leader move
it at once, as before). With real processes: tests/integration/test_slow_master_answers.py.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from kvpool.common.master_address import MasterTarget
from kvpool.proto import master_pb2 as pb
from kvpool.storage_node import node
from kvpool.storage_node.node import (
    ADOPT_ALLOWANCE,
    RPC_TIMEOUT,
    LeaderMoved,
    StorageNode,
    WaitedEnough,
    call_deadline,
    gives_up,
)

Code = grpc.StatusCode


def test_the_deadline_follows_the_masters_node_ttl_less_a_heartbeat_interval():
    assert call_deadline(20.0, 1.0) == 19.0
    assert call_deadline(12.0, 1.0) == 11.0
    assert call_deadline(5.0, 0.5) == 4.5


def test_the_deadline_is_never_under_the_old_two_seconds():
    assert RPC_TIMEOUT == 2.0
    assert call_deadline(2.5, 1.0) == RPC_TIMEOUT
    assert call_deadline(1.5, 1.0) == RPC_TIMEOUT
    assert call_deadline(0.001, 1.0) == RPC_TIMEOUT


def test_before_the_master_said_its_ttl_the_node_waits_as_it_did():
    assert call_deadline(0.0, 1.0) == RPC_TIMEOUT  # (none answered yet, or an older master)
    for failures in range(1, 7):
        for code in (Code.DEADLINE_EXCEEDED, Code.UNAVAILABLE, Code.INTERNAL):
            assert gives_up(code, failures, 1000.0, 0.0, 1.0) == (failures % 2 == 0)


def test_a_master_that_answers_late_is_not_left_before_its_ttl():
    ttl, interval = 20.0, 1.0
    deadline = call_deadline(ttl, interval)
    # two heartbeats that found no answer within the old 2 s, and more: still within the TTL
    for failures in range(1, 10):
        assert not gives_up(Code.DEADLINE_EXCEEDED, failures, 2.0 * failures, ttl, interval)
    assert not gives_up(Code.DEADLINE_EXCEEDED, 1, ttl - 2 * interval, ttl, interval)
    # the first heartbeat after the last answer (sent a pause later) waits out its whole
    # deadline: by then the master has not answered for about its TTL, and is left
    assert gives_up(Code.DEADLINE_EXCEEDED, 1, interval + deadline, ttl, interval)
    assert gives_up(Code.DEADLINE_EXCEEDED, 1, ttl - interval, ttl, interval)
    # (any other error: the same)
    assert not gives_up(Code.INTERNAL, 4, 3.0, ttl, interval)
    assert gives_up(Code.INTERNAL, 4, ttl, ttl, interval)


def test_a_refused_connection_moves_the_node_on_as_fast_as_before():
    # (the master is down, restarting, or gone in a failover: every second failure, as
    # before the deadline followed the TTL)
    for failures in range(1, 7):
        assert gives_up(Code.UNAVAILABLE, failures, 0.5, 60.0, 1.0) == (failures % 2 == 0)


def test_mount_and_heartbeat_answers_carry_the_ttl_field():
    assert pb.MountSegmentResponse(node_ttl_ms=12_000).node_ttl_ms == 12_000
    assert pb.HeartbeatResponse(node_ttl_ms=5_000).node_ttl_ms == 5_000
    assert pb.HeartbeatResponse().node_ttl_ms == 0  # (an older master: not said)
    # a mount of many objects keeps its allowance on top of the longer deadline
    assert call_deadline(20.0, 1.0) + 1000 * ADOPT_ALLOWANCE == pytest.approx(19.05)


class FakeCall:
    """A unary call under way: answered, failed or cancelled from outside."""

    def __init__(self) -> None:
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.cancelled = False

    def __await__(self) -> Any:
        return self.future.__await__()

    def cancel(self) -> None:
        self.cancelled = True
        self.future.cancel()


def fake_node(
    target: MasterTarget, named: list[str], looks: list[float], hurried: bool = False
) -> Any:
    async def leader_named(leader: str) -> str:
        looks.append(time.monotonic())
        return named[0]

    return SimpleNamespace(
        _resolver=SimpleNamespace(target=target),
        heartbeat_interval=0.05,
        _leader_named=leader_named,
        _hurried=lambda: hurried,
    )


ETCD = MasterTarget(etcd=("127.0.0.1:1",), cluster="c")
#: Masters as given (no etcd): a standby names the leader in its refusals.
LISTED = MasterTarget(masters=("127.0.0.1:7", "127.0.0.1:8"))


@pytest.mark.parametrize("target", [ETCD, LISTED], ids=["etcd", "listed"])
def test_a_long_call_is_left_at_once_when_another_master_leads(monkeypatch, target):
    monkeypatch.setattr(node, "RPC_TIMEOUT", 0.1)
    named, looks = ["127.0.0.1:7"], []  # (the master called, stopped past its lease)

    async def scenario() -> FakeCall:
        call = FakeCall()
        self = fake_node(target, named, looks)
        started = time.monotonic()
        with pytest.raises(LeaderMoved) as moved:
            await StorageNode._answer_of(self, call, "127.0.0.1:7")
        assert moved.value.leader == "127.0.0.1:8"
        assert time.monotonic() - started < 2.0
        return call

    async def elected_later() -> FakeCall:
        asyncio.get_running_loop().call_later(0.3, named.__setitem__, 0, "127.0.0.1:8")
        return await scenario()

    call = asyncio.run(elected_later())
    assert call.cancelled, "the call left behind goes (one heartbeat in flight at a time)"
    assert len(looks) >= 2, "asked once a heartbeat interval after the old deadline"


@pytest.mark.parametrize("target", [ETCD, LISTED], ids=["etcd", "listed"])
def test_a_long_call_is_waited_for_while_the_same_leader_or_none_is_named(monkeypatch, target):
    monkeypatch.setattr(node, "RPC_TIMEOUT", 0.1)
    for named in (["127.0.0.1:7"], [""]):
        looks: list[float] = []

        async def scenario(named: list[str] = named, looks: list[float] = looks) -> Any:
            call = FakeCall()
            asyncio.get_running_loop().call_later(0.4, call.future.set_result, "answer")
            return await StorageNode._answer_of(
                fake_node(target, named, looks), call, "127.0.0.1:7"
            )

        assert asyncio.run(scenario()) == "answer"
        assert looks, "asked while the call waited past the old deadline"


@pytest.mark.parametrize(
    "target",
    [MasterTarget(masters=("127.0.0.1:7",)), MasterTarget(masters=("127.0.0.1:7", "127.0.0.1:7"))],
    ids=["one-master", "same-master"],
)
def test_with_nobody_else_to_ask_a_call_is_awaited_as_it_is(monkeypatch, target):
    monkeypatch.setattr(node, "RPC_TIMEOUT", 0.01)
    looks: list[float] = []

    async def scenario() -> Any:
        call = FakeCall()
        asyncio.get_running_loop().call_later(0.2, call.future.set_result, "answer")
        return await StorageNode._answer_of(
            fake_node(target, ["127.0.0.1:8"], looks), call, "127.0.0.1:7"
        )

    assert asyncio.run(scenario()) == "answer"
    assert looks == []


def test_an_answer_that_comes_while_etcd_is_asked_is_taken(monkeypatch):
    monkeypatch.setattr(node, "RPC_TIMEOUT", 0.05)

    async def scenario() -> Any:
        call = FakeCall()
        looks: list[float] = []
        self = fake_node(ETCD, ["127.0.0.1:8"], looks)
        plain = self._leader_named

        async def slow_lookup(leader: str) -> str:  # (the answer arrives while it asks)
            await asyncio.sleep(0.2)
            return await plain(leader)

        self._leader_named = slow_lookup
        asyncio.get_running_loop().call_later(0.1, call.future.set_result, "answer")
        return await StorageNode._answer_of(self, call, "127.0.0.1:7")

    assert asyncio.run(scenario()) == "answer"


@pytest.mark.parametrize("target", [ETCD, MasterTarget(masters=("127.0.0.1:7",))])
def test_a_node_that_leaves_waits_no_longer_than_before(monkeypatch, target):
    monkeypatch.setattr(node, "RPC_TIMEOUT", 0.1)

    async def scenario() -> FakeCall:
        call = FakeCall()
        started = time.monotonic()
        with pytest.raises(WaitedEnough):
            await StorageNode._answer_of(
                fake_node(target, [""], [], hurried=True), call, "127.0.0.1:7"
            )
        assert time.monotonic() - started < 1.0
        return call

    assert asyncio.run(scenario()).cancelled
