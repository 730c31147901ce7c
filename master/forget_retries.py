"""Forgets a node answered it could not carry out, sent again until it can (sans-IO).

A node whose index log cannot take a removal record (a full disk) answers a Forget with a
failure: it still lists the object, so the master keeps the space quarantined
(quarantine.py). Never sent again, that space would stay lost until the node remounted; so
the Forget is sent again, later. Per segment, not per Forget: a disk that is full fails them
all alike, and a node holding thousands of them quarantined must not get thousands of
failing commands a minute. One of a segment's failed Forgets goes as a probe, 1 s after the
first failure, then twice as long after each failed probe, up to 30 s; once any Forget of the
segment succeeds, the others waiting go at once.

A Forget failed because a client on the node's host still holds a lock on the range it
writes (``WRITER_HOLDS_RANGE``: a writer stopped mid-copy, storage_node/commands.py) waits
apart (``channel`` "writer"): its failure says nothing of the segment's log, so another
Forget's success does not send it again at once (each try costs the node's command stream a
short wait), and its success does not send the others.

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


#: The channel of Forgets a same-host writer's lock failed (see above).
WRITER = "writer"


class ForgetRetries:
    def __init__(self) -> None:
        #: (segment id, channel) -> its failed Forgets.
        self._segments: dict[tuple[str, str], _Segment] = {}
        #: (when, sequence, (segment id, channel)) of planned probes; an entry whose segment
        #: has planned another time since is stale, skipped.
        self._plan: list[tuple[float, int, tuple[str, str]]] = []
        self._sequence = itertools.count()

    def __bool__(self) -> bool:
        """Whether any segment has failed Forgets waiting or a probe out."""
        return bool(self._segments)

    def failed(
        self,
        forget: ForgetCommand,
        current: Callable[[str], SegmentRecord | None],
        now: float,
        channel: str = "",
    ) -> None:
        """The node failed ``forget`` (``current``: a segment's record now): it goes again
        with the next probe of its segment's ``channel`` (planned now, unless one is out)."""
        key = (forget.segment_id, channel)
        other = (forget.segment_id, "" if channel == WRITER else WRITER)
        moved = self._segments.get(other)
        if moved is not None and moved.probe == forget.command_id:
            # (a probe of the other channel failed for this one's reason now: that channel
            # is not left waiting on it; its next probe is planned as after a failure)
            moved.probe = None
            if moved.waiting:
                self._plan_probe(moved, other, now)
            else:
                del self._segments[other]
        segment = current(forget.segment_id)
        if segment is None or segment.node_id != forget.node_id:
            self._segments.pop(key, None)
            return
        entry = self._segments.get(key)
        if entry is None or entry.segment is not segment:
            entry = self._segments[key] = _Segment(segment)
        entry.waiting[forget.command_id] = forget
        if entry.probe == forget.command_id or entry.probe is None:
            entry.probe = None
            if entry.due is None:
                self._plan_probe(entry, key, now)

    def _plan_probe(self, entry: _Segment, key: tuple[str, str], now: float) -> None:
        """Plans the next probe of ``entry`` after one more failure's wait."""
        entry.failures += 1
        delay = min(FORGET_RETRY_FIRST * 2 ** (entry.failures - 1), FORGET_RETRY_MAX)
        entry.due = now + delay
        heapq.heappush(self._plan, (entry.due, next(self._sequence), key))

    def succeeded(
        self, forget: ForgetCommand, current: Callable[[str], SegmentRecord | None]
    ) -> list[ForgetCommand]:
        """The node carried out ``forget``: the failed Forgets of its channel waiting, to
        send now (its log takes records again; its writers let go)."""
        again: list[ForgetCommand] = []
        for channel in ("", WRITER):
            key = (forget.segment_id, channel)
            entry = self._segments.get(key)
            if entry is None:
                continue
            if channel == WRITER and entry.probe != forget.command_id:
                continue  # (a writer's lock is gone only where this was the writers' probe)
            if channel == "" and forget.command_id in _probes_of(self._segments, WRITER):
                continue  # (a writers' probe: says nothing of the segment's log)
            if current(forget.segment_id) is not entry.segment:
                del self._segments[key]
                continue
            again += entry.waiting.values()
            if entry.probe in (None, forget.command_id):
                del self._segments[key]
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
            when, _, key = heapq.heappop(plan)
            entry = self._segments.get(key)
            if entry is None or entry.due != when:
                continue  # (stale)
            if current(key[0]) is not entry.segment or not entry.waiting:
                del self._segments[key]
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
            when, _, key = plan[0]
            entry = self._segments.get(key)
            if entry is not None and entry.due == when:
                return when
            heapq.heappop(plan)  # (stale)
        return None

    def node_gone(self, node_id: str) -> None:
        """The node was declared dead: its segments went, and what waited for them."""
        for key in [k for k, s in self._segments.items() if s.segment.node_id == node_id]:
            del self._segments[key]


def _probes_of(segments: dict[tuple[str, str], _Segment], channel: str) -> set[int]:
    """The probes out on ``channel``, of every segment."""
    return {e.probe for (_, c), e in segments.items() if c == channel and e.probe is not None}
