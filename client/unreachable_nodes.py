"""The storage nodes this client could not reach lately.

A node that dies is declared dead by the master only once it has missed heartbeats for the
node TTL (``kvpool master --node-ttl``); until then the master still places replicas on it.
The client learns sooner, from a failed transfer (or from a read that the node left
unanswered for the share of the time it was given, other replicas left: a node cut off
silently, client/get_path.py), and remembers the node for a few seconds: puts ask the master
to place their replicas elsewhere (``PutStartRequest.avoid_nodes``), and reads try its
replicas last. A node is forgotten when that time is up, when a transfer with
it succeeds, or when it mounts its segments again (a restart).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: How long a node that could not be reached is avoided.
REMEMBER_FOR = 5.0
#: Nodes remembered at most (the oldest is forgotten first): a bound on what every PutStart
#: carries.
MAX_REMEMBERED = 32


class UnreachableNodes:
    """Thread-safe; ``clock`` is monotonic seconds."""

    def __init__(
        self,
        remember_for: float = REMEMBER_FOR,
        limit: int = MAX_REMEMBERED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.remember_for = remember_for
        self.limit = limit
        self._clock = clock
        self._until: dict[str, float] = {}  # node id -> when it is forgotten, oldest first
        self._lock = threading.Lock()

    def add(self, node_id: str) -> None:
        with self._lock:
            self._until.pop(node_id, None)
            self._until[node_id] = self._clock() + self.remember_for
            while len(self._until) > self.limit:
                del self._until[next(iter(self._until))]

    def forget(self, node_id: str) -> None:
        if node_id in self._until:  # (the common case, no node remembered, takes no lock)
            with self._lock:
                self._until.pop(node_id, None)

    def current(self) -> list[str]:
        """The nodes to avoid now."""
        if not self._until:
            return []
        with self._lock:
            now = self._clock()
            for node_id in [n for n, until in self._until.items() if until <= now]:
                del self._until[node_id]
            return list(self._until)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.current()
