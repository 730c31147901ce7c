"""Calls fail at once for a moment after the master failed to answer one: the engine
adapters' guard (LMCache's tasks, vLLM's store and load jobs).

When the master stalls, every queued task would make its own call and wait out its own
deadline: hundreds of pointless calls a second, each logging its failure, and each delivered
late (a stalled connection hands them all to the master when it resumes: stale leases, stale
reservations). After a call got ``MasterUnavailable``, tasks that start within ``HOLD_S``
(at most the failed call's own budget: a short deadline missed says less than a long one)
fail without calling; the first one after that probes the master again, with its budget.
A healthy master never trips it: it answers within the deadlines. (Here rather than in an
adapter's package: ``kvpool.lmcache`` imports LMCache, which vLLM's tier does not have.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from kvpool.errors import MasterUnavailable

#: How long after a call the master did not answer new tasks fail without calling it.
HOLD_S = 1.0


class MasterStall:
    def __init__(self, hold: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold = hold
        self._clock = clock
        self._until = 0.0
        self._lock = threading.Lock()

    def note(self, results: Iterable[object], budget: float) -> None:
        """Records a call's outcome (its per-key results, or the error it raised): any
        ``MasterUnavailable`` holds new calls back for ``min(hold, budget)`` seconds."""
        if any(isinstance(result, MasterUnavailable) for result in results):
            with self._lock:
                self._until = max(self._until, self._clock() + min(self.hold, max(budget, 0.0)))

    def stalled(self) -> bool:
        """Whether a task starting now should fail without calling the master."""
        with self._lock:
            return self._clock() < self._until
