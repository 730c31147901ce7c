"""Re-replication's bookkeeping: which objects to look at, and how fast copies may start.

When a node dies or withdraws a segment, every object that kept a replica elsewhere but now
lies on fewer nodes than it should (``ObjectRecord.wanted``) gets a new replica, copied node
to node; when a node comes back with replicas that were copied meanwhile, the surplus goes;
a draining node's objects are copied away before it leaves. ``MasterState`` decides what to
copy or drop (it owns the objects); this keeps what that decision needs between ticks, with
time passed in (no clock of its own):

* the keys to look at, in the order their replica count changed (a key once), and those to
  look at again later (no node had room, or a copy failed);
* the keys known to lie on fewer nodes than they should (the metric);
* the copies in flight, at most ``copies`` of them, started at ``rate`` bytes per second at
  most: a token bucket that fills at ``rate`` up to one second's worth, and that a copy may
  take below zero (an object larger than a second's worth still goes, and the next waits
  longer), so that over any long stretch copies take no more than ``rate``.

Every table here is bounded by the objects the master holds (keys) or by ``copies``.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict

#: Seconds before an object no node could take a copy of (or whose copy failed) is looked at
#: again: a node that mounts, or space that comes free, is found within this.
RETRY_DELAY = 2.0
#: Most seconds' worth of copying the bucket saves up while idle.
BURST_SECONDS = 1.0


class ReplicationQueue:
    def __init__(self, rate: float, copies: int, now: float) -> None:
        self.rate = rate
        self.copies = copies
        #: Keys to look at, oldest change first.
        self.queue: OrderedDict[str, None] = OrderedDict()
        #: (due, seq, key): keys to look at again once due.
        self._later: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        #: Keys of published objects on fewer nodes than they should be, as last looked at.
        self.under: set[str] = set()
        #: command id -> bytes, of the copies in flight.
        self.in_flight: dict[int, int] = {}
        self._tokens = rate * BURST_SECONDS
        self._filled_at = now

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def look_at(self, key: str) -> None:
        self.queue[key] = None

    def look_again(self, key: str, now: float, delay: float = RETRY_DELAY) -> None:
        heapq.heappush(self._later, (now + delay, next(self._seq), key))

    def due(self, now: float) -> None:
        """Moves the keys due to be looked at again into the queue."""
        later = self._later
        while later and later[0][0] <= now:
            self.look_at(heapq.heappop(later)[2])

    def next_key(self) -> str | None:
        if not self.queue:
            return None
        return self.queue.popitem(last=False)[0]

    def put_back(self, key: str) -> None:
        """A key taken but not dealt with (no copy may start now): first in line again."""
        self.queue[key] = None
        self.queue.move_to_end(key, last=False)

    def may_start(self, now: float) -> bool:
        """Whether another copy may start now (fewer than ``copies`` in flight, and the
        bucket not empty)."""
        if len(self.in_flight) >= self.copies:
            return False
        self._fill(now)
        return self._tokens > 0

    def started(self, command_id: int, size: int, now: float) -> None:
        self._fill(now)
        self._tokens -= size
        self.in_flight[command_id] = size

    def ended(self, command_id: int) -> None:
        """A copy was answered, given up on or cancelled."""
        self.in_flight.pop(command_id, None)

    def forget(self, key: str) -> None:
        """The object is gone (its key may be looked at again: nothing is there)."""
        self.under.discard(key)

    def _fill(self, now: float) -> None:
        if now > self._filled_at:
            self._tokens = min(
                self.rate * BURST_SECONDS, self._tokens + (now - self._filled_at) * self.rate
            )
        self._filled_at = max(self._filled_at, now)
