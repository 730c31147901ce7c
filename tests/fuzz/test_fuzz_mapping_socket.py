"""The mapping socket of real ``kvpool node``s (where a client on the node's host asks for
a segment's file under the master's map grant), fed generated requests by a local process.

Each case is one connection to one node's socket, carrying a request built around a map
grant the master really gave (fresh from it) and then altered: the grant this node's segment
needs, the other node's, one byte of it flipped, cut, lengthened or made up; the mode ``r``,
``w`` or any byte; now and then the magic damaged; sent as one message, with bytes past its
end, cut short, in two messages, as an empty message, not at all (the client stops writing),
or not at all while the connection stays open.

Whatever a local process sends, the node hands over a file only for the exact request of an
unaltered grant of its own segment: one descriptor of that segment's file (the inode the
master named), read-only for ``r`` and read-write for ``w``. Anything else gets a refusal
that says why, and no descriptor; a connection that sends nothing is closed at the node's
deadline. The node closes every connection (no hang), keeps no descriptor or thread of a
case past it, and serves at most ``MAX_CONNECTIONS`` at once while still answering later
requests; the watch's probe, canaries and logs (tests/fuzz/fuzzing.py) hold after every case.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from dataclasses import dataclass, field

import pytest
from fuzzing import Watch, fuzz_settings, share, weighted
from hypothesis import event, given
from hypothesis import strategies as st

from kvpool.proto import master_pb2 as pb
from kvpool.security import capabilities as caps
from kvpool.security import mapping_grants as mg
from kvpool.security.identity import Role
from kvpool.storage_node.mapping_server import IO_TIMEOUT, MAX_CONNECTIONS
from kvpool.transport.shared_memory import peer_credentials

SURFACE = "mapping_socket"
pytestmark = pytest.mark.fuzz
SETTINGS = fuzz_settings(share(1))

#: How long past the node's own deadline a connection may stay open.
SLACK_S = 3.0
#: Grants are asked for again after this (they live GRANT_TTL_MS; the master renews a grant
#: that has less than half of it left, so a fresh ask always brings one with time to spare).
REFRESH_S = 10.0


@dataclass(frozen=True)
class Door:
    """A node's mapping socket, and what the master says about the segment behind it."""

    socket: str
    pid: int
    segment_id: str
    size: int
    inode: int
    grant: bytes = field(repr=False)


class Doors:
    """Both nodes' doors, with the grants the master gives the session's client (asked for
    with the canaries' replicas, on both nodes: ``replicas=2``)."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.asked = -REFRESH_S
        self.doors: list[Door] = []
        #: Each node's (descriptors, threads) before the first case.
        self.usage_at_start = _usage(watch)

    def current(self) -> list[Door]:
        if time.monotonic() - self.asked >= REFRESH_S:
            self.doors = self._ask()
            self.asked = time.monotonic()
        return self.doors

    def _ask(self) -> list[Door]:
        keys = sorted(self.watch.canaries)
        metadata = self.watch.metadata[Role.CLIENT]
        answer = self.watch.stub.GetReplicas(
            pb.GetReplicasRequest(client_id="fuzz-mapping", keys=keys),
            timeout=10,
            metadata=metadata,
        )
        self.watch.stub.ReleaseLeases(
            pb.ReleaseLeasesRequest(client_id="fuzz-mapping", keys=keys),
            timeout=10,
            metadata=metadata,
        )
        doors = []
        for segment in sorted(answer.segments, key=lambda s: s.segment_id):
            assert segment.HasField("shared_memory") and segment.map_capability, (
                "the session's client may map its tenant's nodes (--same-host-clients *)"
            )
            shared = segment.shared_memory
            doors.append(
                Door(
                    shared.socket,
                    shared.pid,
                    segment.segment_id,
                    segment.size,
                    shared.inode,
                    segment.map_capability,
                )
            )
        return doors


@pytest.fixture(scope="module")
def doors(watch: Watch) -> Doors:
    return Doors(watch)


# ---------------------------------------------------------------- generated requests

#: How a request's grant relates to the one the node's segment needs.
GRANTS = ("own", "other node's", "flipped", "cut", "longer", "made up")
#: How the request is sent: "silent" sends nothing and keeps the connection open.
FORMS = ("one message", "bytes past its end", "cut short", "two messages", "empty", "nothing")


@dataclass(frozen=True)
class Visit:
    """One connection's request, as drawn."""

    grant: str
    flip: tuple[int, int]  # (byte, xor mask) for "flipped"
    cut: int  # bytes kept of the grant ("cut"), of the request ("cut short"), or split at
    made_up: bytes
    mode: bytes
    magic_damage: tuple[int, int] | None
    form: str
    extra: bytes

    def request(self, door: Door, other: Door) -> bytes:
        grant = door.grant
        if self.grant == "other node's":
            grant = other.grant
        elif self.grant == "flipped":
            at, mask = self.flip
            grant = grant[:at] + bytes([grant[at] ^ mask]) + grant[at + 1 :]
        elif self.grant == "cut":
            grant = grant[: self.cut % caps.SIZE]
        elif self.grant == "longer":
            grant = grant + self.extra
        elif self.grant == "made up":
            grant = self.made_up
        magic = bytearray(mg.REQUEST_MAGIC)
        if self.magic_damage is not None:
            at, mask = self.magic_damage
            magic[at % len(magic)] ^= mask
        return bytes(magic) + self.mode + grant

    def genuine(self) -> bool:
        """Whether the node must hand the file over (the exact request, an unaltered grant of
        its own segment)."""
        return (
            self.grant == "own"
            and self.magic_damage is None
            and self.mode in (b"r", b"w")
            and self.form == "one message"
        )


visits = st.builds(
    Visit,
    grant=weighted((4, st.just("own")), *((1, st.just(g)) for g in GRANTS[1:])),
    flip=st.tuples(st.integers(0, caps.SIZE - 1), st.integers(1, 255)),
    cut=st.integers(0, mg.REQUEST_SIZE - 1),
    made_up=st.binary(min_size=caps.SIZE, max_size=caps.SIZE),
    mode=weighted((3, st.just(b"r")), (2, st.just(b"w")), (1, st.binary(min_size=1, max_size=1))),
    magic_damage=weighted((9, st.none()), (1, st.tuples(st.integers(0, 3), st.integers(1, 255)))),
    form=weighted((12, st.just("one message")), *((1, st.just(f)) for f in FORMS[1:])),
    extra=st.binary(min_size=1, max_size=4096),
)


# ---------------------------------------------------------------- the conversation


@dataclass
class Answer:
    status: int | None  # None: closed unanswered
    reason: bytes
    fds: list[int]
    seconds: float
    reset: bool = False


def knock(door: Door, visit: Visit, other: Door, silent: bool = False) -> Answer:
    """Sends ``visit``'s request to ``door`` as its form says, then reads the node's answer
    (its first message and any descriptors) and waits until the node closes."""
    started = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as s:
        s.settimeout(IO_TIMEOUT + SLACK_S)
        s.connect("\0" + door.socket)
        assert peer_credentials(s)[0] == door.pid, "the socket is served by the node process"
        if not silent:
            _send(s, visit.request(door, other), visit)
        try:
            message, fds, _, _ = socket.recv_fds(s, 1 + mg.MAX_REASON + 1, 4)
        except TimeoutError:
            raise AssertionError(f"no answer and no close past {IO_TIMEOUT + SLACK_S} s") from None
        except ConnectionResetError:
            # (the node closed with a message of ours unread: the kernel then fails our
            # receive, even of an answer already queued; the node lingers so that it does not)
            return Answer(None, b"", [], time.monotonic() - started, reset=True)
        answer = Answer(message[0] if message else None, message[1:], fds, 0.0)
        try:
            assert s.recv(16) == b"", "one answer per connection"
        except TimeoutError:
            raise AssertionError("the node kept the connection open after answering") from None
    answer.seconds = time.monotonic() - started
    return answer


def _send(s: socket.socket, request: bytes, visit: Visit) -> None:
    try:
        if visit.form == "one message":
            s.send(request)
        elif visit.form == "bytes past its end":
            s.send(request + visit.extra)
        elif visit.form == "cut short":
            s.send(request[: visit.cut % len(request)])
        elif visit.form == "two messages":
            at = visit.cut % len(request)
            s.send(request[:at])
            s.send(request[at:])
        elif visit.form == "empty":
            s.send(b"")
        s.shutdown(socket.SHUT_WR)  # ("nothing": only this)
    except OSError:
        pass  # (the node answered and closed before taking all of ours)


def check(answer: Answer, visit: Visit, door: Door) -> str:
    """The node handed over exactly what a genuine request asks for, and nothing else; what
    it did, in a word or two (for hypothesis's statistics)."""
    try:
        if not visit.genuine():
            assert answer.fds == [], f"descriptors handed over for {visit}"
            assert not answer.reset, f"reset, not refused: {visit}"
            assert answer.status == mg.REFUSED, f"not refused: {answer.status} for {visit}"
            assert answer.reason and len(answer.reason) <= mg.MAX_REASON, answer.reason
            return f"refused: {visit.form}, {visit.grant} grant"
        assert answer.status == mg.HANDED_OVER, (
            f"a genuine request refused: {answer.reason.decode(errors='replace')}"
        )
        assert len(answer.fds) == 1, f"{len(answer.fds)} descriptors for a DRAM segment"
        (fd,) = answer.fds
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        assert access == (os.O_RDWR if visit.mode == b"w" else os.O_RDONLY), (
            f"mode {visit.mode!r} handed over a descriptor open {access:o}"
        )
        stat = os.fstat(fd)
        assert stat.st_ino == door.inode, "the file is the segment the master named"
        assert stat.st_size >= door.size
        return f"handed over: {visit.mode!r}"
    finally:
        for fd in answer.fds:
            os.close(fd)


@SETTINGS
@given(visit=visits, node=st.integers(0, 1))
def test_generated_requests_get_a_segment_s_file_only_under_its_grant(
    watch: Watch, doors: Doors, visit: Visit, node: int
):
    every = doors.current()
    door, other = every[node % len(every)], every[(node + 1) % len(every)]
    event(check(knock(door, visit, other), visit, door))
    watch.after_case()


def test_a_connection_that_sends_nothing_is_closed_at_the_node_s_deadline(
    watch: Watch, doors: Doors
):
    door, other = doors.current()[:2]
    answer = knock(door, VISIT, other, silent=True)
    assert answer.status is None and answer.fds == [], "nothing asked, nothing answered"
    assert IO_TIMEOUT - 0.5 <= answer.seconds <= IO_TIMEOUT + SLACK_S, answer.seconds
    watch.after_case()


#: A genuine read request.
VISIT = Visit("own", (0, 1), 0, b"", b"r", None, "one message", b"x")


def test_connections_past_the_bound_are_closed_at_once_and_the_node_serves_on(
    watch: Watch, doors: Doors
):
    door, other = doors.current()[:2]
    flood = [_silent(door) for _ in range(MAX_CONNECTIONS + 4)]
    try:
        time.sleep(0.5)
        closed_at_once = [s for s in flood if _closed(s, wait=0.1)]
        assert len(closed_at_once) >= 4, "the node serves at most MAX_CONNECTIONS at once"
        deadline = time.monotonic() + IO_TIMEOUT + SLACK_S
        while not all(_closed(s, wait=0.1) for s in flood):
            assert time.monotonic() < deadline, "a silent connection outlived the deadline"
    finally:
        for s in flood:
            s.close()
    check(knock(door, VISIT, other), VISIT, door)
    watch.after_case()


def _silent(door: Door) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    s.connect("\0" + door.socket)
    return s


def _closed(s: socket.socket, wait: float) -> bool:
    s.settimeout(wait)
    try:
        return s.recv(16) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


#: What a node may hold open past the cases all the same (the watch's own client's
#: connections come and go): far fewer than a leak of one per case would leave.
USAGE_SLACK = (16, 4)


def test_the_nodes_keep_no_descriptor_or_thread_of_a_finished_case(watch: Watch, doors: Doors):
    deadline = time.monotonic() + IO_TIMEOUT + SLACK_S
    while True:
        now = _usage(watch)
        grown = {
            pid: (now[pid][0] - fds, now[pid][1] - threads)
            for pid, (fds, threads) in doors.usage_at_start.items()
        }
        if all(f <= USAGE_SLACK[0] and t <= USAGE_SLACK[1] for f, t in grown.values()):
            break
        assert time.monotonic() < deadline, f"(descriptors, threads) grown by node: {grown}"
        time.sleep(0.2)


def _usage(watch: Watch) -> dict[int, tuple[int, int]]:
    """(open descriptors, threads) of each node process."""
    return {
        pid: (len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task")))
        for pid in watch.node_pids
    }
