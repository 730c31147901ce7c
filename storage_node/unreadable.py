"""Places in a segment its disk failed to read, until the next heartbeat tells the master.

A reader that gets DISK_ERROR reads another replica, but the master would go on listing the
bad one first to every reader, and count it as a copy for re-replication. So the checked
stream notes where a read failed (``note``, from its connection's thread: a set's add), and
the heartbeat loop turns the places into the objects recorded there (``take``: one pass over
the index) and sends them. Bounded: a disk failing everywhere notes ``LIMIT`` places between
two heartbeats, the rest at the next failed reads.
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
        self._offsets: set[int] = set()

    def note(self, offset: int) -> None:
        """A read at ``offset`` (an object's bytes) failed on the disk."""
        with self._lock:
            if len(self._offsets) < LIMIT:
                self._offsets.add(offset)

    def take(self, entries: Callable[[], Iterable[Entry]]) -> list[Entry]:
        """The recorded objects (``entries``: the segment's index, read only when a place
        was noted) whose bytes hold a place noted since the last call; the places are let
        go."""
        with self._lock:
            offsets, self._offsets = self._offsets, set()
        if not offsets:
            return []
        starts = sorted(offsets)
        found = []
        for entry in entries():
            end = entry.offset + max(entry.size, 1)
            if any(entry.offset <= at < end for at in starts):
                found.append(entry)
        return found

    def give_back(self, entries: Iterable[Entry]) -> None:
        """``take``'s objects, not sent after all (the heartbeat failed): noted again."""
        for entry in entries:
            self.note(entry.offset)
