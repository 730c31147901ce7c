"""Space a node may still list under an object the master dropped, held out of use (sans-IO).

A writer never gets space whose node has not yet confirmed forgetting what lay there (the
forget barrier, forget_barrier.py): normally the node answers in a fraction of a millisecond.
When it does not (its stream broke, it is paused), holding every writer back would stall puts
to that segment for as long as the node stays silent. So after a short wait the core takes
such a Forget's byte ranges out of use instead, here: what is free in them is allocated to the
quarantine at once, what is still in use (a buffer waiting for a reader's lease to end, a copy
target) joins it when it is freed; and everything returns to the allocator once the node
answers the Forget, or the segment goes. Writers meanwhile get space elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sortedcontainers import SortedList

from kvpool.master.records import SegmentRecord


@dataclass(slots=True)
class _Held:
    segment: SegmentRecord
    #: (start, end) byte ranges the node may still list.
    ranges: list[tuple[int, int]]
    #: Offsets of the buffers allocated to the quarantine in them.
    buffers: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _SegmentRanges:
    """Every range held in one segment, by start: (start, end, Forget's token). Why: each
    buffer freed while anything is held asks whether a held range overlaps it, and a node
    slow to answer a burst of Forgets leaves thousands of ranges held; a scan of them all
    per buffer made the release of a few such Forgets take the master's loop for tens of
    seconds (long enough to declare its nodes dead)."""

    segment: SegmentRecord
    ranges: SortedList = field(default_factory=SortedList)
    #: The longest range ever held here (how far before a buffer an overlapping range can
    #: start).
    longest: int = 0

    def overlapping(self, start: int, end: int) -> int | None:
        """The token of a held range overlapping ``start``..``end``, or None."""
        ranges = self.ranges
        i = ranges.bisect_left((end,))  # (those before it start before ``end``)
        reach = start - self.longest
        while i > 0:
            i -= 1
            held: tuple[int, int, int] = ranges[i]
            held_start, held_end, token = held
            if held_start < reach:
                return None  # (nothing starting this early reaches ``start``)
            if held_end > start:
                return token
        return None


class Quarantine:
    def __init__(self) -> None:
        #: Forget command id -> what it holds out of use.
        self._held: dict[int, _Held] = {}
        #: Segment id -> its held ranges (while it has any).
        self._by_segment: dict[str, _SegmentRanges] = {}

    def add(self, token: int, segment: SegmentRecord, ranges: list[tuple[int, int]]) -> None:
        """Holds ``ranges`` of ``segment`` out of use until ``release(token)``; takes what is
        free in them now."""
        held = self._held[token] = _Held(segment, ranges)
        index = self._ranges_of(segment)
        if index is None:
            index = self._by_segment[segment.segment_id] = _SegmentRanges(segment)
        for start, end in ranges:
            index.ranges.add((start, end, token))
            index.longest = max(index.longest, end - start)
        allocator = segment.allocator
        # (both by offset: one sweep, not every range against every free extent)
        extents = allocator.free_extents()
        i = 0
        for start, end in sorted(ranges):
            while i < len(extents) and extents[i][0] + extents[i][1] <= start:
                i += 1
            j = i
            while j < len(extents) and extents[j][0] < end:
                free_start, free_size = extents[j]
                low, high = max(start, free_start), min(end, free_start + free_size)
                if low < high and allocator.allocate_at(low, high - low):
                    held.buffers.append(low)
                j += 1

    def claim(self, segment: SegmentRecord, offset: int) -> bool:
        """A buffer of ``segment`` at ``offset`` is being freed: True when the quarantine
        keeps it (it overlaps a held range) instead."""
        index = self._ranges_of(segment)
        if index is None:
            return False
        token = index.overlapping(offset, offset + segment.allocator.size_of(offset))
        if token is None:
            return False
        self._held[token].buffers.append(offset)
        return True

    def release(self, token: int) -> None:
        """The node answered: the space returns to the allocator (unless its segment went),
        but for what another unanswered Forget of the same space still holds (two Forgets of
        one range: an object's, then a copy's that landed there)."""
        held = self._held.pop(token, None)
        if held is None:
            return
        segment = held.segment
        index = self._ranges_of(segment)
        if index is not None:
            for start, end in held.ranges:
                index.ranges.discard((start, end, token))
            if not index.ranges:
                del self._by_segment[segment.segment_id]
        for offset in held.buffers:
            if not self.claim(segment, offset):
                segment.allocator.free(offset)

    def drop_segment(self, segment: SegmentRecord) -> None:
        """The segment went away: nothing of it is held any more (its node, were it to come
        back, reports what it holds, and the master adopts it or has it dropped)."""
        for token in [t for t, held in self._held.items() if held.segment is segment]:
            del self._held[token]
        if self._ranges_of(segment) is not None:
            del self._by_segment[segment.segment_id]

    def _ranges_of(self, segment: SegmentRecord) -> _SegmentRanges | None:
        """The ranges held in ``segment`` (not in an earlier record of its id), if any."""
        index = self._by_segment.get(segment.segment_id)
        return index if index is not None and index.segment is segment else None

    def buffers(self) -> list[tuple[SegmentRecord, int]]:
        """Every buffer held (for validate())."""
        return [(held.segment, offset) for held in self._held.values() for offset in held.buffers]

    def __contains__(self, token: int) -> bool:
        return token in self._held

    def __len__(self) -> int:
        return len(self._held)
