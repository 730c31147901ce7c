"""How the master's metadata lane runs calls (master/lane_server.py), with the real service
and core behind it and the connections' transports replaced by recorders.

A call runs at once, as its frame arrives; one that waits (a PutEnd waiting for its node)
runs on when its wait ends, and never holds up the calls behind it on the same connection.
Every call leaves the load shedder's count of calls in flight when it is answered, however
it ends.
"""

from __future__ import annotations

import asyncio
import time

from state_helpers import segment_info

from kvpool.common import lane_protocol as lp
from kvpool.common.status import KeyStatus
from kvpool.master import service as service_module
from kvpool.master.config import MasterConfig
from kvpool.master.election import AlwaysLeader
from kvpool.master.lane_server import LaneServer, _Connection
from kvpool.master.leader_gate import LeaderGate
from kvpool.master.load_shedding import LoadShedder
from kvpool.master.service import MasterService
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb


class Recorder(asyncio.Transport):
    """A transport that hands what the master writes to ``received``, frame by frame."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = lp.FrameDecoder()
        self.frames: list[lp.Frame] = []

    def write(self, data: bytes) -> None:
        self.frames.extend(self.decoder.feed(data))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name, default=None):
        return default

    def close(self) -> None:
        pass


def lane_with_one_node() -> tuple[LaneServer, _Connection, Recorder]:
    state = MasterState(MasterConfig(), clock=time.monotonic, epoch=1)
    state.mount_segment(segment_info("n1", 64 << 20), [])
    service = MasterService(state)
    lane = LaneServer(service, LeaderGate(AlwaysLeader(), lambda: True), LoadShedder(100))
    node, node_wire = _Connection(lane), Recorder()
    node.connection_made(node_wire)
    hello = pb.NodeReport(hello=pb.NodeHello(node_id="n1"))
    node.data_received(lp.encode(0, lp.NODE_SESSION, hello.SerializeToString()))
    return lane, node, node_wire


def request(call_id: int, method: str, message) -> bytes:
    return lp.encode(call_id, lp.METHOD_IDS[method], message.SerializeToString())


def test_a_waiting_put_end_does_not_hold_up_the_calls_behind_it_and_answers_once_recorded():
    async def scenario() -> None:
        lane, node, node_wire = lane_with_one_node()
        await asyncio.sleep(0)  # the node's session starts
        client, wire = _Connection(lane), Recorder()
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

        for _ in range(5):  # the Persist reaches the node's stream
            await asyncio.sleep(0)
        [persist] = node_wire.frames
        command = pb.NodeCommand.FromString(persist.body)
        answer = pb.NodeReport(result=pb.CommandResult(command_id=command.command_id, ok=True))
        node.data_received(lp.encode(0, lp.NODE_SESSION, answer.SerializeToString()))
        for _ in range(5):
            await asyncio.sleep(0)

        assert [f.call_id for f in wire.frames] == [1, 3, 2]
        assert list(pb.PutEndResponse.FromString(wire.frames[2].body).statuses) == [0]  # OK
        assert lane.shedder.inflight == 0

    asyncio.run(scenario())


def test_a_put_end_s_persist_leaves_at_once_and_the_node_s_answer_applies_as_it_arrives():
    async def scenario() -> None:
        lane, node, node_wire = lane_with_one_node()
        await asyncio.sleep(0)  # the node's session starts
        await asyncio.sleep(0)  # and listens for its reports
        client, wire = _Connection(lane), Recorder()
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
        assert lane.service.state.exists(["k"], grant_lease=False) == [KeyStatus.OK], "published"
        await asyncio.sleep(0)  # the PutEnd runs on
        assert [f.call_id for f in wire.frames] == [1, 2]

    asyncio.run(scenario())


async def lane_with_one_object(key: str):
    """A lane, its node's connection and wire, and a client's, once ``key`` is published."""
    lane, node, node_wire = lane_with_one_node()
    await asyncio.sleep(0)  # the node's session starts
    await asyncio.sleep(0)  # and listens for its reports
    client, wire = _Connection(lane), Recorder()
    client.connection_made(wire)
    start = pb.PutStartRequest(client_id="c", keys=[key], sizes=[4096], replicas=1)
    client.data_received(request(1, "PutStart", start))
    put_id = pb.PutStartResponse.FromString(wire.frames.pop().body).slots[0].put_id
    commit = pb.PutCommit(key=key, put_id=put_id, replica_ok=[True])
    client.data_received(request(2, "PutEnd", pb.PutEndRequest(client_id="c", commits=[commit])))
    _answer(node, node_wire.frames.pop())
    await asyncio.sleep(0)  # the PutEnd is answered
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
        _lane, node, node_wire, client, wire = await lane_with_one_object("k")

        client.data_received(request(3, "Remove", pb.RemoveRequest(client_id="c", keys=["k"])))
        [forget] = node_wire.frames
        assert pb.NodeCommand.FromString(forget.body).WhichOneof("kind") == "forget"
        for _ in range(3):
            await asyncio.sleep(0)
        assert wire.frames == [], "no answer before the node's"

        _answer(node, node_wire.frames.pop())
        for _ in range(3):
            await asyncio.sleep(0)
        [removed] = wire.frames
        assert list(pb.RemoveResponse.FromString(removed.body).statuses) == [KeyStatus.OK]

    asyncio.run(scenario())


def test_a_removal_whose_node_is_silent_answers_after_the_forget_wait(monkeypatch):
    monkeypatch.setattr(service_module, "FORGET_WAIT", 0.05)

    async def scenario() -> None:
        lane, _node, _node_wire, client, wire = await lane_with_one_object("k")

        client.data_received(request(3, "Remove", pb.RemoveRequest(client_id="c", keys=["k"])))
        assert wire.frames == []
        await asyncio.sleep(0.2)  # the node never answers
        [removed] = wire.frames
        assert list(pb.RemoveResponse.FromString(removed.body).statuses) == [KeyStatus.OK]
        assert lane.shedder.inflight == 0

    asyncio.run(scenario())


def test_a_call_that_fails_is_answered_with_its_status_and_leaves_no_call_in_flight():
    async def scenario() -> None:
        lane, _, _ = lane_with_one_node()
        client, wire = _Connection(lane), Recorder()
        client.connection_made(wire)

        too_many = pb.PutStartRequest(client_id="c", keys=["a", "b"], sizes=[1])  # 2 keys, 1 size
        client.data_received(request(1, "PutStart", too_many))

        def broken(request, context):
            raise RuntimeError("boom")

        lane.service.Exists = _as_handler(broken)
        client.data_received(request(2, "Exists", pb.ExistsRequest(client_id="c", keys=["k"])))

        refused, failed = wire.frames
        assert refused.status == lp.INVALID_ARGUMENT
        assert "sizes" in refused.error()[0]
        assert failed.status == lp.INTERNAL
        assert "RuntimeError: boom" in failed.error()[0]
        assert lane.shedder.inflight == 0

    asyncio.run(scenario())


def _as_handler(function):
    async def handler(request, context):
        return function(request, context)

    return handler


def test_a_call_whose_wait_is_cancelled_tells_the_client_to_retry():
    async def scenario() -> None:
        lane, _, _ = lane_with_one_node()
        client, wire = _Connection(lane), Recorder()
        client.connection_made(wire)
        waiting = asyncio.get_running_loop().create_future()

        async def waits(request, context):
            await waiting
            return pb.ExistsResponse()

        lane.service.Exists = waits
        client.data_received(request(1, "Exists", pb.ExistsRequest(client_id="c", keys=["k"])))
        assert wire.frames == [] and lane.shedder.inflight == 1

        waiting.cancel()
        await asyncio.sleep(0)

        [cancelled] = wire.frames
        assert cancelled.status == lp.CANCELLED
        assert lane.shedder.inflight == 0

    asyncio.run(scenario())
