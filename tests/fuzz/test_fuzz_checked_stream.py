"""The checked stream of real ``kvpool node``s (the data path of peers on other hosts), fed
generated requests over raw TCP.

Each case is one connection carrying one to six pipelined requests, built around real
capabilities (fresh from the master: reads of the canaries, writes of fresh reservations)
and then altered: the capability unchanged, one byte of it flipped, or made up; the offset
and length its own, next to them, or anything; the operation a read, a write (with payload,
whole or cut short) or no operation at all; now and then a header byte changed, or junk
instead of a request. The client then stops writing and reads until the node ends the
connection.

Whatever a peer sends, the node answers each request it can read, in order, with a status,
and closes the connection at the first it cannot; it moves bytes only for a request whose
capability the master really granted and whose range that capability covers: a read answered
OK returns exactly the canary's bytes there, a write answered OK used an unaltered write
capability of a fresh reservation (never a canary's), and the canaries read back unchanged.
The node ends every connection within the deadline (no hang) and without a reset (every
answer it sent arrives), and the watch's probe, canaries and logs (tests/fuzz/fuzzing.py)
hold after every case.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from dataclasses import dataclass, field

import pytest
from fuzzing import CANARY_PREFIX, Watch, fuzz_settings, integers, share, weighted
from hypothesis import event, given
from hypothesis import strategies as st

from kvpool.proto import master_pb2 as pb
from kvpool.security import capabilities as caps
from kvpool.security.identity import Role
from kvpool.transport import checked_frames as frames

SURFACE = "checked_stream"
pytestmark = pytest.mark.fuzz
SETTINGS = fuzz_settings(share(1))

#: How long a case waits for the node to answer and close the connection.
CASE_DEADLINE_S = 20.0
#: A write's payload sent at most (a longer write is cut short: the client stops there).
PAYLOAD_CAP = 512 << 10
#: Capabilities are asked for again after this (they expire; a fresh one keeps most reads
#: of unchanged capabilities within their time).
REFRESH_S = 2.0


@dataclass(frozen=True)
class Target:
    """A range a capability the master granted covers: a canary replica's (a read
    capability; ``data`` its bytes), or a fuzz key's reservation (a write capability,
    ``writable``; its bytes unknown: nothing reads it back)."""

    key: str
    data: bytes = field(repr=False)
    size: int
    capability: bytes = field(repr=False)
    checked_address: str
    offset: int  # from the segment's base
    writable: bool = False

    def covers(self, offset: int, length: int) -> bool:
        return self.offset <= offset and offset + length <= self.offset + self.size


#: The fuzz keys reserved for writes, by size: small ones (copied from the node's buffer)
#: and one received straight into the segment.
WRITE_SIZES = (4096, 300 << 10)


class Targets:
    """Every canary replica with a fresh read capability, and fresh reservations of fuzz keys
    with their write capabilities, asked for again now and then. (The reservations are never
    committed: the master takes them back after its reservation timeout.)"""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.asked = -REFRESH_S
        self.targets: list[Target] = []
        self.rounds = 0

    def current(self) -> list[Target]:
        if time.monotonic() - self.asked >= REFRESH_S:
            self.rounds += 1
            self.targets = self._readable() + self._writable()
            self.asked = time.monotonic()
        return self.targets

    def _readable(self) -> list[Target]:
        keys = sorted(self.watch.canaries)
        answer = self.watch.stub.GetReplicas(
            pb.GetReplicasRequest(client_id="fuzz-checked", keys=keys),
            timeout=10,
            metadata=self.watch.metadata[Role.CLIENT],
        )
        segments = {s.segment_id: s for s in answer.segments}
        targets = []
        for key, location in zip(keys, answer.objects, strict=True):
            assert location.status == pb.OK, (key, location.status)
            data = self.watch.canaries[key]
            for replica in location.replicas:
                segment = segments[replica.segment_id]
                assert replica.capability, "the master grants a capability for the stream"
                assert segment.checked_address, "the node serves the checked stream"
                offset = replica.address - segment.base_address
                targets.append(
                    Target(
                        key, data, len(data), replica.capability, segment.checked_address, offset
                    )
                )
        return targets

    def _writable(self) -> list[Target]:
        keys = [f"fuzz/checked/{self.rounds}/{size}" for size in WRITE_SIZES]
        answer = self.watch.stub.PutStart(
            pb.PutStartRequest(
                client_id="fuzz-checked", keys=keys, sizes=list(WRITE_SIZES), replicas=2
            ),
            timeout=10,
            metadata=self.watch.metadata[Role.CLIENT],
        )
        segments = {s.segment_id: s for s in answer.segments}
        targets = []
        for key, size, slot in zip(keys, WRITE_SIZES, answer.slots, strict=True):
            assert slot.status == pb.OK, (key, slot.message)
            for replica in slot.replicas:
                segment = segments[replica.segment_id]
                assert replica.capability, "the master grants a write capability"
                offset = replica.address - segment.base_address
                targets.append(
                    Target(
                        key,
                        b"",
                        size,
                        replica.capability,
                        segment.checked_address,
                        offset,
                        writable=True,
                    )
                )
        return targets


@pytest.fixture(scope="module")
def targets(watch: Watch) -> Targets:
    return Targets(watch)


# ---------------------------------------------------------------- generated requests


@dataclass(frozen=True)
class Spec:
    """One request of a case, as drawn: how each field relates to the target's."""

    op: int
    capability: str  # "real", "flipped", "made up"
    flip: tuple[int, int]  # (byte, xor mask) for "flipped"
    made_up: bytes
    offset: tuple[str, int]  # ("exact" | "near" | "any", value or delta)
    length: tuple[str, int]  # ("exact" | "near" | "any", value or delta)
    payload: str  # "whole" | "short" (writes)
    header_damage: tuple[int, int] | None  # (byte of the header, xor mask)
    junk: bytes | None  # sent instead of the request


def _near(spread: int) -> st.SearchStrategy[tuple[str, int]]:
    return st.tuples(st.just("near"), st.integers(-spread, spread))


#: An offset or a length: mostly the capability's own, else near it, now and then anything.
PLACES = weighted(
    (4, st.just(("exact", 0))),
    (2, _near(64)),
    (1, _near(8192)),
    (1, st.tuples(st.just("any"), integers(0, 2**64 - 1))),
)
# (most requests are close to a real one, so that the node's checks, not its parser, are
# what most of them reach)
specs = st.builds(
    Spec,
    op=weighted(
        (4, st.just(int(frames.Op.READ))),
        (1, st.just(int(frames.Op.WRITE))),
        (1, st.integers(0, 255)),
    ),
    capability=weighted((2, st.just("real")), (1, st.just("flipped")), (1, st.just("made up"))),
    flip=st.tuples(st.integers(0, caps.SIZE - 1), st.integers(1, 255)),
    made_up=st.binary(min_size=caps.SIZE, max_size=caps.SIZE),
    offset=PLACES,
    length=PLACES,
    payload=weighted((2, st.just("whole")), (1, st.just("short"))),
    header_damage=weighted(
        (9, st.none()),
        (1, st.tuples(st.integers(0, frames.REQUEST_SIZE - 1), st.integers(1, 255))),
    ),
    junk=weighted((11, st.none()), (1, st.binary(min_size=1, max_size=400))),
)


@dataclass(frozen=True)
class Sent:
    """A request as sent, and what the node may answer to it."""

    request_id: int
    op: int
    offset: int
    length: int
    target: Target
    genuine: bool  # the capability is the master's, unchanged
    whole: bool = False  # as many bytes followed the header as it names (set by the case)


def build(spec: Spec, target: Target, request_id: int) -> tuple[bytes, Sent | None]:
    """The bytes of one request (or junk), and what the node reads in its header: None where
    it cannot (it then answers BAD_REQUEST, or nothing, and closes)."""
    if spec.junk is not None:
        return spec.junk, _as_read(spec.junk[: frames.REQUEST_SIZE], target)
    capability = target.capability
    if spec.capability == "flipped":
        at, mask = spec.flip
        capability = capability[:at] + bytes([capability[at] ^ mask]) + capability[at + 1 :]
    elif spec.capability == "made up":
        capability = spec.made_up
    offset = _relative(spec.offset, target.offset, 2**64 - 1)
    length = _relative(spec.length, target.size, 2**64 - 1)
    header = bytearray(
        frames._REQUEST.pack(
            frames.REQUEST_MAGIC, frames.VERSION, spec.op, 0, request_id, capability, offset, length
        )
    )
    if spec.header_damage is not None:
        at, mask = spec.header_damage
        header[at] ^= mask
    payload = b""
    if spec.op == frames.Op.WRITE:  # (as drawn: a damaged length puts the stream out of step)
        whole = min(length, PAYLOAD_CAP)
        payload = b"\xee" * (whole if spec.payload == "whole" else whole // 2)
    return bytes(header) + payload, _as_read(bytes(header), target)


def _as_read(header: bytes, target: Target) -> Sent | None:
    """The request the node reads in ``header``, or None where it is not one."""
    try:
        request = frames.parse_request(header)
    except frames.FrameError:
        return None
    genuine = request.capability == target.capability
    return Sent(request.request_id, request.op, request.offset, request.length, target, genuine)


def _relative(drawn: tuple[str, int], exact: int, high: int) -> int:
    kind, value = drawn
    if kind == "exact":
        return exact
    if kind == "near":
        return min(max(exact + value, 0), high)
    return value


# ---------------------------------------------------------------- the conversation


def converse(address: str, data: bytes) -> bytes:
    """Sends ``data``, stops writing, and reads until the node ends the connection: what
    came. (The node reads and drops what it leaves unread before it closes: a reset, which
    would drop answers still on their way, fails the case.)"""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + CASE_DEADLINE_S
    answer = bytearray()
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"the node kept the connection open past {CASE_DEADLINE_S} s"
            connection.settimeout(left)
            try:
                chunk = connection.recv(1 << 20)
            except TimeoutError:
                raise AssertionError(
                    f"the node kept the connection open past {CASE_DEADLINE_S} s"
                ) from None
            if not chunk:
                return bytes(answer)
            answer += chunk


def check_answers(answer: bytes, sent: list[Sent | None]) -> None:
    """Each reply answers the next request in order; bytes move only as granted."""
    at = 0
    for request in sent:
        if at == len(answer):
            return  # (closed: at a request it could not read, or one it refused for good)
        assert len(answer) - at >= frames.REPLY_SIZE, f"a cut reply: {answer[at:]!r}"
        reply = frames.parse_reply(answer[at : at + frames.REPLY_SIZE])
        at += frames.REPLY_SIZE
        event(f"status {reply.status.name}")
        if request is None or reply.status is frames.Status.BAD_REQUEST:
            assert reply.status is not frames.Status.OK, "a damaged request was served"
            assert at == len(answer), "the node answered past a request it could not read"
            return
        assert reply.request_id == request.request_id, "answered out of order"
        if reply.status is not frames.Status.OK:
            continue
        target = request.target
        assert request.genuine, f"answered OK for an altered capability: {request}"
        assert target.covers(request.offset, request.length), (
            f"answered OK outside the capability's range: {request}"
        )
        if request.op == frames.Op.WRITE:
            assert target.writable, f"a write with a read capability answered OK: {request}"
            assert request.whole, f"a write answered OK before all its bytes came: {request}"
            continue
        assert not target.writable, f"a read with a write capability answered OK: {request}"
        assert reply.length == request.length
        start = request.offset - target.offset
        data = answer[at : at + reply.length]
        assert len(data) == reply.length, f"a read's bytes cut short: {request}"
        assert data == target.data[start : start + len(data)], (
            f"a read returned other bytes than the canary's: {request}"
        )
        at += reply.length
    assert at == len(answer), "more replies than requests"


@SETTINGS
@given(
    cases=st.lists(st.tuples(specs, st.integers(0, 2**16)), min_size=1, max_size=6),
    node=st.integers(0, 2**16),
)
def test_generated_requests_move_bytes_only_as_granted(watch: Watch, targets: Targets, cases, node):
    every = targets.current()
    addresses = sorted({t.checked_address for t in every})
    address = addresses[node % len(addresses)]
    mine = [t for t in every if t.checked_address == address]
    data = bytearray()
    sent: list[Sent | None] = []
    header_ends = []
    for request_id, (spec, pick) in enumerate(cases, start=1):
        part, request = build(spec, mine[pick % len(mine)], request_id)
        header_ends.append(len(data) + frames.REQUEST_SIZE)
        data += part
        sent.append(request)
    # (a write's payload is whatever bytes follow its header: a short one takes the next
    # request's, and the node, out of step, then refuses what it reads as a header)
    sent = [
        None if r is None else dataclasses.replace(r, whole=len(data) - end >= r.length)
        for r, end in zip(sent, header_ends, strict=True)
    ]
    check_answers(converse(address, bytes(data)), sent)
    watch.after_case()


def test_the_fuzzer_aims_at_every_canary_and_a_reservation_on_every_node(
    watch: Watch, targets: Targets
):
    every = targets.current()
    readable = [t for t in every if not t.writable]
    assert {t.key for t in readable} == set(watch.canaries)
    assert all(t.key.startswith(CANARY_PREFIX) for t in readable)
    writable = [t for t in every if t.writable]
    assert {t.size for t in writable} == set(WRITE_SIZES)
    nodes = {t.checked_address for t in every}
    assert len(nodes) == len(watch.cluster.nodes) == 2
    assert {t.checked_address for t in writable} == nodes
