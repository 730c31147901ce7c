"""Opening the adapter's connections when it starts, so that the first load after the start
is as fast as later ones.

A kvpool client connects lazily: its first metadata call opens the gRPC channel and the
master's metadata lane (a TLS handshake each), and its first transfer with a storage node
opens the UCX endpoint to it, or maps the node's memory when the node runs on this host.
LMCache's first prefetch would pay for all of that. So at start each data client makes one
metadata call, and writes one byte to as many storage nodes as the cluster has (one object,
a replica on each), which opens its way to every node; the object is removed at once.

Best effort: a cluster that is not usable yet (no master, no node) only leaves the
connections to be opened by the first calls, as without this.
"""

from __future__ import annotations

from collections.abc import Sequence

from lmcache.logging import init_logger

from kvpool import Client
from kvpool.errors import InvalidArgument, KVPoolError

logger = init_logger(__name__)

#: Where the one-byte objects go: outside LMCache's key prefix (never listed as chunks).
WARMUP_PREFIX = "kvpool-warmup/"


def open_connections(clients: Sequence[Client], nodes: int) -> None:
    """Opens each client's connections to the master and to (up to) ``nodes`` storage
    nodes. Each call is bounded by its client's timeout; failures are logged, not raised."""
    for client in clients:
        key = f"{WARMUP_PREFIX}{client.client_id}"
        try:
            client.exists_many([key], lease=False)  # the master's gRPC channel and lane
            if nodes > 0:
                _write_everywhere(client, key, nodes)
        except KVPoolError as error:
            logger.info("kvpool L2 adapter: connections open on first use (%s)", error)


def _write_everywhere(client: Client, key: str, nodes: int) -> None:
    replicas = nodes
    while True:
        try:
            [result] = client.put_many([(key, b"\0")], replicas=replicas)
        except InvalidArgument:
            result = InvalidArgument("replicas")
        if not isinstance(result, InvalidArgument) or replicas == 1:
            break
        replicas = max(1, replicas // 2)  # above the master's max_replicas: ask for fewer
    if isinstance(result, KVPoolError):
        raise result
    client.remove_many([key], force=True)
