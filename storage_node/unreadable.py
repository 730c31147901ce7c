"""Places in a segment its disk failed to read, until the next heartbeat tells the master.

A reader that gets DISK_ERROR reads another replica, but the master would go on listing the
bad one first to every reader, and count it as a copy for re-replication. So the checked
stream notes the object a failed read was of (``note``, from its connection's thread: its
offset and generation, as the read's capability named them), and the heartbeat loop finds
the index's entries of exactly those (``take``: one pass over the index, off the event loop)
and sends them. The generation matters: an object removed before the heartbeat and another
written at its place must not be reported in its stead. Bounded: a disk failing everywhere
notes ``LIMIT`` objects between two heartbeats, the rest at the next failed reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from kvpool.storage_node.index_log import Entry

#: Places noted at most between two heartbeats.
LIMIT = 256


class UnreadablePlaces:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._noted: set[tuple[int, int]] = set()

    def note(self, offset: int, generation: int) -> None:
        """A read of the object at ``offset`` of ``generation`` failed on the disk."""
        with self._lock:
            if len(self._noted) < LIMIT:
                self._noted.add((offset, generation))

    def any(self) -> bool:
        return bool(self._noted)

    def take(self, entries: Callable[[], Iterable[Entry]]) -> list[Entry]:
        """The recorded objects (``entries``: the segment's index, read only when one was
        noted) noted since the last call, by place and generation; let go once taken."""
        with self._lock:
            noted, self._noted = self._noted, set()
        if not noted:
            return []
        return [entry for entry in entries() if (entry.offset, entry.generation) in noted]

    def give_back(self, entries: Iterable[Entry]) -> None:
        """``take``'s objects, not sent after all (the heartbeat failed): noted again."""
        for entry in entries:
            self.note(entry.offset, entry.generation)
