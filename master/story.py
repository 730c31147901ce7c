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

The log is bounded twice: at most ``per_key`` events per key (the oldest go first) and at
most ``max_keys`` keys (those whose last event is oldest go first), so that its memory stays
bounded under any workload while the keys someone is chasing now stay in it.
"""

from __future__ import annotations

from collections import OrderedDict
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
    "move_failed": ("put_id", "target", "reason"),
    "pin_ended": ("put_id",),
}

#: Defaults of the bounds (MasterConfig's story_events_per_key and story_keys).
EVENTS_PER_KEY = 32
KEYS = 100_000


class StoryEvent(NamedTuple):
    time: float  # on the master's clock
    event: str  # a key of FIELDS
    details: dict[str, Any]


class StoryLog:
    """Noting is one C call (``note``, a list's append): an event goes to ``pending`` first,
    and the pending events are folded into the per-key log in one loop (``fold``), by the
    master once per put batch and tick and by every read here. A Python call per event cost
    about as much as the rest of a key's transition; what a reader sees is the same."""

    __slots__ = ("_keys", "max_keys", "note", "pending", "per_key")

    def __init__(self, per_key: int = EVENTS_PER_KEY, max_keys: int = KEYS) -> None:
        if per_key < 1:
            raise ValueError(f"per_key must be at least 1, got {per_key}")
        if max_keys < 0:
            raise ValueError(f"max_keys must not be negative, got {max_keys}")
        self.per_key = per_key
        self.max_keys = max_keys  # 0: nothing is kept
        self._keys: OrderedDict[str, list[tuple[Any, ...]]] = OrderedDict()
        #: ``(key, entry)`` pairs noted and not yet folded into ``_keys``, oldest first.
        self.pending: list[tuple[str, tuple[Any, ...]]] = []
        #: Notes ``(key, entry)``: entry is ``(time, event, value...)`` as for ``add``.
        self.note = self.pending.append

    def add(self, key: str, entry: tuple[Any, ...]) -> None:
        """Notes ``entry``, ``(time, event, value...)`` with the values FIELDS[event] names."""
        self.note((key, entry))
        self.fold()

    def fold(self) -> None:
        """Moves the pending events into the per-key log, in the order they were noted."""
        pending = self.pending
        if not pending:
            return
        keys = self._keys
        find, to_end = keys.get, keys.move_to_end
        per_key, max_keys = self.per_key, self.max_keys
        for key, entry in pending:
            events = find(key)
            if events is None:
                keys[key] = [entry]
                if len(keys) > max_keys:
                    keys.popitem(last=False)
                continue
            to_end(key)
            events.append(entry)
            if len(events) > per_key:
                del events[0]
        pending.clear()

    def story(self, key: str) -> list[StoryEvent]:
        """The events noted for ``key``, oldest first (empty when none is left)."""
        self.fold()
        return [
            StoryEvent(entry[0], entry[1], dict(zip(FIELDS[entry[1]], entry[2:], strict=True)))
            for entry in self._keys.get(key, ())
        ]

    def __len__(self) -> int:
        self.fold()
        return len(self._keys)

    def __contains__(self, key: str) -> bool:
        self.fold()
        return key in self._keys


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
