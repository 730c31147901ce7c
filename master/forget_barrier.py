"""A writer gets space only after its node has forgotten what lay there before (sans-IO).

When an object is removed, evicted or moved, the master frees its space and tells the node to
forget it (a Forget on the node's command stream). Until the node has done so, the node's index
still lists the old object there. Were the master to die in that window while a writer was
already putting new bytes into that space, a new leader would rebuild its index from the node,
adopt the old object, and serve whatever bytes the writer left in it. So the core holds back a
``PutStart`` whose buffers overlap a range with a Forget still unanswered, until the node
answers (nodes run commands in order, quickly) or the wait runs out (master/core.py).

This module only keeps the unanswered Forgets' byte ranges and says which of them a buffer
overlaps; waiting is the core's business, and it has no clock or I/O.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from kvpool.master.records import ForgetCommand


@dataclass(slots=True)
class _Unanswered:
    node_id: str
    segment_id: str
    #: The (start, end) of each object it names, ordered by start; ``reach[i]``: the largest
    #: end among the first i + 1. A Forget may name thousands of objects (a large removal) and
    #: every key of a PutStart asks about it: a search, not a scan.
    starts: list[int]
    ends: list[int]
    reach: list[int]

    def overlaps(self, offset: int, end: int) -> bool:
        """Whether any of its ranges overlaps [offset, end)."""
        i = bisect.bisect_left(self.starts, end) - 1  # the last range starting before ``end``
        reach, ends = self.reach, self.ends
        while i >= 0 and reach[i] > offset:  # some range up to i still ends after ``offset``
            if ends[i] > offset:
                return True
            i -= 1
        return False


class ForgetBarrier:
    def __init__(self) -> None:
        #: segment id -> command id -> its Forget, unanswered.
        self._by_segment: dict[str, dict[int, _Unanswered]] = {}
        self._by_id: dict[int, _Unanswered] = {}

    def sent(self, command: ForgetCommand) -> None:
        """Holds back writers of the Forget's ranges until ``answered``."""
        ranges = sorted((o.offset, o.offset + max(o.size, 1)) for o in command.objects)
        ends = [end for _, end in ranges]
        forget = _Unanswered(
            command.node_id,
            command.segment_id,
            [start for start, _ in ranges],
            ends,
            list(itertools.accumulate(ends, max)),
        )
        self._by_segment.setdefault(command.segment_id, {})[command.command_id] = forget
        self._by_id[command.command_id] = forget

    def answered(self, command_id: int) -> bool:
        """The node answered (whatever it said, it no longer lists the objects); False when
        ``command_id`` held nothing back."""
        forget = self._by_id.pop(command_id, None)
        if forget is None:
            return False
        in_segment = self._by_segment[forget.segment_id]
        del in_segment[command_id]
        if not in_segment:
            del self._by_segment[forget.segment_id]
        return True

    def node_gone(self, node_id: str) -> list[int]:
        """The node was declared dead (its segments with it): nothing waits for it any more.
        Returns the Forgets released."""
        released = [c for c, f in self._by_id.items() if f.node_id == node_id]
        for command_id in released:
            self.answered(command_id)
        return released

    def pending(self, segment_id: str, offset: int, size: int) -> list[int]:
        """The Forgets a writer of ``size`` bytes at ``offset`` must wait for."""
        end = offset + max(size, 1)
        return [
            command_id
            for command_id, forget in self._by_segment.get(segment_id, {}).items()
            if forget.overlaps(offset, end)
        ]

    def __contains__(self, command_id: int) -> bool:
        return command_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)
