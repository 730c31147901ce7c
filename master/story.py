"""What happened to a key: a bounded log of the rarer events of each object's life.

When an operator asks why a key is missing, or why a reader saw it half-written, the answer
is in the order of events the master applied to that key: which put reserved it where, when
its nodes recorded it, who removed, evicted or lost it. ``MasterState`` notes each such event
here as it applies it, and ``story(key)`` reads them back (``kvpool story KEY``).

Reads are not noted: a lease on every hit would make the log cost as much as the read path,
and the object's ``stat`` already says when it was last read. Everything else happens once
or a few times per object, so noting it must only cost little: an entry is a plain tuple
``(time, event, value...)`` whose values ``FIELDS`` names when a story is read, not when it
is written.

The log is one ring of the last ``capacity`` events of all keys, oldest overwritten first, so
that its memory stays bounded under any workload while the keys someone is chasing now (whose
events are recent) stay in it. An event is written once, into the ring, and never moved: a
table per key (a list per key in an ordered dict, as this log first was) cost more than twice
as much memory per object and its upkeep at every event, while reading a story, rare and for a
person, can afford to scan the ring. ``per_key`` bounds what one story tells.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvpool.master.records import ObjectState, Replica

#: Event name -> the names of the values its entries carry, in order.
FIELDS: dict[str, tuple[str, ...]] = {
    # Life cycle (each is also a transition of the object's state).
    "reserved": ("put_id", "client", "replicas"),
    "committed": ("put_id", "unwritten"),  # replicas its writer did not write
    "published": ("put_id", "replicas"),
    "adopted": ("put_id", "replica"),  # a node reported it on remount
    # The end of an object.
    "revoked": ("put_id",),  # its writer gave the reservation up
    "reclaimed": ("put_id", "reason"),  # the reservation timed out or its writer died
    "write_failed": ("put_id",),  # its writer wrote no replica
    "not_recorded": ("put_id",),  # no node recorded it
    "removed": ("put_id", "state", "force"),
    "superseded": ("put_id", "by_put_id"),  # a node reported a newer write of the key
    "evicted": ("put_id", "replicas"),
    "lost": ("put_id", "state", "segment"),  # its last replica went with its segment
    "unreadable": ("put_id", "replica"),  # its node's disk failed to read its last replica
    # Replicas of a living object.
    "replica_adopted": ("put_id", "replica"),
    "persist_failed": ("put_id", "segment", "expired"),  # a node did not record it
    "replica_lost": ("put_id", "segment"),
    "replica_evicted": ("put_id", "replica"),
    "demoting": ("put_id", "source", "target"),
    "promoting": ("put_id", "source", "target"),
    "demoted": ("put_id", "replica"),
    "promoted": ("put_id", "replica"),
    "replicating": ("put_id", "source", "target"),  # a copy to another node began
    "replicated": ("put_id", "replica"),
    "replica_trimmed": ("put_id", "replica"),  # a surplus (its node came back)
    "replica_unreadable": ("put_id", "replica"),  # its node's disk failed to read it
    "replica_corrupt": ("put_id", "replica"),  # a copy found its bytes failing the checksum
    "move_failed": ("put_id", "target", "reason"),
    "pin_ended": ("put_id",),
}

#: Defaults of the bounds (MasterConfig's story_events_per_key and story_events): a put is
#: three events (reserved, committed, published), so the ring holds the last 100,000 puts'.
EVENTS_PER_KEY = 32
EVENTS = 300_000


class StoryEvent(NamedTuple):
    time: float  # on the master's clock
    event: str  # a key of FIELDS
    details: dict[str, Any]


class StoryLog:
    """Noting is one C call (``note``, a list's append of ``(key, time, event, value...)``):
    an event goes to ``pending`` first, and the pending events are copied into the ring in
    one slice assignment (``fold``), by the master once per put batch and tick and by every
    read here. A Python call per event cost about as much as the rest of a key's transition;
    what a reader sees is the same."""

    __slots__ = ("_next", "_ring", "capacity", "note", "pending", "per_key")

    def __init__(self, per_key: int = EVENTS_PER_KEY, capacity: int = EVENTS) -> None:
        if per_key < 1:
            raise ValueError(f"per_key must be at least 1, got {per_key}")
        if capacity < 0:
            raise ValueError(f"capacity must not be negative, got {capacity}")
        self.per_key = per_key
        self.capacity = capacity  # 0: nothing is kept
        #: The events kept, oldest at ``_next`` once the ring is full (before: at 0).
        self._ring: list[tuple[Any, ...]] = []
        self._next = 0
        #: Events noted and not yet folded into the ring, oldest first.
        self.pending: list[tuple[Any, ...]] = []
        #: Notes ``(key, time, event, value...)`` with the values FIELDS[event] names.
        self.note = self.pending.append

    def add(self, entry: tuple[Any, ...]) -> None:
        """Notes ``entry``, ``(key, time, event, value...)``, and folds it in."""
        self.note(entry)
        self.fold()

    def fold(self) -> None:
        """Moves the pending events into the ring, in the order they were noted."""
        pending = self.pending
        if not pending:
            return
        ring, capacity = self._ring, self.capacity
        if len(pending) >= capacity:
            ring[:] = pending[len(pending) - capacity :]
            self._next = 0
        else:
            room = capacity - len(ring)
            if room >= len(pending):  # (filling: the ring grows)
                ring += pending
            else:
                if room:
                    ring += pending[:room]
                    del pending[:room]
                    self._next = 0
                at, end = self._next, self._next + len(pending)
                if end <= capacity:
                    ring[at:end] = pending
                else:  # (wraps around)
                    ring[at:] = pending[: capacity - at]
                    ring[: end - capacity] = pending[capacity - at :]
                self._next = end % capacity
        pending.clear()

    def story(self, key: str) -> list[StoryEvent]:
        """The last ``per_key`` events noted for ``key``, oldest first (empty when none is
        left)."""
        self.fold()
        ring, at = self._ring, self._next
        mine = [e for e in ring[at:] if e[0] == key]
        mine += [e for e in ring[:at] if e[0] == key]
        return [
            StoryEvent(e[1], e[2], dict(zip(FIELDS[e[2]], e[3:], strict=True)))
            for e in mine[-self.per_key :]
        ]

    def __len__(self) -> int:
        """Events kept."""
        self.fold()
        return len(self._ring)

    def __contains__(self, key: str) -> bool:
        self.fold()
        return any(e[0] == key for e in self._ring)


def format_value(value: Any) -> str:
    """A detail as an operator reads it: replicas as ``segment@offset``."""
    if value is None:
        return "-"
    if isinstance(value, Replica):
        return f"{value.segment_id}@{value.offset:#x}"
    if isinstance(value, tuple | list):
        return ", ".join(format_value(v) for v in value) or "-"
    if isinstance(value, ObjectState):
        return value.value
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
