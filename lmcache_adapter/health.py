"""Is kvpool usable from here? A master probe with a short deadline, cached briefly.

LMCache's ``/status`` asks every adapter for ``report_status`` (``is_healthy``) and may ask
often; the probe runs at most once per ``CACHE_S`` and never waits longer than its timeout.
Healthy means the master answered, serves clients (not rebuilding its index, not cut off
from every node: ``clients_refused``) and at least one storage node has a segment mounted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from kvpool.errors import KVPoolError
from kvpool.lmcache.control import ControlPlane

CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class Health:
    reachable: bool
    healthy: bool
    reason: str = ""
    nodes: int = 0
    objects: int = 0
    capacity: int = 0
    used: int = 0
    #: What the probe raised (None: it was answered).
    error: Exception | None = None


class HealthProbe:
    def __init__(self, control: ControlPlane, timeout: float) -> None:
        self._control = control
        self._timeout = timeout
        self._lock = threading.Lock()
        self._last: Health | None = None
        self._checked_at = 0.0

    def check(self) -> Health:
        with self._lock:
            now = time.monotonic()
            if self._last is None or now - self._checked_at >= CACHE_S:
                self._last = self._probe()
                self._checked_at = time.monotonic()
            return self._last

    def _probe(self) -> Health:
        try:
            status = self._control.cluster_status(self._timeout)
        except (KVPoolError, ValueError) as error:  # (closed meanwhile: ClientClosed)
            return Health(reachable=False, healthy=False, reason=str(error), error=error)
        capacity = sum(s.capacity for s in status.segments)
        used = sum(s.used for s in status.segments)
        if status.clients_refused:
            reason = f"the master refuses clients for now: {status.clients_refused}"
        elif status.nodes == 0 or not status.segments:
            reason = "the master has no storage node with a segment"
        else:
            reason = ""
        return Health(
            reachable=True,
            healthy=not reason,
            reason=reason,
            nodes=status.nodes,
            objects=status.objects,
            capacity=capacity,
            used=used,
        )
