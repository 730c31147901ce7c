"""How the master's metadata lane runs calls (master/lane_server.py), with the real handlers,
driver and core behind it and the connections' transports replaced by recorders.

A call runs at once, as its frame arrives; one whose answer comes later (a PutEnd waiting for
its node) is answered when the core says, in the call that delivered what it waited for, and
never holds up the calls behind it on the same connection. Every call leaves the load
shedder's count of calls in flight when it is answered, however it ends.
"""

from __future__ import annotations

import asyncio
import time

from helpers import FrameRecorder
from state_helpers import segment_info

from kvpool.common import lane_protocol as lp
from kvpool.common.status import KeyStatus
from kvpool.master.authenticator import Authenticator
from kvpool.master.config import MasterConfig
from kvpool.master.core import FORGET_WAIT, MasterCore
from kvpool.master.driver import CoreDriver
from kvpool.master.election import AlwaysLeader
from kvpool.master.handlers import MasterHandlers
from kvpool.master.lane_server import LaneServer, _Connection
from kvpool.master.leader_gate import LeaderGate
from kvpool.master.load_shedding import LoadShedder
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb
from kvpool.security.identity import INSECURE, internal_key


def lane_with_one_node(
    forget_wait: float = FORGET_WAIT,
) -> tuple[LaneServer, _Connection, FrameRecorder]:
    state = MasterState(MasterConfig(), clock=time.monotonic, epoch=1)
    state.mount_segment(segment_info("n1", 64 << 20), [])
    driver = CoreDriver(MasterCore(state, forget_wait=forget_wait))
    # An insecure master: these tests are about the order calls run and are answered in, not
    # about access (tests/unit/test_lane_hardening.py covers a master that checks tokens).
    lane = LaneServer(
        MasterHandlers(driver),
        LeaderGate(AlwaysLeader(), lambda: None),
        LoadShedder(100),
        Authenticator(None, insecure=True),
    )
    node, node_wire = _Connection(lane), FrameRecorder()
    node.connection_made(node_wire)
    hello = pb.NodeReport(hello=pb.NodeHello(node_id="n1"))
    node.data_received(lp.encode(0, lp.NODE_SESSION, hello.SerializeToString()))
    return lane, node, node_wire


def request(call_id: int, method: str, message) -> bytes:
    return lp.encode(call_id, lp.METHOD_IDS[method], message.SerializeToString())


def test_a_waiting_put_end_does_not_hold_up_the_calls_behind_it_and_answers_once_recorded():
    async def scenario() -> None:
        lane, node, node_wire = lane_with_one_node()
        client, wire = _Connection(lane), FrameRecorder()
        client.connection_made(wire)

        start = pb.PutStartRequest(client_id="c", keys=["k"], sizes=[4096], replicas=1)
        client.data_received(request(1, "PutStart", start))
        [started] = wire.frames  # answered at once, in the call that delivered it
        put_id = pb.PutStartResponse.FromString(started.body).slots[0].put_id

        commit = pb.PutCommit(key="k", put_id=put_id, replica_ok=[True])
        client.data_received(
            request(2, "PutEnd", pb.PutEndRequest(client_id="c", commits=[commit]))
        )
        client.data_received(request(3, "Exists", pb.ExistsRequest(client_id="c", keys=["k"])))
        assert [f.call_id for f in wire.frames] == [1, 3], "the Exists passed the waiting PutEnd"
        assert lane.shedder.inflight == 1, "only the PutEnd is still in flight"

        [persist] = node_wire.frames
        command = pb.NodeCommand.FromString(persist.body)
        answer = pb.NodeReport(result=pb.CommandResult(command_id=command.command_id, ok=True))
        node.data_received(lp.encode(0, lp.NODE_SESSION, answer.SerializeToString()))

        assert [f.call_id for f in wire.frames] == [1, 3, 2], "answered as the node's frame came"
        assert list(pb.PutEndResponse.FromString(wire.frames[2].body).statuses) == [0]  # OK
        assert lane.shedder.inflight == 0

    asyncio.run(scenario())


def test_a_put_end_s_persist_leaves_at_once_and_the_node_s_answer_applies_as_it_arrives():
    async def scenario() -> None:
        lane, node, node_wire = lane_with_one_node()
        client, wire = _Connection(lane), FrameRecorder()
        client.connection_made(wire)
        start = pb.PutStartRequest(client_id="c", keys=["k"], sizes=[4096], replicas=1)
        client.data_received(request(1, "PutStart", start))
        put_id = pb.PutStartResponse.FromString(wire.frames[0].body).slots[0].put_id

        commit = pb.PutCommit(key="k", put_id=put_id, replica_ok=[True])
        client.data_received(
            request(2, "PutEnd", pb.PutEndRequest(client_id="c", commits=[commit]))
        )
        [persist] = node_wire.frames  # written in the call that delivered the PutEnd
        command = pb.NodeCommand.FromString(persist.body)
        assert command.WhichOneof("kind") == "persist"

        answer = pb.NodeReport(result=pb.CommandResult(command_id=command.command_id, ok=True))
        node.data_received(lp.encode(0, lp.NODE_SESSION, answer.SerializeToString()))
        state = lane.handlers.core.state
        held_as = internal_key(INSECURE.tenant, "k")  # (an insecure caller's tenant)
        assert state.exists([held_as], grant_lease=False) == [KeyStatus.OK], "published"
        assert [f.call_id for f in wire.frames] == [1, 2]

    asyncio.run(scenario())


def lane_with_one_object(key: str, forget_wait: float = FORGET_WAIT):
    """A lane, its node's connection and wire, and a client's, once ``key`` is published."""
    lane, node, node_wire = lane_with_one_node(forget_wait)
    client, wire = _Connection(lane), FrameRecorder()
    client.connection_made(wire)
    start = pb.PutStartRequest(client_id="c", keys=[key], sizes=[4096], replicas=1)
    client.data_received(request(1, "PutStart", start))
    put_id = pb.PutStartResponse.FromString(wire.frames.pop().body).slots[0].put_id
    commit = pb.PutCommit(key=key, put_id=put_id, replica_ok=[True])
    client.data_received(request(2, "PutEnd", pb.PutEndRequest(client_id="c", commits=[commit])))
    _answer(node, node_wire.frames.pop())
    assert [f.call_id for f in wire.frames] == [2], "the PutEnd is answered"
    wire.frames.clear()
    return lane, node, node_wire, client, wire


def _answer(node, frame) -> None:
    command = pb.NodeCommand.FromString(frame.body)
    answer = pb.NodeReport(result=pb.CommandResult(command_id=command.command_id, ok=True))
    node.data_received(lp.encode(0, lp.NODE_SESSION, answer.SerializeToString()))


def test_a_removal_answers_once_the_node_dropped_the_object():
    """Answered earlier, a master that died before the node heard would leave a new leader to
    adopt the removed object again from the node's report."""

    async def scenario() -> None:
        _lane, node, node_wire, client, wire = lane_with_one_object("k")

        client.data_received(request(3, "Remove", pb.RemoveRequest(client_id="c", keys=["k"])))
        [forget] = node_wire.frames
        assert pb.NodeCommand.FromString(forget.body).WhichOneof("kind") == "forget"
        await asyncio.sleep(0.01)
        assert wire.frames == [], "no answer before the node's"

        _answer(node, node_wire.frames.pop())
        [removed] = wire.frames
        assert list(pb.RemoveResponse.FromString(removed.body).statuses) == [KeyStatus.OK]

    asyncio.run(scenario())


def test_a_removal_whose_node_is_silent_answers_after_the_forget_wait():
    async def scenario() -> None:
        lane, _node, _node_wire, client, wire = lane_with_one_object("k", forget_wait=0.05)

        client.data_received(request(3, "Remove", pb.RemoveRequest(client_id="c", keys=["k"])))
        assert wire.frames == []
        for _ in range(200):  # the node never answers: the driver's timer wakes the core
            if wire.frames:
                break
            await asyncio.sleep(0.01)
        [removed] = wire.frames
        assert list(pb.RemoveResponse.FromString(removed.body).statuses) == [KeyStatus.OK]
        assert lane.shedder.inflight == 0

    asyncio.run(scenario())


def test_a_call_that_fails_is_answered_with_its_status_and_leaves_no_call_in_flight():
    async def scenario() -> None:
        lane, _, _ = lane_with_one_node()
        client, wire = _Connection(lane), FrameRecorder()
        client.connection_made(wire)

        too_many = pb.PutStartRequest(client_id="c", keys=["a", "b"], sizes=[1])  # 2 keys, 1 size
        client.data_received(request(1, "PutStart", too_many))

        def broken(request, identity):
            raise RuntimeError("boom")

        lane.handlers.Exists = broken
        client.data_received(request(2, "Exists", pb.ExistsRequest(client_id="c", keys=["k"])))

        refused, failed = wire.frames
        assert refused.status == lp.INVALID_ARGUMENT
        assert "sizes" in refused.error()[0]
        assert failed.status == lp.INTERNAL
        assert "RuntimeError: boom" in failed.error()[0]
        assert lane.shedder.inflight == 0

    asyncio.run(scenario())


def test_calls_still_waiting_when_the_term_ends_are_answered_and_told_to_retry():
    """A PutStart held back by an unanswered Forget, and the removal that sent it, when the
    master stops leading: both are refused UNAVAILABLE, and the clients retry at the new
    leader (where the removed object may be back: its node never confirmed the Forget).
    Nothing stays in flight."""

    async def scenario() -> None:
        lane, _node, _node_wire, client, wire = lane_with_one_object("k")
        client.data_received(request(3, "Remove", pb.RemoveRequest(client_id="c", keys=["k"])))
        start = pb.PutStartRequest(client_id="c", keys=["k2"], sizes=[4096], replicas=1)
        client.data_received(request(4, "PutStart", start))  # the freed space, not yet forgotten
        assert wire.frames == [] and lane.shedder.inflight == 2

        lane.handlers.driver.reset(None)

        frames = sorted(wire.frames, key=lambda f: f.call_id)
        assert [f.call_id for f in frames] == [3, 4]
        for refused in frames:
            assert refused.status == lp.UNAVAILABLE and "retry" in refused.error()[0]
        assert lane.shedder.inflight == 0

    asyncio.run(scenario())


def test_a_command_stream_from_a_node_that_mounted_nothing_is_refused():
    """A node opens its stream once it has mounted a segment; anyone else would only make the
    master remember a node that does not exist."""

    async def scenario() -> None:
        lane, _, _ = lane_with_one_node()
        stranger, wire = _Connection(lane), FrameRecorder()
        stranger.connection_made(wire)
        hello = pb.NodeReport(hello=pb.NodeHello(node_id="nobody"))
        stranger.data_received(lp.encode(0, lp.NODE_SESSION, hello.SerializeToString()))

        [refused] = wire.frames
        assert refused.status == lp.UNAVAILABLE and "mount" in refused.error()[0]
        assert lane.handlers.core.delivery.stream_of("nobody") is None

    asyncio.run(scenario())


def test_a_node_that_leaves_its_commands_unread_has_its_stream_closed():
    """Past NODE_STREAM_BUFFER bytes of commands waiting, or NODE_STREAM_STALL seconds paused,
    the stream is closed (the node reconnects, and what it did not answer is sent again),
    rather than the master's buffer for it growing without end."""
    from kvpool.master import lane_server

    async def scenario() -> None:
        _lane, _node, node_wire, client, _ = lane_with_one_object("k")
        aborted: list[bool] = []
        node_wire.get_write_buffer_size = lambda: lane_server.NODE_STREAM_BUFFER + 1  # type: ignore[method-assign]
        node_wire.abort = lambda: aborted.append(True)  # type: ignore[method-assign]

        client.data_received(request(3, "Remove", pb.RemoveRequest(client_id="c", keys=["k"])))

        assert aborted, "closed, not buffered"
        assert node_wire.frames == [], "the Forget was not added to what waits"

    asyncio.run(scenario())

    async def paused() -> None:
        _lane, node, node_wire, _, _ = lane_with_one_object("k")
        node_wire.pause_reading = lambda: None  # type: ignore[method-assign]
        node.pause_writing()  # (its transport's buffer is past WRITE_HIGH)
        now = time.monotonic()
        assert node.overdue(now + lane_server.READ_TIMEOUT + 1) is None, "a busy node waits"
        assert node.overdue(now + lane_server.NODE_STREAM_STALL + 1) == "unread_commands"

    asyncio.run(paused())
