"""What the checked stream wrote under each write grant, until its object is recorded.

Why: freed space is not cleared (a removed object's bytes stay in the segment until written
over), and a put's writer says itself, at PutEnd, which replicas it wrote. A client that
reserved space where another tenant's removed object lay, wrote nothing and committed would
have that tenant's bytes published under its own key, and read them back. On a segment that
holds several tenants' objects the node therefore records an object only when its own
writer wrote every byte of it, under its own grant, over the checked stream: the way bytes
from other hosts reach such a segment on a secure node (mappings are handed out for a
tenant's own segments only, and its UCX worker is offered over shared memory only, so a
client on the node's host that opts out of the stream cannot put there).

Keyed by the grant (segment digest, offset, generation), as the seals are
(storage_node/checked_seals.py). **Bounded**: an entry goes when its object is recorded or
forgotten; one whose object the master never names again goes after ``MAX_AGE``, and beyond
``MAX_GRANTS`` entries the oldest go (their Persists then fail, as for a write not proven).
A grant keeps at most ``MAX_RANGES`` disjoint ranges (pieces that follow each other merge;
past that they are merged, and a grant written in more disjoint pieces than that proves
nothing).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

#: Write grants followed at most at once (four of the master's largest batches).
MAX_GRANTS = 262_144
#: Disjoint ranges one grant keeps at most.
MAX_RANGES = 1024
#: A grant written in too many disjoint pieces: proves nothing.
_UNPROVABLE: list[tuple[int, int]] = []
#: How long a grant's writes are followed without a Persist or Forget naming it (seconds):
#: longer than any write grant runs.
MAX_AGE = 3600.0

_Grant = tuple[bytes, int, int]  # (segment digest, offset, generation)


class WrittenRanges:
    """Thread-safe: transfer threads note writes, the command thread asks and forgets."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        #: (segment digest, offset) -> generation -> [start, end) ranges written, in order
        self._grants: dict[tuple[bytes, int], dict[int, list[tuple[int, int]]]] = {}
        #: Every grant followed, oldest first, with when it was first written.
        self._since: OrderedDict[_Grant, float] = OrderedDict()

    def wrote(self, segment: bytes, offset: int, generation: int, start: int, end: int) -> None:
        """Bytes [start, end) of the segment were written under the grant."""
        with self._lock:
            by_generation = self._grants.get((segment, offset))
            ranges = by_generation.get(generation) if by_generation is not None else None
            if ranges is None:
                self._prune()  # (first: it may drop this place's other grants)
                by_generation = self._grants.setdefault((segment, offset), {})
                ranges = by_generation[generation] = []
                self._since[(segment, offset, generation)] = self._clock()
            if ranges is _UNPROVABLE:
                return
            if ranges and ranges[-1][1] == start:  # (the next piece, as a rule: merged)
                ranges[-1] = (ranges[-1][0], end)
                return
            ranges.append((start, end))
            if len(ranges) > MAX_RANGES:
                ranges[:] = _merged(ranges)
                if len(ranges) > MAX_RANGES:
                    self._grants[(segment, offset)][generation] = _UNPROVABLE

    def proven(self, segment: bytes, offset: int, generation: int, size: int) -> bool:
        """Whether every byte of the object (``size`` bytes at ``offset``, of the grant's
        generation) was written under its grant; the grant is no longer followed."""
        with self._lock:
            ranges = self._drop(segment, offset, generation)
        if size == 0:
            return True
        if not ranges:  # (none, or too many pieces to follow)
            return False
        merged = _merged(ranges)
        return merged[0][0] <= offset and merged[0][1] >= offset + size

    def forget(self, segment: bytes, offset: int, generation: int) -> None:
        """The object (or its reservation) is gone: the writes of its grant, and of older
        ones at its place, no longer matter."""
        with self._lock:
            by_generation = self._grants.get((segment, offset))
            if by_generation is None:
                return
            for older in [g for g in by_generation if g <= generation]:
                self._drop(segment, offset, older)

    def __len__(self) -> int:
        with self._lock:
            return len(self._since)

    def _drop(self, segment: bytes, offset: int, generation: int) -> list[tuple[int, int]] | None:
        """Stops following a grant; its ranges (callers hold the lock)."""
        self._since.pop((segment, offset, generation), None)
        by_generation = self._grants.get((segment, offset))
        if by_generation is None:
            return None
        ranges = by_generation.pop(generation, None)
        if not by_generation:
            del self._grants[(segment, offset)]
        return ranges

    def _prune(self) -> None:
        """Drops the oldest grants past MAX_AGE, and past MAX_GRANTS (callers hold the lock)."""
        since = self._since
        oldest_kept = self._clock() - MAX_AGE
        while since:
            (segment, offset, generation), first = next(iter(since.items()))
            if len(since) < MAX_GRANTS and first >= oldest_kept:
                break
            self._drop(segment, offset, generation)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` sorted, those that touch or overlap made one."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged
