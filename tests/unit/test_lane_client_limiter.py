"""A client makes at most ``MAX_CONNECTING`` lane connections at once (client/lane_client.py),
and a call that waits too long for its turn goes over gRPC (``LaneBusy``), not failing.

Found by review: with the limiter first written, a lane whose packets are dropped (each
connect taking its whole timeout) was worked through sixteen threads at a time, and the
threads still queued at their deadline failed MasterUnavailable, never trying gRPC (32
threads with 1.5 s: 16 failed). The gRPC side here is a stub; the lane's connects time out
as a firewall makes them.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from kvpool.client import lane_client, master_link
from kvpool.client.lane_client import LaneBusy, LaneClient
from kvpool.proto import master_pb2 as pb
from kvpool.security.caller import ANONYMOUS

LEADER = "m:1"


class GrpcStub:
    """The master over gRPC: answers at once."""

    def __init__(self) -> None:
        self.calls = 0

    def Exists(self, request, timeout, metadata):  # (gRPC's name)
        self.calls += 1
        return pb.ExistsResponse(statuses=[0])


@pytest.fixture
def link_over_a_dropped_lane(monkeypatch):
    """A MasterLink whose lane's connects each time out after CONNECT_TIMEOUT."""
    connects = []

    def dropped(address, timeout=None, *args, **kwargs):
        connects.append(time.monotonic())
        time.sleep(min(timeout or 0.0, lane_client.CONNECT_TIMEOUT))
        raise TimeoutError("timed out")

    monkeypatch.setattr(lane_client.socket, "create_connection", dropped)
    link = master_link.MasterLink("127.0.0.1:1", credentials=ANONYMOUS)
    stub = GrpcStub()
    lane = LaneClient("10.0.0.1", 1)
    link._lanes[LEADER] = lane
    monkeypatch.setattr(link, "_stub_for_leader", lambda deadline: (stub, LEADER, None))

    def lane_for(method, stub, leader, remaining):
        known = link._lanes.get(leader)
        return known if isinstance(known, LaneClient) else None

    monkeypatch.setattr(link, "_lane", lane_for)
    yield link, stub, connects
    link.close()


def test_a_burst_over_a_lane_whose_packets_are_dropped_all_succeeds_over_grpc(
    link_over_a_dropped_lane,
):
    link, stub, connects = link_over_a_dropped_lane
    threads, outcomes = 32, []
    start = threading.Barrier(threads)

    def call() -> None:
        start.wait(5)
        began = time.monotonic()
        try:
            link.call("Exists", pb.ExistsRequest(keys=["k"]), time.monotonic() + 1.5)
            outcomes.append(("ok", time.monotonic() - began))
        except Exception as error:
            outcomes.append((repr(error), time.monotonic() - began))

    workers = [threading.Thread(target=call) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(10)
    assert [o for o, _ in outcomes] == ["ok"] * threads, outcomes
    assert max(t for _, t in outcomes) < 1.5, "each within its deadline"
    assert stub.calls == threads
    assert len(connects) <= 2 * lane_client.MAX_CONNECTING, "no more than two turns of connects"


def test_threads_queued_behind_connects_that_failed_go_over_grpc_in_time(
    link_over_a_dropped_lane,
):
    """Found by review: a thread that came a little after the first wave waited for a turn,
    then spent what it had left on a second connect to the same dropped lane, and failed.
    Once a connect failed, the threads waiting for a turn go over gRPC."""
    link, stub, connects = link_over_a_dropped_lane
    outcomes: list[str] = []
    assert stub.calls == 0

    def call() -> None:
        try:
            link.call("Exists", pb.ExistsRequest(keys=["k"]), time.monotonic() + 1.5)
            outcomes.append("ok")
        except Exception as error:
            outcomes.append(repr(error))

    first = [threading.Thread(target=call) for _ in range(lane_client.MAX_CONNECTING)]
    later = [threading.Thread(target=call) for _ in range(lane_client.MAX_CONNECTING)]
    for worker in first:
        worker.start()
    time.sleep(0.3)
    for worker in later:
        worker.start()
    for worker in [*first, *later]:
        worker.join(10)
    assert outcomes == ["ok"] * len(outcomes) and len(outcomes) == 32, outcomes
    assert len(connects) <= lane_client.MAX_CONNECTING + 1, "no second wave of connects"
    assert stub.calls == 32


def test_waiting_for_a_turn_gives_up_in_time_and_says_the_lane_is_busy(monkeypatch):
    """The wait is bounded by CONNECT_TIMEOUT and half of what the call has left; LaneBusy
    does not pause the lane (the lane itself said nothing)."""
    monkeypatch.setattr(lane_client, "MAX_CONNECTING", 1)
    release = threading.Event()

    def slow(address, timeout=None, *args, **kwargs):
        release.wait(5)
        raise TimeoutError("timed out")

    monkeypatch.setattr(lane_client.socket, "create_connection", slow)
    lane = LaneClient("10.0.0.1", 1)
    holder = threading.Thread(
        target=lambda: _swallow(lambda: lane._take(time.monotonic() + 5)), daemon=True
    )
    holder.start()
    time.sleep(0.1)  # (the one turn is taken)
    began = time.monotonic()
    with pytest.raises(LaneBusy):
        lane._take(time.monotonic() + 0.4)
    assert 0.15 < time.monotonic() - began < 0.4, "half of what the call had left"
    release.set()
    holder.join(5)

    link = master_link.MasterLink("127.0.0.1:1", credentials=ANONYMOUS)
    link._lanes[LEADER] = lane
    link._lane_unreachable(LEADER, LaneBusy("busy"), lane)
    assert link._lanes[LEADER] is lane and not link._lane_pauses, "not paused"
    link.close()


def _swallow(action) -> None:
    with contextlib.suppress(Exception):
        action()
