"""A node that reads none of its gRPC command stream has the stream ended, rather than the
master queueing commands for it without end (master/service.py, MAX_QUEUED_COMMANDS).

A real ``grpc.aio`` server in this process over the real handlers, driver and core; the node
says hello and never reads. gRPC itself holds what its flow control lets it send, then the
handler's writes wait and the queue behind them fills. Past the cap the stream ends, once,
and the commands the node never answered wait in the core's delivery for its next stream.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import structlog
from state_helpers import segment_info

from kvpool.master import service as service_module
from kvpool.master.authenticator import Authenticator
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.driver import CoreDriver
from kvpool.master.handlers import MasterHandlers
from kvpool.master.records import Commit, PutOptions
from kvpool.master.service import MasterService
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc

CAP = 50
BATCH = 32


async def a_node_that_reads_nothing() -> tuple[bool, int, int]:
    """Whether its stream ended, after how many put batches, and how many of its commands
    wait for its next stream."""
    state = MasterState(MasterConfig(), clock=time.monotonic)
    state.mount_segment(segment_info("n1", 1 << 30), [])
    core = MasterCore(state, command_timeout=600.0)
    driver = CoreDriver(core)
    server = grpc.aio.server()
    service = MasterService(MasterHandlers(driver), Authenticator(None, insecure=True))
    master_pb2_grpc.add_MasterServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    silent = asyncio.Event()

    async def hello_then_nothing():
        yield pb.NodeReport(hello=pb.NodeHello(node_id="n1", incarnation="p1"))
        await silent.wait()

    call_ids = iter(range(1, 1 << 30))
    ended_after = -1
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            session = channel.stream_stream(
                "/kvpool.v1.Master/NodeSession",
                request_serializer=pb.NodeReport.SerializeToString,
                response_deserializer=pb.NodeCommand.FromString,
            )
            call = session(hello_then_nothing())  # (never read)
            for _ in range(100):
                await asyncio.sleep(0.01)
                if "n1" in driver._streams:
                    break
            for batch in range(5000):
                keys = [f"k{batch}-{i}" for i in range(BATCH)]
                call_id = next(call_ids)
                effects = core.put_start(call_id, "c", keys, [4096] * BATCH, PutOptions())
                slots = effects.answers[call_id]
                driver.carry_out(effects)
                commits = [Commit(k, s.put_id, (True,)) for k, s in zip(keys, slots, strict=True)]
                driver.carry_out(core.put_end(next(call_ids), commits))  # (a Persist to n1)
                if batch % 20:
                    continue  # (as events handled back to back: a tick's Forgets, say)
                await asyncio.sleep(0)
                if "n1" not in driver._streams:
                    ended_after = batch
                    break
            call.cancel()
    finally:
        silent.set()
        await server.stop(None)
    return ended_after >= 0, ended_after, len(core.delivery.unanswered("n1"))


def test_a_node_that_reads_none_of_its_commands_has_its_stream_ended_once(monkeypatch):
    monkeypatch.setattr(service_module, "MAX_QUEUED_COMMANDS", CAP)
    with structlog.testing.capture_logs() as logs:
        ended, after, waiting = asyncio.run(a_node_that_reads_nothing())
    assert ended, "the master kept queueing commands for a node that reads none"
    assert waiting > CAP, "what it never answered waits for its next stream"
    warnings = [e for e in logs if e["event"] == "node reads no commands; ending its stream"]
    assert len(warnings) == 1, f"said {len(warnings)} times"
    assert after < 4000
