"""What every fuzzer shares: the number of cases, hypothesis settings, protobuf messages
generated from their descriptors, lane frames, and the ``Watch`` that holds a real cluster
to its invariants while it is fuzzed.

The invariants, checked by ``Watch``: every process of the cluster stays alive and answers a
probe (a gRPC ``Exists`` of the canary keys, which must all still exist), the canaries read
back their exact bytes through a real ``Client``, the master's resident memory and each
node's private memory stay within ``MEMORY_BOUND`` of what they were at the start, and no
process logs a traceback.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from helpers import bearer
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvpool import Client
from kvpool.common import lane_protocol as lp
from kvpool.local_cluster import LocalCluster
from kvpool.master.access import ALLOWED
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security.caller import CallerCredentials
from kvpool.security.identity import Role
from kvpool.security.tokens import new_token

#: The node the fuzzers speak as (a real node token: what a broken or taken-over node holds).
FUZZ_NODE = "fuzz-node"
FUZZ_NODE_TOKEN, FUZZ_NODE_RECORD = new_token(FUZZ_NODE, Role.NODE, node_id=FUZZ_NODE)


#: Cases per surface: a short slice by default (CI), ``KVPOOL_FUZZ_CASES`` for the full run.
CASES = int(os.environ.get("KVPOOL_FUZZ_CASES", "300"))
#: Where the full run appends each surface's figures (one JSON object a line), if set.
REPORT = os.environ.get("KVPOOL_FUZZ_REPORT")

#: How far the master's resident memory, or a node's private memory, may grow over a run.
MEMORY_BOUND = 200 << 20
#: Canaries are read back (bytes and memory checked) every this many cases.
CHECK_EVERY = 100

CANARY_PREFIX = "canary/"


def fuzz_settings(cases: int) -> settings:
    """Hypothesis settings for ``cases`` examples against a long-lived process: no deadline
    (a case waits for the real master), no example database (a slice is a fresh draw)."""
    return settings(
        max_examples=max(1, cases),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def share(tests: int) -> int:
    """The cases of one test of a surface that has ``tests`` tests: together, ``CASES``."""
    return math.ceil(CASES / tests)


# ---------------------------------------------------------------- generated field values


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of ``choices``, each about as often as its weight. (Hypothesis, left to itself,
    favours branches it has not tried: one with no draws of its own, such as ``None``, is
    soon used up, and the rest take over. A wide integer, spread over the weights, keeps
    every branch fresh.)"""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, 2**32 - 1).flatmap(lambda n: table[(n * 7919 + 5) % len(table)])


_EDGES = [
    0,
    1,
    2**7,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
]


def integers(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers of a range, boundaries (0, 2**32-1, 2**63, 2**64-1, ...) drawn often."""
    edges = sorted({e for e in _EDGES + [-e for e in _EDGES] + [low, high] if low <= e <= high})
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


_KEYISH = [
    "",
    " ",
    "\x00",
    "a" * 1024,  # the longest key
    "a" * 1025,
    "é" * 512,  # 1024 bytes of UTF-8
    "é" * 513,
    "🙂",
    "fuzz/",
    "LPVK",  # the index log's magic number, spelled out
]

TEXT = st.one_of(
    st.sampled_from(_KEYISH),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=24),
    st.integers(1, 200_000).map(lambda n: "x" * n),  # huge
)
SHORT_TEXT = st.sampled_from(["", "k", "é", "fuzz/key", "a" * 32])
BINARY = st.one_of(st.binary(max_size=64), st.integers(1, 100_000).map(lambda n: bytes([0xFF]) * n))

_RANGES = {
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),  # open enums: unknown values too
}
#: How many elements a repeated field gets now and then: around the master's batch limit.
BULK_LENGTHS = [255, 4096, lp.MAX_BATCH_KEYS, lp.MAX_BATCH_KEYS + 1]


def _scalar(fd: FieldDescriptor, small: bool) -> st.SearchStrategy[Any]:
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if fd.type == FieldDescriptor.TYPE_STRING:
        return SHORT_TEXT if small else TEXT
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=4) if small else BINARY
    if fd.type == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if fd.type == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    low, high = _RANGES[fd.type]
    if fd.type == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in fd.enum_type.values]
        return st.one_of(st.sampled_from(known), integers(low, high))
    return integers(low, high)


def _value(fd: FieldDescriptor, depth: int, small: bool = False) -> st.SearchStrategy[Any]:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(fd.message_type, depth + 1)
    return _scalar(fd, small)


def _repeated(fd: FieldDescriptor, depth: int) -> st.SearchStrategy[list[Any]]:
    usual = st.lists(_value(fd, depth), max_size=8)
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        bulk = st.tuples(messages(fd.message_type, depth + 1, small=True), st.just(4096))
    else:
        bulk = st.tuples(_value(fd, depth, small=True), st.sampled_from(BULK_LENGTHS))
    return st.integers(0, 24).flatmap(
        lambda r: bulk.map(lambda t: [t[0]] * t[1]) if r == 0 else usual
    )


def messages(
    descriptor: Descriptor, depth: int = 0, small: bool = False
) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type, every field drawn (or left unset) from its type:
    integers with their boundaries, empty, huge and non-ASCII strings, repeated fields from
    empty to past the batch limit, nested messages (three levels deep at most)."""
    message_class = pb.__dict__.get(descriptor.name) or _class_of(descriptor)
    if depth > 3:
        return st.just(message_class())
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for fd in descriptor.fields:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            continue  # (no request has a map)
        if fd.is_repeated:
            value = (
                st.lists(_value(fd, depth, small), max_size=2) if small else _repeated(fd, depth)
            )
        else:
            value = _value(fd, depth, small)
        fields[fd.name] = st.none() | value
    return st.fixed_dictionaries(fields).map(lambda values: _build(message_class, values))


def _class_of(descriptor: Descriptor) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def _build(message_class: type[Message], values: dict[str, Any]) -> Message:
    message = message_class()
    for name, value in values.items():
        if value is None:
            continue
        fd = message.DESCRIPTOR.fields_by_name[name]
        if fd.is_repeated:
            target = getattr(message, name)
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                for item in value:
                    target.add().CopyFrom(item)
            else:
                target.extend(value)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(message, name).CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def steer_clear(message: Message, node_ids: Iterable[str] = ()) -> Message:
    """Moves a generated message off what the invariants watch: a key or prefix that could
    name a canary gets ``fuzz/`` before it (``RemovePrefix("")`` removes every object, and
    that is no bug), a node id or segment id naming a real node gets ``fuzz-`` before it."""
    real = tuple(node_ids)
    for fd in message.DESCRIPTOR.fields:  # unset ones too: an unset prefix is ""
        value = getattr(message, fd.name)
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.is_repeated or message.HasField(fd.name):
                for item in value if fd.is_repeated else [value]:
                    if not isinstance(item, Message):
                        break  # (a map)
                    steer_clear(item, real)
            continue
        if fd.type != FieldDescriptor.TYPE_STRING:
            continue
        fix: Callable[[str], str] | None = None
        if fd.name in ("key", "keys"):
            fix = _off_canaries
        elif fd.name == "prefix":
            fix = _off_canary_prefix
        elif fd.name in ("node_id", "segment_id", "segment_ids", "avoid_nodes"):
            fix = lambda v: f"fuzz-{v}" if any(n and n in v for n in real) else v  # noqa: E731
        if fix is None:
            continue
        if fd.is_repeated:
            fixed = [fix(v) for v in value]
            if fixed != list(value):
                del value[:]
                value.extend(fixed)
        elif fix(value) != value:
            setattr(message, fd.name, fix(value))
    return message


def _off_canaries(key: str) -> str:
    return f"fuzz/{key}" if key.startswith(CANARY_PREFIX) else key


def _off_canary_prefix(prefix: str) -> str:
    touches = prefix.startswith(CANARY_PREFIX) or CANARY_PREFIX.startswith(prefix)
    return f"fuzz/{prefix}" if touches else prefix


# ---------------------------------------------------------------- lane frames


def frame(call_id: int, method: int, body: bytes, status: int = 0) -> bytes:
    """A frame as the lane reads it (lane_protocol.encode refuses what a peer may send)."""
    return lp.HEADER.pack(len(body), call_id, method, status) + body


def lane_connect(port: int, token: str | None = None) -> socket.socket:
    """A lane connection as an authenticated peer makes it: TLS with the session's CA, then
    the AUTH frame with ``token`` (default: the session's client token), answered OK."""
    context = CallerCredentials.resolve().lane_context()
    assert context is not None
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
    sock.sendall(frame(0, lp.AUTH, (token or os.environ["KVPOOL_TOKEN"]).encode()))
    decoder = lp.FrameDecoder(lp.MESSAGE_LIMIT)
    answers: list[lp.Frame] = []
    while not answers:
        data = sock.recv(1 << 16)
        assert data, "the master closed the connection at its credentials"
        answers = decoder.feed(data)
    assert answers[0].method == lp.AUTH and answers[0].status == lp.OK, answers[0].error()
    return sock


def read_answers(sock: socket.socket, call_ids: set[int], timeout: float = 20) -> dict[int, Any]:
    """The lane's answer frames to ``call_ids``, by call id; fails if the master closes the
    connection or keeps an answer past ``timeout``."""
    decoder = lp.FrameDecoder(lp.MESSAGE_LIMIT)
    answers: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while call_ids - answers.keys():
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            raise AssertionError(f"no answer to calls {call_ids - answers.keys()}") from None
        assert data, f"the master closed the connection before answering {call_ids}"
        for answer in decoder.feed(data):
            if answer.method != lp.NODE_SESSION:
                answers[answer.call_id] = answer
    return answers


# ---------------------------------------------------------------- the watched cluster


@dataclass
class Figures:
    """What one surface's run did, for docs/reliability.md."""

    surface: str
    cases: int = 0
    probes: int = 0
    canary_reads: int = 0
    started: float = field(default_factory=time.monotonic)
    memory_start: int = 0
    memory_peak: int = 0
    #: Each node's private memory (``RssAnon``: its segments, shared memory, are not in it).
    node_memory_start: dict[int, int] = field(default_factory=dict)
    node_memory_peak: dict[int, int] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        figures = {
            "surface": self.surface,
            "cases": self.cases,
            "probes": self.probes,
            "canary_reads": self.canary_reads,
            "seconds": round(time.monotonic() - self.started, 1),
        }
        if self.memory_start:
            figures["master_rss_start_mib"] = round(self.memory_start / 2**20, 1)
            figures["master_rss_peak_mib"] = round(self.memory_peak / 2**20, 1)
        if self.node_memory_start:
            figures["nodes_anon_start_mib"] = round(max(self.node_memory_start.values()) / 2**20, 1)
            figures["nodes_anon_peak_mib"] = round(max(self.node_memory_peak.values()) / 2**20, 1)
        return figures

    def publish(self) -> None:
        line = json.dumps(self.record())
        print(f"\nfuzz figures: {line}")
        if REPORT:
            with open(REPORT, "a") as out:
                out.write(line + "\n")


def resident_bytes(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


TRACEBACK = re.compile(r"Traceback|\"exception\"")


class Watch:
    """One real cluster fuzzed by one module, and the invariants it is held to."""

    def __init__(self, cluster: LocalCluster, surface: str) -> None:
        self.cluster = cluster
        self.figures = Figures(surface)
        self.channel = CallerCredentials.resolve().channel(
            cluster.master_address,
            [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
        )
        #: gRPC metadata of each role's token: the fuzzers call as the role a method is for.
        self.metadata = {
            Role.CLIENT: bearer(os.environ["KVPOOL_TOKEN"]),
            Role.ADMIN: bearer(os.environ["KVPOOL_TEST_ADMIN_TOKEN"]),
            Role.NODE: bearer(FUZZ_NODE_TOKEN),
        }
        self.stub = master_pb2_grpc.MasterStub(self.channel)
        self.client = Client(cluster.master_address, timeout=30)
        rng = random.Random(18)
        self.canaries = {
            f"{CANARY_PREFIX}{size}": rng.randbytes(size)
            for size in (1, 100, 4096, 1 << 16, 1 << 20)
        }
        for key, data in self.canaries.items():
            self.client.put(key, data, pin="hard", replicas=2)
        status = self.stub.ClusterStatus(
            pb.ClusterStatusRequest(), timeout=10, metadata=self.metadata[Role.ADMIN]
        )
        self.node_ids = sorted({segment.node_id for segment in status.segments})
        assert self.cluster.master is not None
        self.master_pid = self.cluster.master.pid
        self.figures.memory_start = self.figures.memory_peak = resident_bytes(self.master_pid)
        self.node_pids = [node.pid for node in self.cluster.nodes]
        for pid in self.node_pids:
            anon = resident_bytes(pid, "RssAnon")
            self.figures.node_memory_start[pid] = self.figures.node_memory_peak[pid] = anon
        self.check_canaries()

    def as_caller_of(self, method: str) -> tuple[tuple[str, str], ...]:
        """The metadata of a token of a role that may call ``method`` (a client's when it
        may, else a node's, else an admin's): the fuzzed input then reaches the handler."""
        allowed = ALLOWED.get(method, frozenset())
        for role in (Role.CLIENT, Role.NODE, Role.ADMIN):
            if role in allowed:
                return self.metadata[role]
        return self.metadata[Role.CLIENT]

    @property
    def admin(self) -> tuple[tuple[str, str], ...]:
        return self.metadata[Role.ADMIN]

    @property
    def master(self) -> str:
        return self.cluster.master_address

    @property
    def lane_port(self) -> int:
        return self.cluster.lane_port

    def after_case(self) -> None:
        """Once per case: every process alive, the master answering; every CHECK_EVERY
        cases, the canaries' bytes and the master's memory too."""
        self.figures.cases += 1
        self.probe()
        if self.figures.cases % CHECK_EVERY == 0:
            self.check_canaries()

    def probe(self) -> None:
        processes = [self.cluster.master, *self.cluster.nodes]
        dead = [p.name for p in processes if p is not None and not p.alive()]
        assert not dead, f"exited: {dead}\n{self.cluster.logs()[-4000:]}"
        answer = self.stub.Exists(
            pb.ExistsRequest(client_id="fuzz-probe", keys=list(self.canaries), no_lease=True),
            timeout=10,
            metadata=self.metadata[Role.CLIENT],
        )
        assert list(answer.statuses) == [pb.OK] * len(self.canaries), answer
        self.figures.probes += 1

    def check_canaries(self) -> None:
        for key, data in self.canaries.items():
            assert self.client.get(key) == data, f"canary {key} changed"
            self.figures.canary_reads += 1
        rss = resident_bytes(self.master_pid)
        self.figures.memory_peak = max(self.figures.memory_peak, rss)
        peaks = self.figures.node_memory_peak
        for pid in self.node_pids:
            peaks[pid] = max(peaks[pid], resident_bytes(pid, "RssAnon"))

    def check_memory(self) -> None:
        """The master's resident memory, and each node's private memory, stayed within
        MEMORY_BOUND of its start at every check (held to the end, so that a run past the
        bound still reports its figures: memory is not one case's doing)."""
        grown = self.figures.memory_peak - self.figures.memory_start
        assert grown < MEMORY_BOUND, f"the master's resident memory grew by {grown >> 20} MiB"
        for pid, start in self.figures.node_memory_start.items():
            grown = self.figures.node_memory_peak[pid] - start
            assert grown < MEMORY_BOUND, f"a node's private memory grew by {grown >> 20} MiB"

    def finish(self) -> None:
        """The end of a run: the last probe and canary check, and no traceback in any log."""
        self.probe()
        self.check_canaries()
        self.client.close()
        self.channel.close()
        logs = sorted(self.cluster.run_dir.glob("*.log"))
        bad = [
            f"{path.name}: {line[:2000]}"
            for path in logs
            for line in path.read_text(errors="replace").splitlines()
            if TRACEBACK.search(line)
        ]
        self.figures.publish()
        assert not bad, "tracebacks logged:\n" + "\n".join(bad[:20])
        self.check_memory()


def watched_cluster(run_dir: Path, surface: str, nodes: int = 2) -> tuple[LocalCluster, Watch]:
    cluster = LocalCluster(
        nodes,
        "256MiB",
        run_dir=run_dir,
        # Reservations the fuzzers make and never commit give their space back soon.
        master_args=["--reservation-timeout", "2", "--reclaim-delay", "1"],
        tokens=[FUZZ_NODE_RECORD],
    )
    cluster.start()
    try:
        return cluster, Watch(cluster, surface)
    except BaseException:
        cluster.stop()
        raise
