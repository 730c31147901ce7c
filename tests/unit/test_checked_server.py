"""The node's side of the checked stream, in process over real sockets: the capability's
expiry is enforced by the node, and the client's failures are told apart.

(The same rules against real node processes: tests/integration/test_checked_transport.py.)
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import google_crc32c
import pytest
from helpers import closed_within, wait_until

from kvpool.common.status import Tier
from kvpool.security import capabilities as caps
from kvpool.storage_node import checked_connection
from kvpool.storage_node.checked_connection import Activity, Closed
from kvpool.storage_node.checked_seals import SEAL_LIFE, SEAL_MARGIN, Seals
from kvpool.storage_node.checked_server import CheckedServer, NodeKeys
from kvpool.storage_node.direct_writes import DirectWriter
from kvpool.storage_node.index_log import Entry
from kvpool.storage_node.unreadable import UnreadablePlaces
from kvpool.transport import checked_frames as frames
from kvpool.transport.checked_stream import CheckedStreams, Job, Outcome

SEGMENT = "node-1/dram-0"
RING = caps.KeyRing([(1, bytes(range(32)))], current=1)


@dataclass
class FakeSegment:
    """What the server needs of a segment: its id and memory (a real anonymous mapping)."""

    segment_id: str
    memory: mmap.mmap
    direct: DirectWriter | None = None  # (DRAM: written through ``memory``)
    tier: Tier = Tier.DRAM
    unreadable: UnreadablePlaces = field(default_factory=UnreadablePlaces)

    @property
    def size(self) -> int:
        return len(self.memory)

    @property
    def region(self) -> SimpleNamespace:
        """Where ``memory`` is mapped (what the node's registered region says)."""
        return SimpleNamespace(address=ctypes.addressof(ctypes.c_char.from_buffer(self.memory)))


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


def grant(
    offset: int, length: int, rights: caps.Rights, seconds: float, generation: int = 0
) -> bytes:
    return RING.grant(
        segment_id=SEGMENT,
        offset=offset,
        length=length,
        rights=rights,
        expiry_ms=int((time.time() + seconds) * 1000),
        term=0,
        tenant="t",
        grant_id=generation,
    )


def test_bytes_arriving_after_the_capability_expired_are_never_written(server, segment):
    length = 1 << 20
    capability = grant(0, length, caps.Rights.WRITE, seconds=0.3)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
        connection.sendall(frames.encode_request(frames.Op.WRITE, 1, capability, 0, length))
        connection.sendall(b"A" * (length // 2))
        time.sleep(0.6)  # (past the expiry: the capability's own clock, no event to wait for)
        with contextlib.suppress(OSError):  # (the node drops what still comes: LINGER_S)
            connection.sendall(b"B" * (length // 2))
        assert connection.recv(1 << 16) == b"", "ended at the expiry, unanswered"
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


def statuses(server, requests: list[tuple[frames.Op, bytes, int, int]]) -> list[frames.Status]:
    """Each request's answer, on a connection of its own (a write sends its payload)."""
    answers = []
    for op, capability, offset, length in requests:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
            connection.sendall(frames.encode_request(op, 1, capability, offset, length))
            if op is frames.Op.WRITE:
                connection.sendall(b"w" * length)
            header = b""
            while len(header) < frames.REPLY_SIZE:
                got = connection.recv(frames.REPLY_SIZE - len(header))
                assert got, "the node closed the connection before answering"
                header += got
            answers.append(frames.parse_reply(header).status)
    return answers


def test_a_write_in_flight_when_its_object_is_forgotten_writes_nothing_after_the_answer(
    server, segment
):
    """The Forget's answer is the master's cue to reuse the space: from then on not one byte
    of the old grant may land, even from a writer that was mid-transfer."""
    length = 1 << 20
    capability = grant(0, length, caps.Rights.WRITE, seconds=30, generation=5)
    digest = caps.segment_digest(SEGMENT)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
        connection.sendall(frames.encode_request(frames.Op.WRITE, 1, capability, 0, length))
        connection.sendall(b"A" * (length // 4))
        assert wait_until(lambda: segment.memory[length // 4 - 1] == ord("A"), 5)
        assert server.seals.busy(SEGMENT), "the write is in flight"

        assert server.seals.forget(SEGMENT, [(0, 5)], wait=5.0), "it stopped within the wait"

        assert not server.seals.busy(SEGMENT)
        after_answer = bytes(segment.memory[:length])
        with pytest.raises(OSError):
            for _ in range(64):  # the node shut the connection down
                connection.sendall(b"B" * (length // 4))
                time.sleep(0.01)
    time.sleep(0.05)  # (would any late byte land: give it the chance)
    assert bytes(segment.memory[:length]) == after_answer
    assert b"B" not in segment.memory[:length]
    # the old grant is refused from now on, reads as well; a newer object's is not
    read_old = grant(0, 4096, caps.Rights.READ, seconds=30, generation=5)
    write_new = grant(0, 4096, caps.Rights.WRITE, seconds=30, generation=6)
    assert statuses(
        server,
        [
            (frames.Op.WRITE, grant(0, 4096, caps.Rights.WRITE, 30, 5), 0, 4096),
            (frames.Op.READ, read_old, 0, 4096),
            (frames.Op.WRITE, write_new, 0, 4096),
            (frames.Op.READ, grant(0, 4096, caps.Rights.READ, 30, 6), 0, 4096),
        ],
    ) == [frames.Status.SEALED, frames.Status.SEALED, frames.Status.OK, frames.Status.OK]
    assert not server.seals.sealed(digest, 0, 6)


def test_a_recorded_object_s_write_grant_ends_but_its_readers_go_on(server, segment):
    write = grant(8192, 4096, caps.Rights.WRITE, seconds=30, generation=9)
    read = grant(8192, 4096, caps.Rights.READ, seconds=30, generation=9)
    assert statuses(server, [(frames.Op.WRITE, write, 8192, 4096)]) == [frames.Status.OK]
    assert server.seals.seal(SEGMENT, [(8192, 9)])  # the master's Persist
    assert statuses(
        server, [(frames.Op.WRITE, write, 8192, 4096), (frames.Op.READ, read, 8192, 4096)]
    ) == [frames.Status.SEALED, frames.Status.OK]


def test_one_pipelined_batch_is_answered_in_order_each_request_checked_alone(server, segment):
    """Small requests sent together are handled in one pass (checked_connection.py's
    ``_handle_buffered``); a refused, sealed or large one among them is answered in its
    place, and the requests after it are still served."""
    segment.memory[0:4096] = b"r" * 4096
    segment.memory[1 << 20 : (1 << 20) + (128 << 10)] = b"L" * (128 << 10)
    read = grant(0, 4096, caps.Rights.READ, seconds=30)
    write = grant(4096, 8192, caps.Rights.WRITE, seconds=30, generation=5)
    sealed = grant(16384, 4096, caps.Rights.WRITE, seconds=30, generation=6)
    large = grant(1 << 20, 128 << 10, caps.Rights.READ, seconds=30)
    forged = read[:-1] + bytes([read[-1] ^ 1])
    assert server.seals.seal(SEGMENT, [(16384, 6)])
    batch = [
        (frames.Op.READ, read, 0, 4096, b""),
        (frames.Op.WRITE, write, 4096, 4096, b"a" * 4096),
        (frames.Op.READ, forged, 0, 4096, b""),
        (frames.Op.WRITE, sealed, 16384, 4096, b"s" * 4096),
        (frames.Op.READ, large, 1 << 20, 128 << 10, b""),
        (frames.Op.WRITE, write, 8192, 4096, b"b" * 4096),
        (frames.Op.READ, read, 0, 2048, b""),
    ]
    sent = b"".join(
        frames.encode_request(op, i, capability, offset, length) + payload
        for i, (op, capability, offset, length, payload) in enumerate(batch, start=1)
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
        connection.sendall(sent)
        received = b""
        answers = []
        for i, (op, _, _, length, _) in enumerate(batch, start=1):
            while len(received) < frames.REPLY_SIZE:
                received += connection.recv(1 << 20)
            reply = frames.parse_reply(received[: frames.REPLY_SIZE])
            received = received[frames.REPLY_SIZE :]
            assert reply.request_id == i
            payload = b""
            if op is frames.Op.READ and reply.status is frames.Status.OK:
                assert reply.length == length
                while len(received) < length:
                    received += connection.recv(1 << 20)
                payload, received = received[:length], received[length:]
            answers.append((reply.status, payload))
    ok, refused = frames.Status.OK, frames.Status.FORGED
    assert answers == [
        (ok, b"r" * 4096),
        (ok, b""),
        (refused, b""),
        (frames.Status.SEALED, b""),
        (ok, b"L" * (128 << 10)),
        (ok, b""),
        (ok, b"r" * 2048),
    ]
    assert segment.memory[4096:12288] == b"a" * 4096 + b"b" * 4096
    assert segment.memory[16384:20480] == bytes(4096)


def test_a_capability_running_longer_than_a_seal_is_kept_is_refused(server):
    too_long = grant(0, 4096, caps.Rights.READ, seconds=SEAL_LIFE + 60)
    assert statuses(server, [(frames.Op.READ, too_long, 0, 4096)]) == [frames.Status.EXPIRED]


def test_an_offset_forgotten_again_and_again_keeps_one_expiry():
    now = [1000.0]
    seals = Seals(lambda: now[0])
    for generation in range(1, 201):
        now[0] += 1
        seals.forget(SEGMENT, [(offset, generation) for offset in range(0, 100 * 4096, 4096)])
    assert len(seals) == 100
    assert len(seals._expiries) == 100, "one per offset, not one per Forget"
    now[0] += SEAL_LIFE + 1
    seals.forget(SEGMENT, [])
    assert len(seals) == 0 and len(seals._expiries) == 0


def test_seals_are_dropped_once_every_grant_they_refuse_has_expired():
    now = [1000.0]
    seals = Seals(lambda: now[0])
    digest = caps.segment_digest(SEGMENT)
    seals.seal(SEGMENT, [(0, 3)])  # recorded: its writer's grant ends until it is forgotten
    assert seals.forget(SEGMENT, [(0, 3), (4096, 4)])
    assert seals.sealed(digest, 4096, 4, write=False)
    now[0] += SEAL_LIFE / 2
    seals.seal(SEGMENT, [(4096, 7)])  # a newer object recorded at the same place
    now[0] += SEAL_LIFE / 2 + 1
    seals.forget(SEGMENT, [])  # (seals are pruned as commands come)
    assert len(seals) == 1, "only the newer object's write seal is left"
    assert not seals.sealed(digest, 0, 3, write=True)
    assert not seals.sealed(digest, 4096, 4, write=False)
    assert seals.sealed(digest, 4096, 7, write=True)


def test_a_forgets_seal_lasts_as_long_as_the_master_says_its_grants_run():
    """Not half an hour for every evicted object: a node forgetting thousands of objects a
    second kept a seal of each for SEAL_LIFE, hundreds of MiB to GiB of them."""
    now = [1000.0]
    seals = Seals(lambda: now[0])
    digest = caps.segment_digest(SEGMENT)
    ends = int((now[0] + 10) * 1000)  # (the master's grants end 10 s from now)
    assert seals.forget(SEGMENT, [(o, 1) for o in range(0, 1000 * 4096, 4096)], grants_end_ms=ends)
    assert len(seals) == 1000 and len(seals._expiries) == 1000
    now[0] += 10 + SEAL_MARGIN - 1
    seals.forget(SEGMENT, [])
    assert len(seals) == 1000, "dropped before the grants and the margin ran out"
    assert seals.sealed(digest, 0, 1, write=False)
    now[0] += 2
    seals.forget(SEGMENT, [])
    assert len(seals) == 0 and len(seals._expiries) == 0


def test_a_forget_without_an_end_keeps_its_seal_the_longest_any_grant_runs():
    now = [1000.0]
    seals = Seals(lambda: now[0])
    seals.forget(SEGMENT, [(0, 1)])  # (an older master's Forget says no end)
    seals.forget(SEGMENT, [(4096, 1)], grants_end_ms=int((now[0] + SEAL_LIFE * 2) * 1000))
    now[0] += SEAL_LIFE - 1
    seals.forget(SEGMENT, [])
    assert len(seals) == 2
    now[0] += 2
    seals.forget(SEGMENT, [])
    assert len(seals) == 0, "an end past SEAL_LIFE is held to it (no grant runs longer)"


def test_after_a_term_lower_than_before_seals_keep_their_whole_life_for_a_while():
    """A cluster moved to masters whose terms count lower: the earlier masters' grants pass
    the term check again, and the new master's Forgets do not count them."""
    now = [1000.0]
    seals = Seals(lambda: now[0])
    seals.distrust_grant_ends()
    seals.forget(SEGMENT, [(0, 1)], grants_end_ms=int(now[0] * 1000))
    now[0] += SEAL_MARGIN + 1
    seals.forget(SEGMENT, [])
    assert len(seals) == 1, "kept as long as any grant may run"
    now[0] += SEAL_LIFE
    seals.forget(SEGMENT, [(4096, 2)], grants_end_ms=int(now[0] * 1000))  # trusted again
    assert len(seals) == 1
    now[0] += SEAL_MARGIN + 1
    seals.forget(SEGMENT, [])
    assert len(seals) == 0


def test_a_later_forget_never_shortens_an_earlier_ones_seal():
    now = [1000.0]
    seals = Seals(lambda: now[0])
    digest = caps.segment_digest(SEGMENT)
    seals.forget(SEGMENT, [(0, 3)], grants_end_ms=int((now[0] + 600) * 1000))  # a long lease
    now[0] += 1
    seals.forget(SEGMENT, [(0, 5)], grants_end_ms=int((now[0] + 5) * 1000))  # same place
    now[0] += 5 + SEAL_MARGIN + 1
    seals.forget(SEGMENT, [])
    assert seals.sealed(digest, 0, 3, write=False), "the first object's long grant runs on"
    assert len(seals._expiries) == 1, "one item per offset"
    now[0] += 600
    seals.forget(SEGMENT, [])
    assert len(seals) == 0 and len(seals._expiries) == 0


def test_a_copy_recorded_where_a_seal_lies_is_read_under_its_own_grants_only():
    """A demoted object promoted back into the DRAM it left, or copied where a newer object
    was evicted from, keeps its put's generation: its readers' grants are honoured there
    again, while writes and every other sealed generation stay refused."""
    seals = Seals()
    digest = caps.segment_digest(SEGMENT)
    seals.forget(SEGMENT, [(0, 5), (4096, 9)])  # its own place left; a newer object's
    seals.recorded(SEGMENT, 0, 5)
    seals.recorded(SEGMENT, 4096, 5)
    for offset in (0, 4096):
        assert not seals.sealed(digest, offset, 5, write=False), "its readers read it"
        assert seals.sealed(digest, offset, 5, write=True), "nobody writes it"
        assert seals.sealed(digest, offset, 4, write=False), "an older object's grant"
    assert seals.sealed(digest, 4096, 9, write=False), "the evicted object's grant"
    seals.forget(SEGMENT, [(0, 5)])  # the copy is dropped in turn
    assert seals.sealed(digest, 0, 5, write=False)
    seals.recorded(SEGMENT, 8192, 5)  # (where nothing was sealed: nothing to lift)
    assert not seals.sealed(digest, 8192, 5, write=True) and len(seals) == 2


class ForgettingSegment(FakeSegment):
    """A segment as the node's command executor sees it (its index: what it forgot)."""

    persistent = False

    def __init__(self, segment_id: str, memory: mmap.mmap) -> None:
        super().__init__(segment_id, memory)
        self.forgotten: list[tuple[int, int]] = []

    def forget(self, entries) -> None:
        self.forgotten.extend((e.offset, e.generation) for e in entries)

    def writer_copying(self, ranges) -> bool:
        return False  # (no client on this host writes it itself)


def test_the_node_s_forget_command_answers_only_once_a_read_in_flight_has_stopped(segment):
    """The command, as the master sends it: the read of a forgotten object, mid-transfer
    (its reader stalled), is cut off before the node answers; the next read is refused."""
    from kvpool.proto import master_pb2 as pb
    from kvpool.storage_node.commands import CommandExecutor

    forgetting = ForgettingSegment(SEGMENT, segment.memory)
    server = CheckedServer([forgetting], lambda: NodeKeys(RING, 0, 0), host="127.0.0.1")  # type: ignore[list-item]
    server.start()
    executor = CommandExecutor([forgetting], None, server.seals)  # type: ignore[list-item]
    length = 4 << 20  # (more than the socket buffers hold: the node blocks sending it)
    read = grant(0, length, caps.Rights.READ, seconds=30, generation=11)
    forget = pb.NodeCommand(
        command_id=1,
        forget=pb.Forget(
            segment_id=SEGMENT,
            objects=[pb.StoredObject(key="k", offset=0, size=length, generation=11)],
        ),
    )
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            connection.sendall(frames.encode_request(frames.Op.READ, 1, read, 0, length))
            assert wait_until(lambda: server.seals.busy(SEGMENT), 5), "the read is in flight"
            assert not executor.quick(forget), "it may wait: not on the node's event loop"

            result = executor.execute(forget)

            assert result.ok, result.error
            assert not server.seals.busy(SEGMENT)
            assert forgetting.forgotten == [(0, 11)]
        assert statuses(server, [(frames.Op.READ, read, 0, 4096)]) == [frames.Status.SEALED]
    finally:
        assert server.stop()


def test_a_forget_of_another_term_than_the_node_honours_keeps_its_seal_whole(segment):
    """Its word on when its grants end is about that term's grants; the grants the node
    honours may be another term's (keys the node refused, a Forget come before them)."""
    from kvpool.proto import master_pb2 as pb
    from kvpool.storage_node.commands import CommandExecutor

    now = [1000.0]
    seals = Seals(lambda: now[0])
    forgetting = ForgettingSegment(SEGMENT, segment.memory)
    honoured = [7]
    executor = CommandExecutor(
        [forgetting],  # type: ignore[list-item]
        None,
        seals,
        term=lambda: honoured[0],
    )

    def forget(offset: int, term: int) -> None:
        stored = pb.StoredObject(key="k", offset=offset, size=4096, generation=11)
        ends = int(now[0] * 1000)  # (no grant of the master's runs any more)
        command = pb.Forget(segment_id=SEGMENT, objects=[stored], grants_end_ms=ends, term=term)
        assert executor.execute(pb.NodeCommand(command_id=offset + 1, forget=command)).ok

    forget(0, term=7)  # the term the node honours: the seal goes soon
    forget(4096, term=8)  # another: kept as long as any grant may run
    now[0] += SEAL_MARGIN + 1
    seals.forget(SEGMENT, [])
    digest = caps.segment_digest(SEGMENT)
    assert not seals.sealed(digest, 0, 11, write=False)
    assert seals.sealed(digest, 4096, 11, write=False)


#: A segment larger than the socket buffers hold: a read of it that its reader stalls is
#: still under way on the node.
LARGE = 48 << 20


@contextlib.contextmanager
def large_server(**options: int) -> Iterator[CheckedServer]:
    """A checked server over one LARGE segment, stopped (no thread left in it) at the end."""
    memory = mmap.mmap(-1, LARGE)
    server = CheckedServer(
        [FakeSegment(SEGMENT, memory)],  # type: ignore[list-item]
        lambda: NodeKeys(RING, 0, 0),
        host="127.0.0.1",
        **options,  # type: ignore[arg-type]
    )
    server.start()
    try:
        yield server
    finally:
        assert server.stop()
        memory.close()


def test_a_forget_cuts_off_a_large_read_that_follows_a_small_one_under_the_same_grant():
    """One connection runs two reads under one grant: a small one (gathered, its answer sent
    before the large one starts) and a large one (its reader stalled, more than the socket
    buffers hold). Sending the small answer ends the small read only: the large one still
    counts, so a Forget cuts it off before the node answers (else the node would go on
    reading the space the master reuses at that answer)."""
    length = LARGE
    read = grant(0, length, caps.Rights.READ, seconds=30, generation=11)
    with (
        large_server() as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection,
    ):
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        connection.sendall(
            frames.encode_request(frames.Op.READ, 1, read, 0, 4096)
            + frames.encode_request(frames.Op.READ, 2, read, 0, length)
        )
        connection.recv(1 << 16)  # (the small answer: sent before the large read starts)
        time.sleep(0.3)  # (the large read sends meanwhile, blocked by the full buffers)
        assert server.seals.busy(SEGMENT), "the large read counts as in flight"

        assert server.seals.forget(SEGMENT, [(0, 11)], wait=5)

        assert not server.seals.busy(SEGMENT), "it left the segment before the answer"


def test_a_large_call_moves_over_two_connections_at_once_byte_for_byte(server, segment):
    """A node's share of 4 MiB or more runs on two connections (a large transfer cut in
    two page-aligned parts under its one capability); a part refused fails its transfer."""
    size = 4 << 20
    address = f"127.0.0.1:{server.port}"
    both = caps.Rights.READ | caps.Rights.WRITE
    source = ctypes.create_string_buffer(bytes(range(256)) * (size // 256), size)
    target = ctypes.create_string_buffer(size + 4096)  # (room for the refused read below)

    def run(jobs: list[Job], is_get: bool) -> list[Outcome]:
        results = streams.run(jobs, is_get=is_get, deadline=time.monotonic() + 10)
        return [result.outcome for result in results]

    streams = CheckedStreams()
    try:
        whole = grant(0, size, both, 60)
        assert run([Job(address, whole, 0, size, ctypes.addressof(source))], False) == [Outcome.OK]
        assert run([Job(address, whole, 0, size, ctypes.addressof(target))], True) == [Outcome.OK]
        assert target.raw[:size] == source.raw
        assert len(streams._idle[address]) == 2, "two connections ran it"
        ctypes.memset(target, 0, size)
        half = size // 2
        batch = [  # (two transfers whose sum reaches the mark: dealt to the two connections)
            Job(address, grant(at, half, both, 60), at, half, ctypes.addressof(target) + at)
            for at in (0, half)
        ]
        assert run(batch, True) == [Outcome.OK, Outcome.OK]
        assert target.raw[:size] == source.raw
        beyond = Job(address, whole, 0, size + 4096, ctypes.addressof(target))
        assert run([beyond], True) == [Outcome.REFUSED], "its part past the capability is"
    finally:
        streams.close()


@pytest.fixture
def nvme_server(tmp_path) -> Iterator[tuple[CheckedServer, FakeSegment]]:
    """A segment backed by a file, with its direct writer, as an NVMe segment has."""
    path = tmp_path / "segment.data"
    with open(path, "wb") as file:
        file.truncate(8 << 20)
    direct = DirectWriter.open(path)
    assert direct is not None, f"{tmp_path} takes no direct I/O"
    with open(path, "r+b") as file:
        memory = mmap.mmap(file.fileno(), 8 << 20)
    segment = FakeSegment(SEGMENT, memory, direct, Tier.NVME)
    server = CheckedServer([segment], lambda: NodeKeys(RING, 0, 0), host="127.0.0.1")  # type: ignore[list-item]
    server.start()
    yield server, segment
    assert server.stop()
    direct.close()
    memory.close()


def test_a_large_write_into_nvme_lands_past_the_page_cache_byte_for_byte(nvme_server):
    server, segment = nvme_server
    assert segment.direct is not None
    offset, length = 1000, (3 << 20) + 5  # (starts and ends inside a page)
    data = random.Random(3).randbytes(length)
    capability = grant(offset, length, caps.Rights.WRITE, seconds=30, generation=4)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
        connection.sendall(frames.encode_request(frames.Op.WRITE, 1, capability, offset, length))
        connection.sendall(data)
        assert frames.parse_reply(connection.recv(frames.REPLY_SIZE)).status is frames.Status.OK
    assert segment.memory[offset : offset + length] == data
    assert segment.memory[:offset] == bytes(offset), "nothing around it"
    assert segment.direct.parts.take((offset, 4), length) == google_crc32c.value(data)


def test_bytes_arriving_after_expiry_never_reach_the_disk_either(nvme_server):
    server, segment = nvme_server
    assert segment.direct is not None
    length = 2 << 20
    capability = grant(0, length, caps.Rights.WRITE, seconds=0.3, generation=2)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
        connection.sendall(frames.encode_request(frames.Op.WRITE, 1, capability, 0, length))
        connection.sendall(b"A" * (length // 2))
        time.sleep(0.6)
        with contextlib.suppress(OSError):
            connection.sendall(b"B" * (length // 2))
        assert connection.recv(1 << 16) == b"", "ended at the expiry, unanswered"
    assert b"B" not in segment.memory[:length]
    assert segment.direct.parts.take((0, 2), length) is None, "cut short: its bytes are read"


def test_answers_the_node_sent_before_it_ended_a_connection_all_arrive(server, segment):
    """A malformed header ends the connection after its answer. The node reads and drops
    what its peer still sends until the peer ends its side, then closes: the answers still
    queued in its kernel (here most of two large reads, then the refusal) all arrive, then
    the end of stream. (Closed with that input unread, it would reset the connection, and
    the reset would drop them.)"""
    data = random.Random(5).randbytes(len(segment.memory))
    segment.memory[:] = data
    read = grant(0, len(data), caps.Rights.READ, seconds=30)
    requests = b"".join(
        frames.encode_request(frames.Op.READ, i, read, 0, len(data)) for i in (1, 2)
    )
    with socket.socket() as connection:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # (a slow reader)
        connection.settimeout(10)
        connection.connect(("127.0.0.1", server.port))
        connection.sendall(requests + b"\xff" * frames.REQUEST_SIZE)

        def more_bytes() -> None:  # (what a peer sends before it reads the refusal)
            with contextlib.suppress(OSError):
                connection.sendall(b"\xee" * (4 << 20))
                connection.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=more_bytes)
        sender.start()
        time.sleep(0.5)  # (the node is well into its answers, blocked on the slow reader)
        received = bytearray()
        while chunk := connection.recv(1 << 20):  # (a reset raises here)
            received += chunk
        sender.join(10)
    for request_id in (1, 2):
        reply = frames.parse_reply(bytes(received[: frames.REPLY_SIZE]))
        assert (reply.request_id, reply.status, reply.length) == (
            request_id,
            frames.Status.OK,
            len(data),
        )
        assert received[frames.REPLY_SIZE : frames.REPLY_SIZE + len(data)] == data
        del received[: frames.REPLY_SIZE + len(data)]
    assert frames.parse_reply(bytes(received)).status is frames.Status.BAD_REQUEST


def test_a_header_trickled_in_a_byte_at_a_time_holds_its_connection_no_longer_than_io_timeout(
    segment,
):
    server = CheckedServer(
        [segment], lambda: NodeKeys(RING, 0, 0), host="127.0.0.1", io_timeout=1.0
    )  # type: ignore[list-item]
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
            started = time.monotonic()
            with contextlib.suppress(OSError):
                for _ in range(20):  # (each byte within io_timeout of the one before)
                    connection.sendall(b"\x00")
                    time.sleep(0.3)
            assert closed_within(connection, 5.0)
            assert time.monotonic() - started < 4.0, "ended about io_timeout after it began"
    finally:
        assert server.stop()


@contextlib.contextmanager
def quick_server(segment: FakeSegment) -> Iterator[CheckedServer]:
    server = CheckedServer(
        [segment], lambda: NodeKeys(RING, 0, 0), host="127.0.0.1", io_timeout=1.0
    )  # type: ignore[list-item]
    server.start()
    try:
        yield server
    finally:
        assert server.stop()


def trickled_until_closed(
    connection: socket.socket, request: bytes, byte: bytes, pause: float
) -> float:
    """Sends ``request``, then ``byte`` every ``pause`` seconds (40 at most) until the node
    closes the connection, which it must within 5 s after; returns the seconds it took."""
    connection.sendall(request)
    started = time.monotonic()
    with contextlib.suppress(OSError):
        for _ in range(40):
            connection.sendall(byte)
            time.sleep(pause)
    assert closed_within(connection, 5.0)
    return time.monotonic() - started


def read_slowly_until_cut_off(server: CheckedServer, connection: socket.socket) -> None:
    """Takes the answers about 40 KB/s (far below the node's floors of 1 MiB/s) until the
    node cuts the connection off, which it must within 12 s."""
    stop = threading.Event()

    def read_slowly() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set() and connection.recv(4096):
                time.sleep(0.1)

    reader = threading.Thread(target=read_slowly, daemon=True)
    reader.start()
    assert wait_until(lambda: server._connections, timeout=5)
    assert wait_until(lambda: not server._connections, timeout=12), "still served"
    stop.set()
    reader.join(timeout=10)


def test_a_refused_write_trickled_in_holds_its_connection_no_longer_than_its_deadline(segment):
    """(Its payload is read and dropped to keep the stream in step; a byte now and then,
    each within io_timeout, held the thread for as long as the payload was: no capability is
    needed to be refused.)"""
    forged = bytes(caps.SIZE)
    length = 64 << 10  # drained within io_timeout + 1 s a MiB
    with (
        quick_server(segment) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection,
    ):
        request = frames.encode_request(frames.Op.WRITE, 1, forged, 0, length)
        took = trickled_until_closed(connection, request, b"\x00", 0.3)
        assert took < 5.0, "ended about io_timeout after it began"


def test_a_reader_that_takes_its_answers_a_little_at_a_time_is_cut_off_at_a_deadline(segment):
    """(Each send waited up to io_timeout afresh: a peer reading a few KiB just within it
    held the node's thread for as long as it liked.)"""
    data = random.Random(7).randbytes(len(segment.memory))
    segment.memory[:] = data
    read = grant(0, len(data), caps.Rights.READ, seconds=60)
    piece = 64 << 10  # small reads: their answers are gathered, then sent 4 MiB at once
    with quick_server(segment) as server, socket.socket() as connection:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        connection.settimeout(5)
        connection.connect(("127.0.0.1", server.port))
        connection.sendall(
            b"".join(
                frames.encode_request(frames.Op.READ, i, read, i % 64 * piece, piece)
                for i in range(2 * len(data) // piece)  # (more than the kernel buffers)
            )
        )
        # (io_timeout + 4 s for 4 MiB at the floor, the linger, and slack)
        read_slowly_until_cut_off(server, connection)


def test_a_granted_write_trickled_in_holds_its_connection_no_longer_than_its_length_allows(
    segment, monkeypatch
):
    """(Each wait for its bytes was bounded by io_timeout, not the whole: a writer with a
    valid capability sending a byte a second held its connection, one of the node's few,
    for as long as the capability ran; a few such writers held every one.)"""
    monkeypatch.setattr(checked_connection, "TRANSFER_RATE_FLOOR", 128 << 10)
    length = 256 << 10  # (a large write: io_timeout + 2 s at the floor)
    write = grant(0, length, caps.Rights.WRITE, seconds=60)
    with (
        quick_server(segment) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection,
    ):
        request = frames.encode_request(frames.Op.WRITE, 1, write, 0, length)
        took = trickled_until_closed(connection, request, b"\x01", 0.2)
        assert took < 6.0, "ended about 3 s after it began"


def test_a_granted_large_read_taken_a_little_at_a_time_is_cut_off_at_its_deadline(
    segment, monkeypatch
):
    """(Its sends each waited up to io_timeout afresh: a reader taking a few KiB a second
    held the connection for as long as its capability ran.)"""
    monkeypatch.setattr(checked_connection, "TRANSFER_RATE_FLOOR", 1 << 20)
    length = len(segment.memory)  # (4 MiB: io_timeout + 4 s at the floor)
    read = grant(0, length, caps.Rights.READ, seconds=60)
    with quick_server(segment) as server, socket.socket() as connection:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 10)
        connection.settimeout(5)
        connection.connect(("127.0.0.1", server.port))
        connection.sendall(frames.encode_request(frames.Op.READ, 1, read, 0, length))
        read_slowly_until_cut_off(server, connection)


def test_with_every_connection_taken_a_new_one_replaces_one_that_never_moved_a_byte(segment):
    server = CheckedServer(
        [segment], lambda: NodeKeys(RING, 0, 0), host="127.0.0.1", max_connections=2
    )  # type: ignore[list-item]
    server.start()
    try:
        squatters = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        time.sleep(1.0)  # (idle longer than EVICTABLE_IDLE, no transfer ever admitted)
        read = grant(0, 4096, caps.Rights.READ, seconds=30)
        assert statuses(server, [(frames.Op.READ, read, 0, 4096)]) == [frames.Status.OK]
        assert sum(closed_within(squatter, 2.0) for squatter in squatters) >= 1
        for squatter in squatters:
            squatter.close()
    finally:
        assert server.stop()


def test_a_transfer_under_way_is_never_cut_off_for_a_new_connection():
    length = LARGE
    read = grant(0, length, caps.Rights.READ, seconds=30, generation=3)
    with (
        large_server(max_connections=1) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as reader,
    ):
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.sendall(frames.encode_request(frames.Op.READ, 1, read, 0, length))
        assert wait_until(lambda: server.seals.busy(SEGMENT), 5), "the read is under way"
        time.sleep(1.0)  # (longer than EVICTABLE_IDLE)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as late:
            assert closed_within(late, 2.0), "the new one is turned away"
        assert server.seals.busy(SEGMENT), "the read goes on"


def test_a_connection_replaced_midway_starts_no_transfer_and_one_handling_a_transfer_stays():
    """A connection on which no transfer was ever admitted may be replaced at any point of a
    request (a peer without a capability that sent part of a header must not keep its
    place). Its first transfer's admission and the choice to replace it are made under one
    lock: replaced first, it admits no transfer; admitted first, it is not replaced while it
    handles the request, only once it waits between requests again."""
    replaced = Activity()
    replaced.waiting_since = None  # (midway through a header)
    assert replaced.evict()
    with pytest.raises(Closed):
        replaced.admit()
    busy = Activity()
    busy.waiting_since = None
    busy.admit()
    assert not busy.evict(), "a transfer may be under way"
    busy.waiting_since = time.monotonic()
    assert busy.evict()


def test_a_read_the_disk_fails_is_answered_disk_error_and_the_connection_serves_on(nvme_server):
    """An NVMe segment's bytes that its disk cannot read (an I/O error on the direct read
    of bytes not in the page cache) are answered DISK_ERROR, counted and logged: the reader
    tries another replica on the same connection, rather than seeing the node hang up as
    if it had died."""
    from kvpool.storage_node.metrics import DISK_ERRORS

    server, segment = nvme_server
    assert segment.direct is not None
    length = 1 << 20  # (large: read past the page cache, its pages never touched)
    before = DISK_ERRORS.labels("read")._value.get()
    unreadable = os.open(os.devnull, os.O_WRONLY)  # (preads of it fail: EBADF, as EIO would)
    saved = os.dup(segment.direct.fd)
    os.dup2(unreadable, segment.direct.fd)
    streams = CheckedStreams()
    target = ctypes.create_string_buffer(length)
    address = f"127.0.0.1:{server.port}"
    capability = grant(0, length, caps.Rights.READ, seconds=30, generation=7)
    try:
        [failed] = streams.run(
            [Job(address, capability, 0, length, ctypes.addressof(target))],
            is_get=True,
            deadline=time.monotonic() + 10,
        )
        assert failed.outcome is Outcome.REFUSED
        assert "disk failed to read" in failed.message and "DISK_ERROR" in failed.message
        assert DISK_ERRORS.labels("read")._value.get() == before + 1
        there = Entry("unreadable", 0, length, 7)  # (the capability's offset and generation)
        elsewhere = Entry("fine", length, 4096, 8)
        assert segment.unreadable.take(lambda: [there, elsewhere]) == [there], (
            "noted for the next heartbeat"
        )
        small = grant(0, 4096, caps.Rights.READ, seconds=30)
        [fine] = streams.run(  # (small reads go through the mapping: the same connection)
            [Job(address, small, 0, 4096, ctypes.addressof(target))],
            is_get=True,
            deadline=time.monotonic() + 10,
        )
        assert fine.outcome is Outcome.OK
    finally:
        os.dup2(saved, segment.direct.fd)
        os.close(saved)
        os.close(unreadable)
        streams.close()


def test_a_small_read_the_disk_cannot_page_in_is_counted_and_noted_for_the_master(nvme_server):
    """Small reads go out from the mapping, gathered in one send: a page the kernel cannot
    read in fails the whole send (EFAULT) and ends the connection, and which read it was is
    asked of the disk, so that it is counted and its object reported like a large one's.
    (A data file cut short stands in for the unreadable block, as in the reopen test; the
    test never touches the mapping past the cut itself.)"""
    from kvpool.storage_node.metrics import DISK_ERRORS

    server, segment = nvme_server
    before = DISK_ERRORS.labels("read")._value.get()
    assert segment.direct is not None
    os.ftruncate(segment.direct.fd, 0)
    streams = CheckedStreams()
    target = ctypes.create_string_buffer(4096)
    try:
        [failed] = streams.run(
            [
                Job(
                    f"127.0.0.1:{server.port}",
                    grant(8192, 4096, caps.Rights.READ, seconds=30, generation=9),
                    8192,
                    4096,
                    ctypes.addressof(target),
                )
            ],
            is_get=True,
            deadline=time.monotonic() + 10,
        )
        assert failed.outcome is not Outcome.OK
        assert DISK_ERRORS.labels("read")._value.get() == before + 1
        there = Entry("cut-off", 8192, 4096, 9)
        assert segment.unreadable.take(lambda: [Entry("before", 0, 4096, 8), there]) == [there]
    finally:
        streams.close()
