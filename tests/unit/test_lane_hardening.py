"""What one unauthenticated peer can make the master's metadata lane hold is bounded
(master/lane_server.py): a real LaneServer on loopback that checks tokens (a credentials file
with a client's and a node's), with the real handlers, driver and core behind it, and plain
sockets for peers.

- Before a connection has proven who it is (its first frame, AUTH, with a token), it is read
  in frames of at most ``lp.AUTH_LIMIT`` bytes; any other first frame, or a token the master
  does not know, is answered UNAUTHENTICATED and the connection closed, nothing done. A
  client's token opens no node's command stream.
- A frame announcing more than the largest legal request is refused at its header: the
  connection is closed before its body is read. A node's reports have a smaller limit.
- A connection that sends part of a frame and then nothing is closed after the read timeout;
  one whose frame trickles in, once it has taken twice the read timeout plus its size at
  ``FRAME_RATE_FLOOR``; one that has not proven who it is by the read timeout after it
  connected, whatever it sends meanwhile; one with no call in flight, after the idle
  timeout. A node's command stream, and a client waiting for an answer, are not. A close
  that cannot end (its answers unread) is made an abort after the read timeout.
- Beyond the connection cap, a new connection is closed at once.
- A connection whose answers are not being read is not read either; once they are, every
  request is answered, in order. Left unread for the read timeout, it is closed.
- The client's end makes a new connection, unseen by its caller, where the master closed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import closed_within, wait_until
from prometheus_client import REGISTRY
from state_helpers import segment_info

from kvpool.client.lane_client import LaneClient
from kvpool.common import lane_protocol as lp
from kvpool.common.keys import MAX_KEY_BYTES, STORED_KEY_BYTES
from kvpool.common.limits import GRPC_REQUEST_LIMIT
from kvpool.common.status import KeyStatus
from kvpool.master import handlers as master_handlers
from kvpool.master.authenticator import Authenticator
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.driver import CoreDriver
from kvpool.master.election import AlwaysLeader
from kvpool.master.handlers import MasterHandlers
from kvpool.master.lane_server import WRITE_HIGH, LaneServer
from kvpool.master.leader_gate import LeaderGate
from kvpool.master.load_shedding import LoadShedder
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb
from kvpool.security.caller import CallerCredentials
from kvpool.security.identity import Role
from kvpool.security.tokens import CredentialStore, new_token
from kvpool.transport import worker_address

#: What a UCX worker address may take: every PutStart answer carries its segment's.
WORKER_ADDRESS_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class Credentials:
    """The master's credentials file, and the tokens it knows."""

    store: CredentialStore
    #: A client's, of tenant "default".
    client: str
    #: Node n1's (the node whose segment the master holds).
    node: str


class RunningLane:
    """A LaneServer on 127.0.0.1 that checks ``credentials``, on an event loop of its own
    thread (peers here block)."""

    def __init__(self, credentials: Credentials, **options: Any) -> None:
        self.credentials = credentials
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.lane: LaneServer = self.run(self._start(options))
        self.port = self.lane.port

    async def _start(self, options: dict[str, Any]) -> LaneServer:
        state = MasterState(MasterConfig(), clock=time.monotonic, epoch=1)
        segment = segment_info("n1", 1 << 30)
        state.mount_segment(
            dataclasses.replace(segment, worker_address=b"w" * WORKER_ADDRESS_BYTES), []
        )
        handlers = MasterHandlers(CoreDriver(MasterCore(state)))
        gate = LeaderGate(AlwaysLeader(), lambda: None)
        auth = Authenticator(self.credentials.store)
        lane = LaneServer(handlers, gate, LoadShedder(10_000), auth, **options)
        await lane.start("127.0.0.1", 0)
        return lane

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    def inspect(self, look: Callable[[LaneServer], Any]) -> Any:
        """``look(lane)``, run on the lane's own thread."""

        async def looking() -> Any:
            return look(self.lane)

        return self.run(looking())

    def connections(self) -> int:
        return self.inspect(lambda lane: len(lane._connections))

    def client(self, receive_buffer: int = 0) -> socket.socket:
        """A connection that proved itself a client's."""
        return authenticated(self.port, self.credentials.client, receive_buffer)

    def node(self) -> socket.socket:
        """A connection that proved itself node n1's."""
        return authenticated(self.port, self.credentials.node)

    def stop(self) -> None:
        self.run(self.lane.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def credentials(tmp_path) -> Credentials:
    store = CredentialStore.create(tmp_path / "credentials.json")
    client, record = new_token("t", Role.CLIENT, tenant="default")
    store.add(record)
    node, record = new_token("n1", Role.NODE, node_id="n1")
    store.add(record)
    return Credentials(store, client, node)


@pytest.fixture
def lanes(credentials: Credentials) -> Iterator[Callable[..., RunningLane]]:
    started: list[RunningLane] = []

    def start(**options: Any) -> RunningLane:
        started.append(RunningLane(credentials, **options))
        return started[-1]

    yield start
    for running in started:
        running.stop()


def connect(port: int, receive_buffer: int = 0) -> socket.socket:
    sock = socket.socket()
    if receive_buffer:  # (before connecting: it sets the window the peer may fill)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return sock


def authenticated(port: int, token: str, receive_buffer: int = 0) -> socket.socket:
    """A connection whose first frame, AUTH with ``token``, the master accepted."""
    sock = connect(port, receive_buffer)
    sock.sendall(lp.encode(7, lp.AUTH, token.encode()))
    [accepted] = read_frames(sock, 1)
    assert (accepted.call_id, accepted.method, accepted.status) == (7, lp.AUTH, lp.OK)
    return sock


def request(call_id: int, method: str, message: Any) -> bytes:
    return lp.encode(call_id, lp.METHOD_IDS[method], message.SerializeToString())


def read_frames(sock: socket.socket, count: int, timeout: float = 10) -> list[lp.Frame]:
    decoder, frames = lp.FrameDecoder(), []
    sock.settimeout(timeout)
    while len(frames) < count:
        data = sock.recv(1 << 20)
        assert data, f"closed after {len(frames)} of {count} frames"
        frames += decoder.feed(data)
    return frames


def exists(sock: socket.socket, call_id: int = 1) -> lp.Frame:
    sock.sendall(request(call_id, "Exists", pb.ExistsRequest(client_id="c", keys=["k"])))
    [answer] = read_frames(sock, 1)
    return answer


def closed_for(reason: str) -> float:
    name = "kvpool_master_lane_connections_closed_total"
    return REGISTRY.get_sample_value(name, {"reason": reason}) or 0.0


def node_hello(node_id: str = "n1") -> bytes:
    hello = pb.NodeReport(hello=pb.NodeHello(node_id=node_id))
    return lp.encode(0, lp.NODE_SESSION, hello.SerializeToString())


def has_node_stream(lane: LaneServer) -> bool:
    return any(connection._stream is not None for connection in lane._connections)


# ---- frame limits


def test_the_largest_legal_requests_fit_the_request_limit_and_a_byte_more_is_refused():
    assert lp.MAX_BATCH_KEYS == master_handlers.MAX_BATCH
    keys = [f"{i:0{MAX_KEY_BYTES}d}" for i in range(lp.MAX_BATCH_KEYS)]  # 1 KiB each
    most = 2**64 - 1
    replicas = MasterConfig().max_replicas
    start = pb.PutStartRequest(
        client_id="c" * 64, keys=keys, sizes=[most] * len(keys), replicas=replicas
    )
    assert start.ByteSize() <= lp.REQUEST_LIMIT
    del start
    commits = [
        pb.PutCommit(key=k, put_id=most, replica_ok=[True] * replicas, crc32c=2**32 - 1)
        for k in keys
    ]
    assert pb.PutEndRequest(client_id="c" * 64, commits=commits).ByteSize() <= lp.REQUEST_LIMIT
    del commits
    revoke = pb.PutRevokeRequest(client_id="c" * 64, keys=keys, put_ids=[most] * len(keys))
    assert revoke.ByteSize() <= lp.REQUEST_LIMIT

    decoder = lp.FrameDecoder(lp.REQUEST_LIMIT)
    assert decoder.feed(lp.HEADER.pack(lp.REQUEST_LIMIT, 1, 1, 0)) == []
    assert decoder.pending, "announced, and waited for"
    with pytest.raises(lp.LaneProtocolError, match="exceeds"):
        lp.FrameDecoder(lp.REQUEST_LIMIT).feed(lp.HEADER.pack(lp.REQUEST_LIMIT + 1, 1, 1, 0))


def test_the_largest_mount_report_part_fits_the_master_s_grpc_request_limit():
    """A mount (gRPC only) carries a part of the segment's objects: at most a batch of them,
    each of the longest stored key and the largest numbers, beside the largest segment."""
    most = 2**64 - 1
    segment = pb.Segment(
        segment_id="s" * 256,
        node_id="n" * 256,
        host="h" * 256,
        worker_address=b"w" * worker_address.MAX_BYTES,
        base_address=most,
        size=most,
        rkey=b"r" * 4096,
        tier=pb.NVME,
        persistent=True,
        checked_address="c" * 300,
        tenant="t" * 63,
    )
    objects = [
        pb.StoredObject(
            key=f"{i:0{STORED_KEY_BYTES}d}",
            offset=most,
            size=most,
            crc32c=2**32 - 1,
            generation=most,
            replicas=2**32 - 1,
        )
        for i in range(lp.MAX_BATCH_KEYS)
    ]
    mount = pb.MountSegmentRequest(
        segment=segment,
        objects=objects,
        remount=True,
        silent_ms=most,
        incarnation="i" * 64,
        more=True,
        continued=True,
    )
    assert lp.REQUEST_LIMIT < mount.ByteSize() <= GRPC_REQUEST_LIMIT


def test_the_largest_node_report_fits_the_report_limit():
    result = pb.CommandResult(
        command_id=2**64 - 1,
        error="\U0001f4a5" * lp.REPORT_ERROR_CHARS,  # four bytes of UTF-8 each
        crc32c=[2**32 - 1] * lp.MAX_BATCH_KEYS,
    )
    assert pb.NodeReport(result=result).ByteSize() <= lp.REPORT_LIMIT < lp.REQUEST_LIMIT


def test_a_frame_announcing_more_than_the_largest_request_is_refused_at_its_header(lanes):
    running = lanes()
    before = closed_for("bad_frame")
    sock = running.client()
    header = lp.HEADER.pack(255 << 20, 1, lp.METHOD_IDS["PutStart"], lp.OK)
    with contextlib.suppress(OSError):  # (closed before all of it went)
        sock.sendall(header + bytes(1 << 20))
    assert closed_within(sock, 5), "the master waited for the body"
    assert running.connections() == 0
    assert closed_for("bad_frame") == before + 1


def test_a_node_report_beyond_the_report_limit_closes_the_stream(lanes):
    running = lanes()
    node = running.node()
    node.sendall(node_hello())
    assert wait_until(lambda: running.inspect(has_node_stream), 5)
    with contextlib.suppress(OSError):
        node.sendall(lp.HEADER.pack(lp.REPORT_LIMIT + 1, 0, lp.NODE_SESSION, lp.OK))
    assert closed_within(node, 5)


# ---- before authentication


def nothing_done(lane: LaneServer) -> bool:
    """No object, no call in flight, no command stream: the master as it started."""
    state = lane.handlers.core.state
    return not state.objects and not lane.shedder.inflight and not has_node_stream(lane)


def test_before_authentication_a_frame_announcing_more_than_a_token_is_refused_at_its_header(
    lanes,
):
    running = lanes()
    before = closed_for("bad_frame")
    for method in (lp.AUTH, lp.METHOD_IDS["PutStart"]):
        sock = connect(running.port)
        sock.sendall(lp.HEADER.pack(lp.AUTH_LIMIT + 1, 1, method, lp.OK))  # and no body
        assert closed_within(sock, 5), "the master waited for the body"
    assert wait_until(lambda: running.connections() == 0, 5)
    assert closed_for("bad_frame") == before + 2
    assert running.inspect(nothing_done)


def test_a_request_before_authentication_is_answered_unauthenticated_and_closed(lanes):
    running = lanes()
    sock = connect(running.port)
    start = pb.PutStartRequest(client_id="c", keys=["k"], sizes=[4096], replicas=1)
    sock.sendall(request(3, "PutStart", start) + node_hello())
    [refused] = read_frames(sock, 1)
    assert (refused.call_id, refused.status) == (3, lp.UNAUTHENTICATED)
    assert "AUTH" in refused.error()[0], "it says what to send first"
    assert closed_within(sock, 5), "and nothing after it is read"
    assert wait_until(lambda: running.connections() == 0, 5)
    assert running.inspect(nothing_done)


@pytest.mark.parametrize(
    "token",
    [
        new_token("stranger", Role.CLIENT, tenant="default")[0],  # well formed, not in the file
        "Bearer not-a-kvpool-token",
        "",
    ],
    ids=["unknown", "malformed", "empty"],
)
def test_an_auth_frame_with_a_token_the_master_does_not_know_is_refused_and_closed(lanes, token):
    running = lanes()
    sock = connect(running.port)
    sock.sendall(lp.encode(5, lp.AUTH, token.encode()))
    [refused] = read_frames(sock, 1)
    assert (refused.call_id, refused.method, refused.status) == (5, lp.AUTH, lp.UNAUTHENTICATED)
    assert closed_within(sock, 5)
    assert wait_until(lambda: running.connections() == 0, 5)
    assert running.inspect(nothing_done)


def test_a_secret_for_a_known_token_id_that_is_wrong_is_refused(lanes):
    running = lanes()
    token_id = running.credentials.client.split(".")[1]
    sock = connect(running.port)
    sock.sendall(lp.encode(1, lp.AUTH, f"kvp1.{token_id}.{'x' * 43}".encode()))
    [refused] = read_frames(sock, 1)
    assert refused.status == lp.UNAUTHENTICATED
    assert closed_within(sock, 5)


@pytest.mark.parametrize("whose", ["client", "another node"])
def test_a_node_session_from_credentials_not_of_that_node_is_refused(lanes, credentials, whose):
    running = lanes()
    if whose == "client":
        token = credentials.client
    else:
        token, record = new_token("n2", Role.NODE, node_id="n2")
        credentials.store.add(record)
    sock = authenticated(running.port, token)
    sock.sendall(node_hello("n1"))
    [refused] = read_frames(sock, 1)
    assert (refused.method, refused.status) == (lp.NODE_SESSION, lp.PERMISSION_DENIED)
    assert closed_within(sock, 5)
    assert wait_until(lambda: running.connections() == 0, 5)
    assert running.inspect(nothing_done), "no command stream opened"


# ---- deadlines


@pytest.mark.parametrize("proven", [False, True], ids=["its AUTH frame", "a request"])
def test_a_partial_frame_then_silence_is_closed_after_the_read_timeout(lanes, proven):
    running = lanes(read_timeout=0.5)
    reason = "read_timeout" if proven else "unauthenticated"  # (whichever says it first)
    before = closed_for(reason)
    # (from before the connection: an unproven one's deadline runs from its accept, which a
    # clock read after the send comes later than, by up to a scheduling delay)
    began = time.monotonic()
    if proven:
        sock = running.client()
        frame = request(1, "Exists", pb.ExistsRequest(client_id="c", keys=["k"]))
    else:
        sock = connect(running.port)
        frame = lp.encode(1, lp.AUTH, running.credentials.client.encode())
    sock.sendall(frame[:5])
    assert closed_within(sock, 5)
    assert time.monotonic() - began >= 0.5
    assert closed_for(reason) == before + 1


def test_a_frame_sent_in_pieces_is_read_when_it_arrives_within_its_deadline(lanes):
    running = lanes(read_timeout=3.0)
    sock = running.client()
    frame = request(1, "Exists", pb.ExistsRequest(client_id="c", keys=["k"]))
    step = -(-len(frame) // 5)
    for start in range(0, len(frame), step):  # five pieces, 0.3 s apart
        sock.sendall(frame[start : start + step])
        time.sleep(0.3)
    [answer] = read_frames(sock, 1)
    assert answer.status == lp.OK


def trickle(sock: socket.socket, data: bytes, every: float) -> threading.Thread:
    """Sends ``data`` a byte at a time, ``every`` seconds apart, until the peer closes."""

    def run() -> None:
        with contextlib.suppress(OSError):
            for at in range(len(data)):
                sock.sendall(data[at : at + 1])
                time.sleep(every)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_frame_trickled_a_byte_at_a_time_is_closed_though_bytes_keep_coming(lanes):
    """(Each byte within the read timeout of the last would hold the connection, and the
    request memory its header reserved, for as long as the frame is: hours.)"""
    running = lanes(read_timeout=0.5)
    before = closed_for("slow_frame")
    sock = running.client()
    frame = request(1, "Exists", pb.ExistsRequest(client_id="c", keys=["k"] * 8))
    started = time.monotonic()
    sender = trickle(sock, frame, every=0.1)  # never silent for the read timeout
    assert closed_within(sock, 5.0)
    assert time.monotonic() - started < len(frame) * 0.1, "the frame was whole first"
    assert closed_for("slow_frame") == before + 1
    sender.join(timeout=10)


def test_credentials_trickled_a_byte_at_a_time_are_closed_at_the_read_timeout(lanes):
    running = lanes(read_timeout=0.5, idle_timeout=60)
    before = closed_for("unauthenticated")
    sock = connect(running.port)
    sender = trickle(sock, lp.encode(1, lp.AUTH, running.credentials.client.encode()), 0.1)
    assert closed_within(sock, 3.0)
    assert closed_for("unauthenticated") == before + 1
    sender.join(timeout=10)


def test_a_client_connection_with_no_call_in_flight_is_closed_after_the_idle_timeout(lanes):
    running = lanes(read_timeout=0.5, idle_timeout=1.5)
    before = closed_for("idle")
    sock = running.client()
    assert exists(sock).status == lp.OK
    assert not closed_within(sock, 1.0), "closed at the read timeout, with no frame begun"
    assert closed_within(sock, 3.0)
    assert closed_for("idle") == before + 1


def test_a_connection_that_sends_no_credentials_is_closed_after_the_read_timeout(lanes):
    running = lanes(read_timeout=0.5, idle_timeout=60)
    before = closed_for("unauthenticated")
    sock = connect(running.port)  # connected, and silent: it holds a slot of the cap
    assert closed_within(sock, 3.0), "not kept for the idle timeout"
    assert closed_for("unauthenticated") == before + 1


def test_a_node_stream_and_a_call_waiting_for_it_outlive_the_idle_timeout(lanes):
    running = lanes(read_timeout=0.5, idle_timeout=0.5)
    node = running.node()
    node.sendall(node_hello())
    assert wait_until(lambda: running.inspect(has_node_stream), 5)
    client = running.client()
    start = pb.PutStartRequest(client_id="c", keys=["k"], sizes=[4096], replicas=1)
    client.sendall(request(1, "PutStart", start))
    [started] = read_frames(client, 1)
    put_id = pb.PutStartResponse.FromString(started.body).slots[0].put_id
    commit = pb.PutCommit(key="k", put_id=put_id, replica_ok=[True])
    client.sendall(request(2, "PutEnd", pb.PutEndRequest(client_id="c", commits=[commit])))
    [persist] = read_frames(node, 1)  # the PutEnd waits for the node to record the object

    time.sleep(1.5)  # three idle timeouts
    assert running.connections() == 2, "neither the node's stream nor the waiting client closed"

    command_id = pb.NodeCommand.FromString(persist.body).command_id
    answer = pb.NodeReport(result=pb.CommandResult(command_id=command_id, ok=True))
    node.sendall(lp.encode(0, lp.NODE_SESSION, answer.SerializeToString()))
    [ended] = read_frames(client, 1)
    assert list(pb.PutEndResponse.FromString(ended.body).statuses) == [KeyStatus.OK]


# ---- request memory

#: A large frame: more than half the smallest request memory a lane may have.
LARGE = lp.REQUEST_LIMIT * 3 // 4  # (two do not fit in REQUEST_LIMIT, a small call does)


def large_frame(call_id: int) -> bytes:
    """A PutStart of LARGE bytes that does not parse: answered INVALID_ARGUMENT once read."""
    return lp.HEADER.pack(LARGE, call_id, lp.METHOD_IDS["PutStart"], lp.OK) + b"\xff" * LARGE


def sending(sock: socket.socket, data: bytes) -> threading.Thread:
    """Sends ``data`` on a thread of its own (it blocks while the master does not read)."""
    sock.settimeout(30)
    thread = threading.Thread(target=sock.sendall, args=(data,), daemon=True)
    thread.start()
    return thread


def memory_waits() -> float:
    return REGISTRY.get_sample_value("kvpool_master_lane_request_memory_waits_total") or 0.0


def test_a_large_frame_beyond_the_request_memory_waits_unread_and_small_calls_go_on(lanes):
    """Each large frame still arriving holds its announced size of ``request_memory``; one
    that does not fit is not read until another gives its share back."""
    running = lanes(request_memory=lp.REQUEST_LIMIT)
    waits = memory_waits()
    first, second, small = running.client(), running.client(), running.client()
    frame = large_frame(1)
    first.sendall(frame[: LARGE // 2])
    assert wait_until(lambda: running.inspect(lambda lane: lane.reserved) == LARGE, 5)

    second_sends = sending(second, large_frame(2))
    assert wait_until(lambda: running.inspect(lambda lane: len(lane._waiting)) == 1, 5)
    assert memory_waits() == waits + 1
    time.sleep(0.5)
    # (the kernel's socket buffers may take the whole frame: the lane's own state says it
    # was left unread)
    assert running.inspect(lambda lane: len(lane._waiting)) == 1, "the master read the second"
    assert running.inspect(lambda lane: lane.reserved) == LARGE
    assert exists(small).status == lp.OK, "a small call waits for nothing"

    first.sendall(frame[LARGE // 2 :])
    [answer] = read_frames(first, 1)
    assert (answer.call_id, answer.status) == (1, lp.INVALID_ARGUMENT)
    [answer] = read_frames(second, 1, timeout=30)
    assert (answer.call_id, answer.status) == (2, lp.INVALID_ARGUMENT)
    second_sends.join(5)
    assert running.inspect(lambda lane: (lane.reserved, len(lane._waiting))) == (0, 0)


def test_a_frame_waiting_for_request_memory_outlives_the_read_timeout_and_gets_it_back(lanes):
    """The holder that goes silent is closed at the read timeout and gives its share back;
    the waiter, silent because the master does not read it, is not closed."""
    running = lanes(request_memory=lp.REQUEST_LIMIT, read_timeout=0.5)
    holder, waiter = running.client(), running.client()
    holder.sendall(large_frame(1)[: 1 << 20])
    assert wait_until(lambda: running.inspect(lambda lane: lane.reserved) == LARGE, 5)
    started = time.monotonic()
    waiter_sends = sending(waiter, large_frame(2))
    assert closed_within(holder, 5)
    [answer] = read_frames(waiter, 1, timeout=30)
    assert (answer.call_id, answer.status) == (2, lp.INVALID_ARGUMENT)
    assert time.monotonic() - started >= 0.5
    waiter_sends.join(5)
    assert running.inspect(lambda lane: (lane.reserved, len(lane._waiting))) == (0, 0)


def test_the_request_memory_must_hold_the_largest_request(lanes):
    with pytest.raises(ValueError, match="largest request"):
        lanes(request_memory=lp.REQUEST_LIMIT - 1)


# ---- the connection cap


def test_connections_beyond_the_cap_are_closed_at_once(lanes):
    running = lanes(max_connections=3)
    before = closed_for("over_cap")
    peers = [running.client() for _ in range(3)]
    for peer in peers:
        assert exists(peer).status == lp.OK

    assert closed_within(connect(running.port), 2)
    assert closed_for("over_cap") == before + 1

    peers.pop().close()
    assert wait_until(lambda: running.connections() == 2, 5)
    assert exists(running.client()).status == lp.OK, "a place freed is taken again"


# ---- backpressure


def flood(sock: socket.socket, count: int) -> None:
    """``count`` PutStarts in one go: each answer carries a segment (its worker address), many
    times the request's size."""
    sock.sendall(
        b"".join(
            request(i, "PutStart", pb.PutStartRequest(client_id="c", keys=[f"k{i}"], sizes=[1]))
            for i in range(1, count + 1)
        )
    )


def client_side(lane: LaneServer) -> tuple[bool, int]:
    """(reading, bytes of answers waiting to be written) of the only client's connection."""
    [connection] = lane._connections
    transport = connection.transport
    return transport.is_reading(), transport.get_write_buffer_size()


def test_a_client_that_does_not_read_its_answers_is_not_read_until_it_does(lanes):
    running = lanes()
    sock = running.client(receive_buffer=4096)
    count = 4000  # answers of some 16 MiB: more than the sockets' buffers hold
    flood(sock, count)

    assert wait_until(lambda: not running.inspect(client_side)[0], 10), "never stopped reading"
    time.sleep(0.2)
    reading, buffered = running.inspect(client_side)
    assert not reading
    assert buffered <= WRITE_HIGH + WORKER_ADDRESS_BYTES + 1024, "one answer past the mark"

    answers = read_frames(sock, count, timeout=30)
    assert [a.call_id for a in answers] == list(range(1, count + 1)), "all of them, in order"
    assert {a.status for a in answers} == {lp.OK}
    assert running.inspect(client_side)[0], "reading again"


def test_a_client_that_never_reads_its_answers_is_closed_after_the_read_timeout(lanes):
    """(On a busy machine the peer's own writes may stall mid-frame first, when the master
    stopped reading it: then it is closed for that, after the same timeout.)"""
    running = lanes(read_timeout=0.5)
    reasons = ("unread_answers", "read_timeout")
    before = sum(closed_for(reason) for reason in reasons)
    sock = running.client(receive_buffer=4096)
    flood(sock, 4000)
    assert wait_until(lambda: running.connections() == 0, 5)
    assert sum(closed_for(reason) for reason in reasons) == before + 1
    sock.close()


def test_a_connection_closed_with_answers_still_unread_is_aborted_after_the_read_timeout(lanes):
    """(A close waits until what is still to be sent has gone: closed idle with answers
    the peer never read, below the mark that stops reading it, it stayed open for ever.)"""
    running = lanes(read_timeout=0.5, idle_timeout=1.0)
    before = closed_for("unread_answers")
    sock = running.client(receive_buffer=4096)

    def never_pause(lane: LaneServer) -> None:  # (so that only the close can end it)
        [connection] = lane._connections
        connection.transport.set_write_buffer_limits(high=1 << 30)

    running.inspect(never_pause)
    flood(sock, 4000)  # answers of some 16 MiB, unread
    assert wait_until(lambda: running.inspect(client_side)[1] > 0, 10)
    assert wait_until(lambda: running.connections() == 0, 8), "closed idle, never aborted"
    assert closed_for("unread_answers") == before + 1
    sock.close()


# ---- the client's end


def test_the_client_connects_again_unseen_where_the_master_closed_an_idle_connection(lanes):
    running = lanes(idle_timeout=0.5)
    token = running.credentials.client
    client = LaneClient("127.0.0.1", running.port, CallerCredentials(token=token))
    request = pb.ExistsRequest(client_id="c", keys=["k"], no_lease=True)

    def ask() -> list[int]:
        return list(client.call("Exists", request, pb.ExistsResponse, timeout=5).statuses)

    assert ask() == [KeyStatus.NOT_FOUND]
    assert wait_until(lambda: running.connections() == 0, 5), "the master closed it, idle"
    assert ask() == [KeyStatus.NOT_FOUND], "on a new connection"
    client.close()
