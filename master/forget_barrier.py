"""A writer gets space only after its node has forgotten what lay there before.

When an object is removed, evicted or moved, the master frees its space and tells the node to
forget it (a Forget on the node's command stream). Until the node has done so, the node's index
still lists the old object there. Were the master to die in that window while a writer was
already putting new bytes into that space, a new leader would rebuild its index from the node,
adopt the old object, and serve whatever bytes the writer left in it. So ``PutStart`` holds back
a reservation whose buffer overlaps a range with a Forget still unanswered, until the node
answers (in the normal case a fraction of a millisecond: nodes run commands in order, quickly).

This is I/O-layer bookkeeping beside the sans-IO core: the core frees and reallocates as
always; only the moment the writer learns where to write waits.
"""

from __future__ import annotations

import asyncio

from kvpool.master.records import ForgetCommand


class ForgetBarrier:
    def __init__(self) -> None:
        #: segment id -> command id -> byte ranges (start, end) of its unanswered Forget.
        self._ranges: dict[str, dict[int, list[tuple[int, int]]]] = {}
        self._answers: dict[int, asyncio.Future[None]] = {}
        self._segment_of: dict[int, str] = {}
        self._node_of: dict[int, str] = {}

    def sent(self, command: ForgetCommand) -> None:
        ranges = [(o.offset, o.offset + max(o.size, 1)) for o in command.objects]
        self._ranges.setdefault(command.segment_id, {})[command.command_id] = ranges
        self._answers[command.command_id] = asyncio.get_running_loop().create_future()
        self._segment_of[command.command_id] = command.segment_id
        self._node_of[command.command_id] = command.node_id

    def answered(self, command_id: int) -> None:
        """The node answered (whatever it said, it no longer lists the object)."""
        segment_id = self._segment_of.pop(command_id, None)
        if segment_id is None:
            return
        del self._node_of[command_id]
        in_segment = self._ranges.get(segment_id, {})
        in_segment.pop(command_id, None)
        if not in_segment:
            self._ranges.pop(segment_id, None)
        answer = self._answers.pop(command_id)
        if not answer.done():
            answer.set_result(None)

    def node_gone(self, node_id: str) -> None:
        """The node was declared dead (its segments with it): stop waiting for it."""
        for command_id in [c for c, n in self._node_of.items() if n == node_id]:
            self.answered(command_id)

    def clear(self) -> None:
        for command_id in list(self._segment_of):
            self.answered(command_id)

    def pending(self, segment_id: str, offset: int, size: int) -> list[asyncio.Future[None]]:
        """The answers a writer of ``size`` bytes at ``offset`` must wait for."""
        end = offset + max(size, 1)
        return [
            self._answers[command_id]
            for command_id, ranges in self._ranges.get(segment_id, {}).items()
            if any(start < end and offset < stop for start, stop in ranges)
        ]

    def __len__(self) -> int:
        return len(self._answers)
