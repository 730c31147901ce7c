"""The node's side of the checked stream, in process over real sockets: the capability's
expiry is enforced by the node, and the client's failures are told apart.

(The same rules against real node processes: tests/integration/test_checked_transport.py.)
"""

from __future__ import annotations

import ctypes
import mmap
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kvpool.security import capabilities as caps
from kvpool.storage_node.checked_server import CheckedServer, NodeKeys
from kvpool.transport import checked_frames as frames
from kvpool.transport.checked_stream import CheckedStreams, Job, Outcome

SEGMENT = "node-1/dram-0"
RING = caps.KeyRing([(1, bytes(range(32)))], current=1)


@dataclass
class FakeSegment:
    """What the server needs of a segment: its id and memory (a real anonymous mapping)."""

    segment_id: str
    memory: mmap.mmap

    @property
    def size(self) -> int:
        return len(self.memory)


@pytest.fixture
def segment() -> Iterator[FakeSegment]:
    memory = mmap.mmap(-1, 4 << 20)
    yield FakeSegment(SEGMENT, memory)
    memory.close()


@pytest.fixture
def server(segment) -> Iterator[CheckedServer]:
    server = CheckedServer([segment], lambda: NodeKeys(RING, 0, 0), host="127.0.0.1")  # type: ignore[list-item]
    server.start()
    yield server
    assert server.stop(), "no thread keeps the segment's memory"


def grant(offset: int, length: int, rights: caps.Rights, seconds: float) -> bytes:
    return RING.grant(
        segment_id=SEGMENT,
        offset=offset,
        length=length,
        rights=rights,
        expiry_ms=int((time.time() + seconds) * 1000),
        term=0,
        tenant="t",
    )


def test_bytes_arriving_after_the_capability_expired_are_never_written(server, segment):
    length = 1 << 20
    capability = grant(0, length, caps.Rights.WRITE, seconds=0.3)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
        connection.sendall(frames.encode_request(frames.Op.WRITE, 1, capability, 0, length))
        connection.sendall(b"A" * (length // 2))
        time.sleep(0.6)  # (past the expiry: the capability's own clock, no event to wait for)
        with pytest.raises(OSError):
            for _ in range(64):  # the node closed the connection at the expiry
                connection.sendall(b"B" * (length // 2))
                time.sleep(0.01)
    assert segment.memory[length // 2 : length] == bytes(length // 2)
    assert b"B" not in segment.memory[:length]


def test_the_client_tells_refusals_timeouts_and_unreachable_nodes_apart(server, segment):
    streams = CheckedStreams()
    buffer = ctypes.create_string_buffer(b"x" * 4096, 4096)
    address = ctypes.addressof(buffer)
    node = f"127.0.0.1:{server.port}"
    good = grant(0, 4096, caps.Rights.WRITE | caps.Rights.READ, seconds=30)
    try:
        jobs = [
            Job(node, good, 0, 4096, address),
            Job(node, good, 4096, 4096, address),  # outside its range
            Job(node, good, 0, 4096, address),
        ]
        results = streams.run(jobs, is_get=False, deadline=time.monotonic() + 10)
        assert [r.outcome for r in results] == [Outcome.OK, Outcome.REFUSED, Outcome.OK]
        assert "OUT_OF_RANGE" in results[1].message
        assert segment.memory[:4096] == b"x" * 4096
        [late] = streams.run(jobs[:1], is_get=True, deadline=time.monotonic() - 1)
        assert late.outcome is Outcome.TIMED_OUT
        closed = socket.create_server(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()
        [gone] = streams.run(
            [Job(f"127.0.0.1:{port}", good, 0, 4096, address)],
            is_get=True,
            deadline=time.monotonic() + 5,
        )
        assert gone.outcome is Outcome.UNREACHABLE
    finally:
        streams.close()
