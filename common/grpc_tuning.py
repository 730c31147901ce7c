"""Process-wide gRPC settings that must be in place before gRPC is first imported.

gRPC's C core reads ``GRPC_EXPERIMENTS`` once, when ``grpc`` is imported. Its EventEngine
client and listener add thread hand-offs to every call; on the 2-core machines kvpool was
measured on, turning them off (back to the classic poller, which is what gRPC used for years)
made a unary round trip between two processes much shorter, and every kvpool call is such a
round trip (docs/benchmarks.md has the figures). So kvpool's own processes (the ``kvpool``
command) set that default, and ``kvpool.tune_grpc()`` lets another program opt in; importing
kvpool sets nothing. It applies unless ``GRPC_EXPERIMENTS`` is already set (set it, even to
an empty string, to keep gRPC's own defaults), or gRPC was imported first (then it is too
late, and nothing changes), or the installed grpcio is one this was not measured with (the
experiments come and go between releases).

The bounds on the master's gRPC connections live here too (``server_connection_options``):
the numbers kvpool's gRPC server is tuned with, in one place.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from importlib.util import find_spec
from pathlib import Path

EXPERIMENTS = "-event_engine_client,-event_engine_listener"
#: grpcio releases whose experiments include both names (measured on 1.85).
MEASURED = ((1, 80), (1, 89))

#: The most gRPC connections the master holds at once
#: (``grpc.max_allowed_incoming_connections``: more are closed as they come; those still in
#: their handshakes count). Nothing else bounds them, and a peer needs no token to open one:
#: plain TCP connects held open took the master to its descriptor limit (20,000 in 6 s),
#: after which no new client, node or lane connection got in. The cap is what the
#: descriptor limit leaves once the lane, the HTTP side door and ``RESERVED_DESCRIPTORS``
#: have theirs, at most this many: an idle TLS connection costs the master tens of KiB,
#: and twice the lane's cap is room for every client and node even with the lane down
#: (clients use gRPC for little more than asking for the lane; nodes for their heartbeats,
#: and their command stream where they take no lane). ``KVPOOL_MASTER_GRPC_MAX_CONNECTIONS``
#: sets the cap itself (tests use a small one).
MAX_CONNECTIONS = 8192
#: The cap, however few descriptors the limit leaves (a limit that low is logged: raise it).
MIN_CONNECTIONS = 128
#: Descriptors the master keeps for everything but connections: its files, gRPC's and
#: asyncio's own, etcd's connections.
RESERVED_DESCRIPTORS = 256
#: Milliseconds a new gRPC connection has to finish its TLS and HTTP/2 handshakes before it is
#: closed (``grpc.server_handshake_timeout_ms``; gRPC's own default is 120 s, which let a
#: connection that never sent a byte hold its descriptor for two minutes, and a peer that
#: reconnects hold it for ever). Ten seconds, as the lane gives a connection to prove who
#: it is. ``KVPOOL_MASTER_GRPC_HANDSHAKE_TIMEOUT_MS`` overrides it.
HANDSHAKE_TIMEOUT_MS = 10_000
#: Milliseconds a gRPC connection may stay open with no call on it before it is closed
#: (``grpc.max_connection_idle_ms``). gRPC keeps one for ever: a peer that completed the
#: handshakes and then called nothing held its place under the cap for as long as it liked,
#: and so would every kvpool client, which asks for the lane over gRPC and then rarely
#: calls again. As long as the lane gives an idle client connection
#: (lane_server.IDLE_TIMEOUT). A kvpool client's or node's channel connects again at its
#: next call, unseen by the caller (gRPC's C core logs the close at INFO on the client's
#: stderr: "Got goaway ... connection idle"); a node's command stream is a call, open as
#: long as the node is mounted, and its heartbeats come every few seconds, so its
#: connection is never idle. ``KVPOOL_MASTER_GRPC_IDLE_MS`` overrides it.
MAX_CONNECTION_IDLE_MS = 300_000


def apply() -> bool:
    """Sets the default where it can take effect; returns whether it did."""
    if "GRPC_EXPERIMENTS" in os.environ or "grpc" in sys.modules:
        return False
    version = grpcio_version()
    if version is None or not MEASURED[0] <= version <= MEASURED[1]:
        return False
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    return True


def grpcio_version() -> tuple[int, int] | None:
    """(major, minor) of the installed grpcio, from the name of its ``.dist-info`` (or
    ``.egg-info``) folder beside the ``grpc`` package, without importing it.
    (``importlib.metadata`` would say the same, but importing it costs every ``kvpool``
    command a noticeable share of its run time.)"""
    try:
        spec = find_spec("grpc")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    for info in Path(spec.origin).parent.parent.glob("grpcio-*-info"):
        found = re.fullmatch(r"grpcio-(\d+)\.(\d+)\b.*\.(dist|egg)-info", info.name)
        if found:
            return int(found[1]), int(found[2])
    return None


def server_connection_options(other_connections: int) -> list[tuple[str, int]]:
    """The master's gRPC server options that bound its connections (see MAX_CONNECTIONS,
    HANDSHAKE_TIMEOUT_MS, MAX_CONNECTION_IDLE_MS, and their environment variables: read
    here, and nowhere else). ``other_connections``: how many connections the master's other
    listeners (the lane, the HTTP side door) may hold at once, each a descriptor.
    ValueError for a variable that is not a positive whole number."""
    bounds = (
        ("grpc.max_allowed_incoming_connections", "KVPOOL_MASTER_GRPC_MAX_CONNECTIONS"),
        ("grpc.server_handshake_timeout_ms", "KVPOOL_MASTER_GRPC_HANDSHAKE_TIMEOUT_MS"),
        ("grpc.max_connection_idle_ms", "KVPOOL_MASTER_GRPC_IDLE_MS"),
    )
    defaults = (connection_cap(other_connections), HANDSHAKE_TIMEOUT_MS, MAX_CONNECTION_IDLE_MS)
    options = []
    for (option, variable), default in zip(bounds, defaults, strict=True):
        value = os.environ.get(variable, "").strip() or str(default)
        if not re.fullmatch(r"[0-9]{1,10}", value) or not 0 < int(value) < 2**31:
            raise ValueError(f"{variable} must be a positive whole number, got {value!r}")
        options.append((option, int(value)))
    return options


def connection_cap(other_connections: int) -> int:
    """MAX_CONNECTIONS, or fewer where the descriptor limit leaves less (``descriptor_room``);
    MIN_CONNECTIONS at the least."""
    room = descriptor_room(other_connections)
    if room is None:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, room))


def descriptor_room(other_connections: int) -> int | None:
    """The descriptors the limit (the soft RLIMIT_NOFILE, as the master starts) leaves for
    gRPC's connections once ``other_connections`` and RESERVED_DESCRIPTORS are counted;
    None where there is no limit."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    return limit - other_connections - RESERVED_DESCRIPTORS
