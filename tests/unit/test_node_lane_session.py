"""A storage node's command stream over the metadata lane (storage_node/lane_session.py),
against a stand-in master on a real loopback connection.

A command that only touches memory is answered on the spot, in the pass of the event loop that
delivered it; one that must wait (a disk sync, a copy) runs on the asynchronous path, and every
command behind it waits its turn: answers leave in the order the commands came. The
connection opens with the node's credentials (an AUTH frame), then its hello.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from kvpool.common import lane_protocol as lp
from kvpool.proto import master_pb2 as pb
from kvpool.security.caller import CallerCredentials
from kvpool.storage_node import lane_session

#: The node's token (a stand-in master takes any): the AUTH frame that opens the connection.
TOKEN = "kvp1.0123456789ab." + "s" * 43


def command(command_id: int, kind: str) -> bytes:
    message = pb.NodeCommand(command_id=command_id)
    if kind == "forget":
        message.forget.segment_id = "n1/dram0"
    elif kind == "persist":
        message.persist.segment_id = "n1/nvme0"
    else:
        message.copy.source_segment_id = "n1/dram0"
    return lp.encode(0, lp.NODE_SESSION, message.SerializeToString())


def stand_in_master(commands: bytes, reports: asyncio.Queue[pb.NodeReport]) -> Any:
    """A master's end of the lane: accepts the node's credentials, sends ``commands``, and
    puts every report it gets (the hello, then answers) in ``reports``."""

    async def master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder, frames = lp.FrameDecoder(), []
        while not frames:  # the connection opens with the node's credentials
            frames += decoder.feed(await reader.read(1 << 16))
        auth = frames.pop(0)
        assert (auth.method, auth.body) == (lp.AUTH, TOKEN.encode())
        writer.write(lp.encode(auth.call_id, lp.AUTH, b""))  # accepted
        writer.write(commands)
        for frame in frames:
            reports.put_nowait(pb.NodeReport.FromString(frame.body))
        while data := await reader.read(1 << 16):
            for frame in decoder.feed(data):
                reports.put_nowait(pb.NodeReport.FromString(frame.body))
        writer.close()

    return master


@contextlib.asynccontextmanager
async def serving(
    sent: bytes,
    reports: asyncio.Queue[pb.NodeReport],
    run_commands: Callable[[list[pb.NodeCommand]], Awaitable[list[pb.CommandResult]]],
    **options: Any,
) -> AsyncIterator[None]:
    """A stand-in master that sends ``sent``, and node n1 serving its commands over the lane
    (``options``: ``serve_commands``'s ``run_now``, ``groups_with``); entered once the master
    has the node's hello (taken from ``reports``), left with both stopped."""
    server = await asyncio.start_server(stand_in_master(sent, reports), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    node = asyncio.create_task(
        lane_session.serve_commands(
            "127.0.0.1",
            port,
            pb.NodeHello(node_id="n1"),
            run_commands,
            credentials=CallerCredentials(token=TOKEN),
            **options,
        )
    )
    try:
        assert (await asyncio.wait_for(reports.get(), 5)).hello.node_id == "n1"
        yield
    finally:
        node.cancel()
        await asyncio.gather(node, return_exceptions=True)
        server.close()
        await server.wait_closed()


def test_memory_only_commands_are_answered_at_once_and_every_answer_keeps_its_place():
    async def scenario() -> None:
        reports: asyncio.Queue[pb.NodeReport] = asyncio.Queue()
        copy_may_finish = asyncio.Event()
        answered_at_once: list[int] = []

        def run_now(c: pb.NodeCommand) -> pb.CommandResult | None:
            if c.WhichOneof("kind") != "forget":
                return None
            answered_at_once.append(c.command_id)
            return pb.CommandResult(command_id=c.command_id, ok=True)

        async def run_commands(cs: list[pb.NodeCommand]) -> list[pb.CommandResult]:
            if cs[0].WhichOneof("kind") == "copy":
                await copy_may_finish.wait()
            return [pb.CommandResult(command_id=c.command_id, ok=True) for c in cs]

        sent = command(1, "forget") + command(2, "copy") + command(3, "forget")
        async with serving(sent, reports, run_commands, run_now=run_now):
            first = await asyncio.wait_for(reports.get(), 5)
            assert first.result.command_id == 1
            await asyncio.sleep(0.05)
            assert reports.empty(), "3 waits behind the copy"
            assert answered_at_once == [1]

            copy_may_finish.set()
            later = [(await asyncio.wait_for(reports.get(), 5)).result.command_id for _ in range(2)]
            assert later == [2, 3]
            assert answered_at_once == [1], "3 came while the copy was unfinished"
        await asyncio.sleep(0.05)  # the stand-in master sees the end of the stream

    asyncio.run(scenario())


def test_a_refusing_master_ends_the_session_with_its_reason():
    async def scenario() -> None:
        async def master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1 << 16)
            writer.write(
                lp.encode_error(0, lp.NODE_SESSION, lp.UNAVAILABLE, "not the leader", "m2")
            )
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(master, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def never(cs: list[pb.NodeCommand]) -> list[pb.CommandResult]:
            raise AssertionError("no command was sent")

        try:
            await asyncio.wait_for(
                lane_session.serve_commands("127.0.0.1", port, pb.NodeHello(node_id="n1"), never),
                5,
            )
        except lane_session.SessionRefused as refused:
            assert refused.details == "not the leader" and refused.leader == "m2"
        else:
            raise AssertionError("the refusal was not raised")
        finally:
            server.close()

    asyncio.run(scenario())


def test_an_unreachable_lane_says_so():
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()

        async def never(cs: list[pb.NodeCommand]) -> list[pb.CommandResult]:
            raise AssertionError("no connection")

        try:
            await lane_session.serve_commands("127.0.0.1", port, pb.NodeHello(), never)
        except lp.LaneUnreachable as error:
            assert str(port) in str(error)
        else:
            raise AssertionError("LaneUnreachable was not raised")

    asyncio.run(scenario())


def test_commands_waiting_back_to_back_that_group_run_together_and_answer_in_order():
    async def scenario() -> None:
        reports: asyncio.Queue[pb.NodeReport] = asyncio.Queue()
        copy_may_finish = asyncio.Event()
        groups: list[list[int]] = []

        async def run_commands(cs: list[pb.NodeCommand]) -> list[pb.CommandResult]:
            groups.append([c.command_id for c in cs])
            if cs[0].WhichOneof("kind") == "copy":
                await copy_may_finish.wait()
            return [pb.CommandResult(command_id=c.command_id, ok=True) for c in cs]

        def persists_group(first: pb.NodeCommand, later: pb.NodeCommand) -> bool:
            return first.WhichOneof("kind") == later.WhichOneof("kind") == "persist"

        kinds = ["copy", "persist", "persist", "persist", "forget", "persist", "persist"]
        sent = b"".join(command(i + 1, kind) for i, kind in enumerate(kinds))
        async with serving(sent, reports, run_commands, groups_with=persists_group):
            await asyncio.sleep(0.05)  # every command has come, and waits behind the copy
            copy_may_finish.set()
            answers = [
                (await asyncio.wait_for(reports.get(), 5)).result.command_id for _ in range(7)
            ]
            assert answers == [1, 2, 3, 4, 5, 6, 7]
            assert groups == [[1], [2, 3, 4], [5], [6, 7]]

    asyncio.run(scenario())


class _CountingCommands:
    """``lane_session.pb`` with the commands the node parses counted (the rest as it is)."""

    def __init__(self) -> None:
        self.parsed = 0
        counting = self

        class NodeCommand:
            @staticmethod
            def FromString(body: bytes) -> pb.NodeCommand:
                counting.parsed += 1
                return pb.NodeCommand.FromString(body)

        self.NodeCommand = NodeCommand

    def __getattr__(self, name: str) -> Any:
        return getattr(pb, name)


def test_a_node_behind_on_its_commands_stops_reading_them_and_reads_on_once_it_catches_up(
    monkeypatch,
):
    """(It read every command as it came: while its disk was slow, a backlog of commands the
    master had given up on grew its memory without bound, and the master's back-pressure on
    the stream never saw it.)"""
    monkeypatch.setattr(lane_session, "BACKLOG_CAP", 16)
    counting = _CountingCommands()
    monkeypatch.setattr(lane_session, "pb", counting)
    total = 30_000

    async def scenario() -> None:
        reports: asyncio.Queue[pb.NodeReport] = asyncio.Queue()
        copy_may_finish = asyncio.Event()

        async def run_commands(cs: list[pb.NodeCommand]) -> list[pb.CommandResult]:
            if cs[0].WhichOneof("kind") == "copy":
                await copy_may_finish.wait()
            return [pb.CommandResult(command_id=c.command_id, ok=True) for c in cs]

        sent = command(1, "copy") + command(2, "persist") * (total - 1)
        async with serving(sent, reports, run_commands):
            await asyncio.sleep(0.5)  # every command has come, and the copy holds them all up
            assert counting.parsed < total // 2, "it read on, its backlog growing"
            copy_may_finish.set()
            for _ in range(total):
                await asyncio.wait_for(reports.get(), 10)
            assert counting.parsed == total, "read on as it caught up"

    asyncio.run(scenario())


def test_a_node_whose_master_reads_no_answers_ends_the_stream_past_a_bound(monkeypatch):
    """(Commands answered on the spot were answered as fast as they came, whatever the master
    read: a master that stopped reading grew the node's unsent answers without bound. The
    node does not stop reading commands for it: the master stops reading answers while its
    own commands back up, and two such pauses would stall each other for good.)"""
    monkeypatch.setattr(lane_session, "UNSENT_ANSWERS_CAP", 4 << 20)
    total = 20_000  # (answers of about 1 KiB each: far more than the cap and the sockets hold)

    async def scenario() -> BaseException | None:
        async def master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            decoder, frames = lp.FrameDecoder(), []
            while not frames:
                frames += decoder.feed(await reader.read(1 << 16))
            writer.write(lp.encode(frames[0].call_id, lp.AUTH, b""))
            writer.write(b"".join(command(i, "forget") for i in range(1, total + 1)))
            await asyncio.sleep(30)  # (reads no answer)

        def run_now(c: pb.NodeCommand) -> pb.CommandResult:
            return pb.CommandResult(command_id=c.command_id, ok=False, error="e" * 1000)

        async def run_commands(cs: list[pb.NodeCommand]) -> list[pb.CommandResult]:
            raise AssertionError("every command is answered on the spot")

        server = await asyncio.start_server(master, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            await asyncio.wait_for(
                lane_session.serve_commands(
                    "127.0.0.1",
                    port,
                    pb.NodeHello(node_id="n1"),
                    run_commands,
                    run_now=run_now,
                    credentials=CallerCredentials(token=TOKEN),
                ),
                20,
            )
        except ConnectionError as ended:
            return ended
        finally:
            server.close()
        return None

    ended = asyncio.run(scenario())
    assert ended is not None, "the stream went on with its answers unread"
    assert "read none of the node's last 4 MiB of answers" in str(ended)


def test_the_grpc_command_stream_queues_a_bounded_number_of_answers():
    """The gRPC stream's answers wait in ``_Reports`` until gRPC sends them, which it does as
    fast as the master reads: past ``REPORTS_QUEUED`` the node waits (and reads no further
    command) instead of queueing without bound."""
    from kvpool.storage_node.node import REPORTS_QUEUED, _Reports

    async def scenario() -> None:
        reports = _Reports()
        for _ in range(REPORTS_QUEUED):
            assert await asyncio.wait_for(reports.put(pb.NodeReport()), 1)
        one_more = asyncio.ensure_future(reports.put(pb.NodeReport()))
        await asyncio.sleep(0.05)
        assert not one_more.done(), "queued past its bound"
        await reports.__anext__()  # (gRPC sends one)
        assert await asyncio.wait_for(one_more, 1)

        # The stream ends with the queue full (gRPC then takes nothing more from it): a put
        # waiting for room gives up, rather than holding the node's session for ever.
        waiting = asyncio.ensure_future(reports.put(pb.NodeReport()))
        await asyncio.sleep(0.05)
        reports.end()
        assert await asyncio.wait_for(waiting, 1) is False
        assert await reports.put(pb.NodeReport()) is False

    asyncio.run(scenario())
