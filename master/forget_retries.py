"""Forgets a node answered it could not carry out, sent again until it can (sans-IO).

A node whose index log cannot take a removal record (a full disk) answers a Forget with a
failure: it still lists the object, so the master keeps the space quarantined
(quarantine.py). Never sent again, that space would stay lost until the node remounted; so
the Forget is sent again, later. Per segment, not per Forget: a disk that is full fails them
all alike, and a node holding thousands of them quarantined must not get thousands of
failing commands a minute. One of a segment's failed Forgets goes as a probe, 1 s after the
first failure, then twice as long after each failed probe, up to 30 s; once any Forget of the
segment succeeds, the others waiting go at once.

Only to the mount they were for: a segment remounted under the same id (a node restarted,
or declared dead and back) is reconciled by its mount, which refuses what the master no
longer holds and forgets it itself (tombstones.py). A Forget of the old mount sent after that
could name an object copied since to the same place and generation, and the node, which
matches place and generation, would drop a replica the master counts on.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpool.master.records import ForgetCommand, SegmentRecord

#: The wait before a segment's first probe, doubled after each failed probe up to the most.
FORGET_RETRY_FIRST = 1.0
FORGET_RETRY_MAX = 30.0


@dataclass(slots=True)
class _Segment:
    #: The mount the Forgets were for.
    segment: SegmentRecord
    #: Failed Forgets not sent again yet, by id, oldest first.
    waiting: dict[int, ForgetCommand] = field(default_factory=dict)
    #: Probes that failed in a row.
    failures: int = 0
    #: When the next probe goes (None: none planned: one is out, or none waits).
    due: float | None = None
    #: The probe out, if any.
    probe: int | None = None


class ForgetRetries:
    def __init__(self) -> None:
        self._segments: dict[str, _Segment] = {}
        #: (when, sequence, segment id) of planned probes; an entry whose segment has planned
        #: another time since is stale, skipped.
        self._plan: list[tuple[float, int, str]] = []
        self._sequence = itertools.count()

    def __bool__(self) -> bool:
        """Whether any segment has failed Forgets waiting or a probe out."""
        return bool(self._segments)

    def failed(
        self, forget: ForgetCommand, current: Callable[[str], SegmentRecord | None], now: float
    ) -> None:
        """The node failed ``forget`` (``current``: a segment's record now): it goes again
        with the segment's next probe (planned now, unless a probe is out)."""
        segment = current(forget.segment_id)
        if segment is None or segment.node_id != forget.node_id:
            self._segments.pop(forget.segment_id, None)
            return
        entry = self._segments.get(forget.segment_id)
        if entry is None or entry.segment is not segment:
            entry = self._segments[forget.segment_id] = _Segment(segment)
        entry.waiting[forget.command_id] = forget
        if entry.probe == forget.command_id or entry.probe is None:
            entry.probe = None
            if entry.due is None:
                entry.failures += 1
                delay = min(FORGET_RETRY_FIRST * 2 ** (entry.failures - 1), FORGET_RETRY_MAX)
                entry.due = now + delay
                heapq.heappush(self._plan, (entry.due, next(self._sequence), forget.segment_id))

    def succeeded(
        self, forget: ForgetCommand, current: Callable[[str], SegmentRecord | None]
    ) -> list[ForgetCommand]:
        """The node carried out ``forget``: the segment's failed Forgets waiting, to send
        now (its log takes records again)."""
        entry = self._segments.get(forget.segment_id)
        if entry is None:
            return []
        if current(forget.segment_id) is not entry.segment:
            del self._segments[forget.segment_id]
            return []
        again = list(entry.waiting.values())
        if entry.probe in (None, forget.command_id):
            del self._segments[forget.segment_id]
        else:  # the probe is still out: kept track of, its failure starts the waits over
            entry.waiting.clear()
            entry.failures = 0
        return again

    def due(
        self, now: float, current: Callable[[str], SegmentRecord | None]
    ) -> list[ForgetCommand]:
        """The probes to send now: one failed Forget of each segment whose wait passed
        (``current``: the segment's record now; one remounted since gets none)."""
        probes = []
        plan = self._plan
        while plan and plan[0][0] <= now:
            when, _, segment_id = heapq.heappop(plan)
            entry = self._segments.get(segment_id)
            if entry is None or entry.due != when:
                continue  # (stale)
            if current(segment_id) is not entry.segment or not entry.waiting:
                del self._segments[segment_id]
                continue
            command_id, probe = next(iter(entry.waiting.items()))
            del entry.waiting[command_id]
            entry.due = None
            entry.probe = command_id
            probes.append(probe)
        return probes

    def next_deadline(self) -> float | None:
        plan = self._plan
        while plan:
            when, _, segment_id = plan[0]
            entry = self._segments.get(segment_id)
            if entry is not None and entry.due == when:
                return when
            heapq.heappop(plan)  # (stale)
        return None

    def node_gone(self, node_id: str) -> None:
        """The node was declared dead: its segments went, and what waited for them."""
        for segment_id in [i for i, s in self._segments.items() if s.segment.node_id == node_id]:
            del self._segments[segment_id]
