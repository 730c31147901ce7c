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

from kvpool.master.records import SegmentRecord


@dataclass(slots=True)
class _Held:
    segment: SegmentRecord
    #: (start, end) byte ranges the node may still list.
    ranges: list[tuple[int, int]]
    #: Offsets of the buffers allocated to the quarantine in them.
    buffers: list[int] = field(default_factory=list)


class Quarantine:
    def __init__(self) -> None:
        #: Forget command id -> what it holds out of use.
        self._held: dict[int, _Held] = {}

    def add(self, token: int, segment: SegmentRecord, ranges: list[tuple[int, int]]) -> None:
        """Holds ``ranges`` of ``segment`` out of use until ``release(token)``; takes what is
        free in them now."""
        held = self._held[token] = _Held(segment, ranges)
        allocator = segment.allocator
        for free_start, free_size in allocator.free_extents():
            free_end = free_start + free_size
            for start, end in ranges:
                start, end = max(start, free_start), min(end, free_end)
                if start < end and allocator.allocate_at(start, end - start):
                    held.buffers.append(start)

    def claim(self, segment: SegmentRecord, offset: int) -> bool:
        """A buffer of ``segment`` at ``offset`` is being freed: True when the quarantine
        keeps it (it overlaps a held range) instead."""
        end = offset + segment.allocator.size_of(offset)
        for held in self._held.values():
            if held.segment is segment and any(s < end and offset < e for s, e in held.ranges):
                held.buffers.append(offset)
                return True
        return False

    def release(self, token: int) -> None:
        """The node answered: the space returns to the allocator (unless its segment went),
        but for what another unanswered Forget of the same space still holds (two Forgets of
        one range: an object's, then a copy's that landed there)."""
        held = self._held.pop(token, None)
        if held is None:
            return
        for offset in held.buffers:
            if not self.claim(held.segment, offset):
                held.segment.allocator.free(offset)

    def drop_segment(self, segment: SegmentRecord) -> None:
        """The segment went away: nothing of it is held any more (its node, were it to come
        back, reports what it holds, and the master adopts it or has it dropped)."""
        for token in [t for t, held in self._held.items() if held.segment is segment]:
            del self._held[token]

    def buffers(self) -> list[tuple[SegmentRecord, int]]:
        """Every buffer held (for validate())."""
        return [(held.segment, offset) for held in self._held.values() for offset in held.buffers]

    def __contains__(self, token: int) -> bool:
        return token in self._held

    def __len__(self) -> int:
        return len(self._held)
