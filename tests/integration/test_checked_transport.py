"""The checked stream: a storage node moves bytes only under the master's capability.

Real master and node processes, secure (TLS, tokens). Clients that do not map a node's
segments (other hosts; here ``same_host_mapping=False``) move their bytes over the node's
checked stream (storage_node/checked_server.py). The hostile cases talk to the node's port
with frames built by the test from capabilities the master really granted, altered or used
out of their range or time: every one is refused, the bytes it aimed at are unchanged (read
back through a legitimate get), and the node serves on.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from helpers import wait_until

from kvpool import Client
from kvpool.local_cluster import LocalCluster
from kvpool.proto import master_pb2 as pb
from kvpool.storage_node.checked_server import MAX_CONNECTIONS
from kvpool.transport import checked_frames as frames

WRITE_TIMEOUT_S = 1.0
SKEW_MS = 200
#: After this, a write capability granted at PutStart is no longer honoured by the node.
WRITE_GRANT_S = WRITE_TIMEOUT_S + SKEW_MS / 1000
#: The checked stream on a free port (the default; said here so that these tests do not
#: depend on it).
NODE_ARGS = ("--data-port", "0")
MASTER_ARGS = (
    "--write-timeout",
    str(WRITE_TIMEOUT_S),
    "--capability-skew-ms",
    str(SKEW_MS),
    "--client-ttl",
    "2",
)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with LocalCluster(
        1,
        "256MiB",
        master_args=MASTER_ARGS,
        node_args=NODE_ARGS,
        tenants=("default", "other"),
        run_dir=tmp_path_factory.mktemp("checked"),
    ) as cluster:
        yield cluster


def unmapped_client(cluster: LocalCluster, tenant: str) -> Client:
    """A client of ``tenant`` that does not map the node's memory: it moves bytes over the
    checked stream, as one on another host would."""
    return Client(
        cluster.master_address,
        timeout=30,
        same_host_mapping=False,
        **cluster.client_credentials(tenant),
    )


@pytest.fixture(scope="module")
def client(cluster) -> Iterator[Client]:
    with unmapped_client(cluster, "default") as client:
        yield client


@pytest.fixture(scope="module")
def other(cluster) -> Iterator[Client]:
    with unmapped_client(cluster, "other") as client:
        yield client


# ---- the master's grants, as a client gets them


def put_start(client: Client, key: str, size: int) -> tuple[pb.PutSlot, pb.Segment]:
    session = client._session
    session.writing()  # (a client with reservations heartbeats)
    response = session.link.call(
        "PutStart",
        pb.PutStartRequest(client_id=session.client_id, keys=[key], sizes=[size], replicas=1),
        time.monotonic() + 10,
    )
    [slot] = response.slots
    assert slot.status == pb.OK, slot.message
    segments = {s.segment_id: s for s in response.segments}
    return slot, segments[slot.replicas[0].segment_id]


def put_end(client: Client, key: str, slot: pb.PutSlot) -> int:
    session = client._session
    request = pb.PutEndRequest(client_id=session.client_id)
    request.commits.add(key=key, put_id=slot.put_id, replica_ok=[True])
    [status] = session.link.call("PutEnd", request, time.monotonic() + 10).statuses
    return status


def locate(client: Client, key: str, lease_ms: int = 0) -> tuple[pb.Replica, pb.Segment]:
    session = client._session
    response = session.link.call(
        "GetReplicas",
        pb.GetReplicasRequest(client_id=session.client_id, keys=[key], lease_ms=lease_ms),
        time.monotonic() + 10,
    )
    [location] = response.objects
    assert location.status == pb.OK
    replica = location.replicas[0]
    segments = {s.segment_id: s for s in response.segments}
    return replica, segments[replica.segment_id]


def offset_of(replica: pb.Replica, segment: pb.Segment) -> int:
    return replica.address - segment.base_address


# ---- the wire, spoken by hand


def connect(segment: pb.Segment) -> socket.socket:
    assert segment.checked_address, "the node serves the checked stream"
    host, _, port = segment.checked_address.rpartition(":")
    connection = socket.create_connection((host, int(port)), timeout=10)
    connection.settimeout(10)
    return connection


def receive(connection: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return bytes(data)


def ask(
    connection: socket.socket,
    op: frames.Op,
    capability: bytes,
    offset: int,
    length: int,
    payload: bytes = b"",
) -> tuple[frames.Reply, bytes]:
    connection.sendall(frames.encode_request(op, 1, capability, offset, length) + payload)
    reply = frames.parse_reply(receive(connection, frames.REPLY_SIZE))
    data = receive(connection, reply.length) if op is frames.Op.READ and reply.length else b""
    return reply, data


def assert_node_serves(client: Client) -> None:
    key = unique("alive")
    data = os.urandom(64 << 10)
    client.put(key, data)
    assert client.get(key) == data
    client.remove(key, force=True)


def checked_requests(cluster: LocalCluster) -> float:
    import urllib.request

    node = cluster.nodes[0]
    url = f"http://{node.host}:{node.ready['http_port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        lines = response.read().decode().splitlines()
    return sum(
        float(line.split()[-1])
        for line in lines
        if line.startswith("kvpool_node_checked_requests_total{") and 'outcome="ok"' in line
    )


# ---- the bytes go through it


@pytest.mark.parametrize("size", [1, 4096, 4 << 20, 32 << 20], ids=lambda n: f"{n}B")
def test_put_and_get_round_trip_exactly_over_the_checked_stream(cluster, client, size):
    before = checked_requests(cluster)
    key = unique("roundtrip")
    data = os.urandom(size)
    client.put(key, data)
    assert client.get(key) == data
    assert checked_requests(cluster) >= before + 2, "both went through the checked stream"
    client.remove(key, force=True)


def test_batches_round_trip_over_the_checked_stream(cluster, client):
    keys = [unique(f"batch{i}") for i in range(32)]
    values = [os.urandom(4096 + i) for i in range(32)]
    before = checked_requests(cluster)
    client.put_many(list(zip(keys, values, strict=True)))
    assert client.get_many(keys) == values
    assert checked_requests(cluster) >= before + 64
    client.remove_many(keys, force=True)


# ---- refused: the bytes aimed at are unchanged, the node serves on


def test_a_write_outside_the_writer_s_reservation_is_refused(client, other):
    victim = unique("victim")
    victim_bytes = os.urandom(8192)
    other.put(victim, victim_bytes)  # (another tenant's object)
    mine = unique("mine")
    slot, segment = put_start(client, mine, 8192)
    [replica] = slot.replicas
    target, target_segment = locate(other, victim)
    assert target_segment.segment_id == segment.segment_id
    with connect(segment) as connection:
        for offset, length in (
            (offset_of(target, target_segment), 8192),  # the other object
            (offset_of(replica, segment) + 4096, 8192),  # past the reservation's end
            (max(0, offset_of(replica, segment) - 64), 128),  # before its start
            (offset_of(replica, segment), 8193),  # one byte more
        ):
            reply, _ = ask(
                connection,
                frames.Op.WRITE,
                replica.capability,
                offset,
                length,
                b"X" * length,
            )
            assert reply.status is frames.Status.OUT_OF_RANGE
        # (a read capability where a write is asked: refused too)
        read_capability = target.capability
        reply, _ = ask(
            connection,
            frames.Op.WRITE,
            read_capability,
            offset_of(target, target_segment),
            8192,
            b"Y" * 8192,
        )
        assert reply.status is frames.Status.WRONG_RIGHTS
    assert other.get(victim) == victim_bytes
    assert_node_serves(client)


def test_a_write_after_its_capability_expired_is_refused(client):
    key = unique("late")
    written = os.urandom(4096)
    slot, segment = put_start(client, key, 4096)
    [replica] = slot.replicas
    offset = offset_of(replica, segment)
    with connect(segment) as connection:
        reply, _ = ask(connection, frames.Op.WRITE, replica.capability, offset, 4096, written)
        assert reply.status is frames.Status.OK, "in time: written"
        time.sleep(WRITE_GRANT_S + 0.3)  # (the capability's own clock: no event to wait for)
        reply, _ = ask(connection, frames.Op.WRITE, replica.capability, offset, 4096, b"L" * 4096)
        assert reply.status is frames.Status.EXPIRED
    assert put_end(client, key, slot) == pb.OK
    assert client.get(key) == written
    assert_node_serves(client)


def test_a_write_grant_ends_when_its_object_is_recorded(client):
    """The node recorded the object (it is published): its writer's grant, still in time, is
    refused from then on, so the master may reuse the space as soon as readers are done."""
    key = unique("sealed")
    written = os.urandom(4096)
    slot, segment = put_start(client, key, 4096)
    [replica] = slot.replicas
    offset = offset_of(replica, segment)
    with connect(segment) as connection:
        reply, _ = ask(connection, frames.Op.WRITE, replica.capability, offset, 4096, written)
        assert reply.status is frames.Status.OK
        assert put_end(client, key, slot) == pb.OK
        reply, _ = ask(connection, frames.Op.WRITE, replica.capability, offset, 4096, b"S" * 4096)
        assert reply.status is frames.Status.SEALED
    assert client.get(key) == written


def test_a_read_without_a_capability_or_with_an_expired_one_is_refused(client):
    key = unique("secret")
    client.put(key, os.urandom(4096))
    replica, segment = locate(client, key, lease_ms=300)
    offset = offset_of(replica, segment)
    with connect(segment) as connection:
        reply, data = ask(connection, frames.Op.READ, replica.capability, offset, 4096)
        assert reply.status is frames.Status.OK and len(data) == 4096
        for forged in (bytes(84), os.urandom(84)):
            reply, data = ask(connection, frames.Op.READ, forged, offset, 4096)
            assert reply.status is not frames.Status.OK and data == b""
        time.sleep(0.3 + SKEW_MS / 1000 + 0.3)
        reply, data = ask(connection, frames.Op.READ, replica.capability, offset, 4096)
        assert reply.status is frames.Status.EXPIRED and data == b""
    assert_node_serves(client)


def test_a_capability_altered_in_any_byte_is_refused(client):
    key = unique("altered")
    data = os.urandom(4096)
    client.put(key, data)
    replica, segment = locate(client, key, lease_ms=60_000)
    offset = offset_of(replica, segment)
    capability = replica.capability
    with connect(segment) as connection:
        for at in range(len(capability)):
            for flip in (0x01, 0x80):
                altered = bytearray(capability)
                altered[at] ^= flip
                reply, out = ask(connection, frames.Op.READ, bytes(altered), offset, 4096)
                assert reply.status is not frames.Status.OK, f"byte {at} ^ {flip:#x} accepted"
                assert out == b""
                reply, _ = ask(
                    connection, frames.Op.WRITE, bytes(altered), offset, 4096, b"Z" * 4096
                )
                assert reply.status is not frames.Status.OK
    assert client.get(key) == data
    assert_node_serves(client)


def test_another_tenant_s_range_cannot_be_read_with_one_s_own_capability(client, other):
    theirs = unique("theirs")
    other.put(theirs, os.urandom(4096))
    mine = unique("mine")
    client.put(mine, os.urandom(4096))
    my_replica, segment = locate(client, mine, lease_ms=60_000)
    their_replica, their_segment = locate(other, theirs, lease_ms=60_000)
    with connect(segment) as connection:
        reply, data = ask(
            connection,
            frames.Op.READ,
            my_replica.capability,
            offset_of(their_replica, their_segment),
            4096,
        )
        assert reply.status is frames.Status.OUT_OF_RANGE and data == b""
    assert_node_serves(client)


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(
            frames.encode_request(frames.Op.WRITE, 1, bytes(84), 0, frames.MAX_LENGTH)[:-8]
            + (frames.MAX_LENGTH + 1).to_bytes(8, "big"),
            id="oversized",
        ),
        pytest.param(
            frames.encode_request(frames.Op.READ, 1, bytes(84), 0, 64)[:50], id="truncated"
        ),
        pytest.param(
            frames.encode_request(frames.Op.READ, 1, bytes(84), 0, 64)[:5]
            + b"\x09"
            + frames.encode_request(frames.Op.READ, 1, bytes(84), 0, 64)[6:],
            id="unknown-op",
        ),
        pytest.param(os.urandom(frames.REQUEST_SIZE), id="garbage"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 40, id="http"),
    ],
)
def test_crafted_frames_are_refused_or_dropped_and_the_node_serves_on(client, frame):
    key = unique("canary")
    data = os.urandom(4096)
    client.put(key, data)
    _, segment = locate(client, key)
    with connect(segment) as connection:
        answer = b""
        connection.sendall(frame)
        connection.shutdown(socket.SHUT_WR)
        while chunk := connection.recv(4096):  # (no reset: the node drops what it leaves unread)
            answer += chunk
    if len(frame) >= frames.REQUEST_SIZE:  # (a whole header: answered, then the end of stream)
        assert len(answer) == frames.REPLY_SIZE, answer
        assert frames.parse_reply(answer).status is not frames.Status.OK
    else:
        assert answer == b"", "half a header: the end of stream, unanswered"
    assert client.get(key) == data
    assert_node_serves(client)


# ---- a peer that holds the node's connections


class Squatters:
    """A peer without a capability that holds every connection the node takes, and more:
    ``count`` connections that each sent one byte of a request header and nothing after it,
    each one the node closes opened again at once (one thread, as fast as it can)."""

    def __init__(self, address: str, count: int) -> None:
        host, _, port = address.rpartition(":")
        self.address = (host, int(port))
        self.count = count
        self.reopened = 0
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def __enter__(self) -> Squatters:
        for _ in range(self.count):
            self._open()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for key in list(self._selector.get_map().values()):
            key.data.close()
        self._selector.close()

    def _open(self) -> None:
        try:
            connection = socket.create_connection(self.address, timeout=2)
            connection.sendall(frames.REQUEST_MAGIC[:1])
        except OSError:
            return  # (the listener's backlog is full: the next round tries again)
        connection.setblocking(False)
        self._selector.register(connection, selectors.EVENT_READ, connection)

    def _hold(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.05):
                connection = key.data
                try:
                    if connection.recv(4096):
                        continue  # (an answer? none is due: half a header)
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                self._selector.unregister(connection)
                connection.close()
            while len(self._selector.get_map()) < self.count and not self._stop.is_set():
                self._open()
                self.reopened += 1


def test_connections_each_with_part_of_a_header_keep_no_new_client_out(cluster, client):
    """A peer that only connects, every connection the node takes (and more) each with a
    byte of a request header, reopened as soon as the node closes one, does not keep out a
    client that connects after it: a connection on which no transfer was ever admitted
    gives its place to a new one, midway through a header too, and a new client's first
    request is admitted before the peer has replaced every connection opened before it.
    (A connection midway through a header was taken as one handling a request, never to be
    replaced: such a peer turned away 462 of 463 new clients' gets.)"""
    key = unique("squatted")
    data = os.urandom(4096)
    client.put(key, data)
    _, segment = locate(client, key)
    with Squatters(segment.checked_address, MAX_CONNECTIONS + 16) as squatters:
        time.sleep(1.0)  # (every place taken, each older than EVICTABLE_IDLE)
        for round_ in range(3):
            started = time.monotonic()
            # (within a timeout shorter than the node's io timeout: no waiting the peer out)
            with Client(
                cluster.master_address,
                timeout=5,
                same_host_mapping=False,
                **cluster.client_credentials("default"),
            ) as newcomer:
                assert newcomer.get(key) == data
                newcomer.put(f"{key}-{round_}", data)
                assert newcomer.get(f"{key}-{round_}") == data
            assert time.monotonic() - started < 5
        assert squatters.reopened > 0, "the peer was at it all along"
    assert_node_serves(client)
    for name in (key, *(f"{key}-{round_}" for round_ in range(3))):
        client.remove(name, force=True)


# ---- a paused writer


PAUSED_WRITER = """
import os, sys, time
from kvpool import Client
from kvpool.transport import checked_stream

checked_stream.CHUNK = 1 << 20
send = checked_stream._send
told = []


def slow_send(connection, data, deadline):
    if len(data) > 4096:  # (the payload: a real client, slowed so that it can be paused)
        if not told:
            told.append(1)
            print("writing", flush=True)
        time.sleep(0.02)
    return send(connection, data, deadline)


checked_stream._send = slow_send
with Client(sys.argv[1], timeout=30, same_host_mapping=False) as client:
    try:
        client.put(sys.argv[2], b"W" * int(sys.argv[3]))
        print("put done", flush=True)
    except Exception as error:
        print("put failed:", type(error).__name__, error, flush=True)
"""


def test_a_paused_writer_resumed_after_its_grant_ended_changes_no_byte(cluster_factory):
    size = 40 << 20  # (one object fills the node: the next one reuses the same bytes)
    # (--reclaim-delay 0: the writer's space waits only for its grant to end)
    cluster = cluster_factory(
        1, "48MiB", master_args=(*MASTER_ARGS, "--reclaim-delay", "0"), node_args=NODE_ARGS
    )
    env = {**os.environ, **cluster.client_env()}
    writer = subprocess.Popen(
        [sys.executable, "-c", PAUSED_WRITER, cluster.master_address, unique("paused"), str(size)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "writing"
        os.kill(writer.pid, signal.SIGSTOP)
        victim = os.urandom(size)
        with Client(
            cluster.master_address,
            timeout=30,
            same_host_mapping=False,
            **cluster.client_credentials(),
        ) as client:
            # The writer's reservation is revoked once it stops heartbeating (--client-ttl),
            # and its space goes to another object only after its grant ended.
            def placed() -> bool:
                try:
                    client.put("victim", victim)
                except Exception:
                    return False
                return True

            assert wait_until(placed, timeout=30, interval=0.2)
            os.kill(writer.pid, signal.SIGCONT)
            out, _ = writer.communicate(timeout=60)
            assert "put failed" in out, out
            assert client.get("victim") == victim
            assert_node_serves(client)
    finally:
        if writer.poll() is None:
            os.kill(writer.pid, signal.SIGCONT)
            writer.kill()
            writer.wait()


# ---- key rotation


def test_keys_rotated_while_clients_run_fail_no_transfer(cluster, client):
    import threading

    from kvpool.master.capability_keys import rotate
    from kvpool.security import capabilities as caps

    failures: list[BaseException] = []
    rounds = [0]
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            key = unique("rotating")
            data = os.urandom(64 << 10)
            try:
                client.put(key, data)
                assert client.get(key) == data
                client.remove(key, force=True)
            except BaseException as error:
                failures.append(error)
                return
            rounds[0] += 1
            # (each get leases its object, holding its space for a lease time after the
            # forced remove: unpaced, a quiet machine fills the segment within that time)
            stop.wait(0.01)

    def signing_key() -> int:
        key = unique("probe")
        client.put(key, b"p" * 64)
        replica, _ = locate(client, key)
        client.remove(key, force=True)
        return caps.parse(replica.capability).key_id

    before = signing_key()
    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        rotated = rotate(cluster.run_dir / "capability-keys.json")
        assert rotated.current != before
        # (the master signs with the new key once every node has had a node TTL to get it)
        assert wait_until(lambda: signing_key() == rotated.current, timeout=30, interval=0.5)
        done = rounds[0]
        assert wait_until(lambda: rounds[0] >= done + 5 or bool(failures), timeout=30)
    finally:
        stop.set()
        thread.join(60)
    assert not failures, failures
    assert rounds[0] > 5
