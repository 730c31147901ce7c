"""Removed objects a node may still hold when it mounts a segment again (sans-IO).

A node reports what its index holds when it remounts, and the master adopts it: that is how
objects outlive a node's pause or restart. But a node that was away (declared dead: paused,
cut off) missed the Forgets of what was removed meanwhile, and a Forget it never answered
may not have reached it. Adopting such an object brings a removed object back: its space
leaks until eviction, and a removal (of a tenant's prompts, say) does not stick.

So the master remembers, per segment, what the node may still list though it must not:

* **away**: each replica dropped with its segment (its node declared dead), by key and
  generation. That alone is no reason to refuse it: an object whose every replica went
  away is "lost" until its node comes back, and then adopted again.
* **tombstones**: an away replica whose object then ended (removed, evicted, superseded)
  becomes one: the object is gone, whatever the node says later.
* **unanswered Forgets**: a Forget sent for a recorded replica, until the node answers it.

At the segment's next mount, whatever of these it reports is not adopted (the node is told to
forget it); then the segment's entries are dropped: its report has been reconciled.

They live in this master's memory: a new leader does not have them (docs/reliability.md).

**Bounded.** ``limit`` entries in all. A segment that would pass it loses its entries and is
*distrusted* instead: at its next mount it adopts only replicas of objects the master still
holds (an object lost with it stays lost): losing a cached object is allowed, bringing back a
removed one is not.
"""

from __future__ import annotations

#: Entries kept at most (a few hundred bytes each), across every segment.
LIMIT = 1_000_000


class Tombstones:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        #: segment id -> key -> generation of the replica dropped with it.
        self._away: dict[str, dict[str, int]] = {}
        #: key -> segments where a replica of it went away (to find them when it ends).
        self._away_in: dict[str, set[str]] = {}
        #: segment id -> key -> newest generation ended there.
        self._dead: dict[str, dict[str, int]] = {}
        #: Forget command id -> (segment id, key, generation), until answered.
        self._unanswered: dict[int, tuple[str, str, int]] = {}
        #: segment id -> key -> generation of unanswered Forgets (how many, for each).
        self._forgetting: dict[str, dict[tuple[str, int], int]] = {}
        self._distrusted: set[str] = set()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    # ---- what is noted

    def away(self, segment_id: str, key: str, generation: int) -> None:
        """A replica of ``key`` was dropped with its segment (its node declared dead)."""
        if segment_id in self._distrusted or not self._room(segment_id):
            return
        held = self._away.setdefault(segment_id, {})
        if key not in held:
            self._size += 1
        held[key] = max(generation, held.get(key, 0))
        self._away_in.setdefault(key, set()).add(segment_id)

    def ended(self, key: str, generation: int) -> None:
        """The object (``generation`` of ``key``) is gone for good: its replicas that went
        away (this generation or older) become tombstones."""
        segments = self._away_in.pop(key, None)
        if not segments:
            return
        for segment_id in segments:
            held = self._away.get(segment_id)
            if held is None or key not in held:
                continue
            if held[key] > generation:
                self._away_in.setdefault(key, set()).add(segment_id)  # a newer one: kept
                continue
            del held[key]
            if not held:
                del self._away[segment_id]
            dead = self._dead.setdefault(segment_id, {})
            if key in dead:
                self._size -= 1
            dead[key] = max(generation, dead.get(key, 0))

    def sent(self, command_id: int, segment_id: str, key: str, generation: int) -> None:
        """A Forget went out for a recorded replica: refused at a remount until answered."""
        if segment_id in self._distrusted or not self._room(segment_id):
            return
        self._unanswered[command_id] = (segment_id, key, generation)
        counts = self._forgetting.setdefault(segment_id, {})
        counts[(key, generation)] = counts.get((key, generation), 0) + 1
        self._size += 1

    def answered(self, command_id: int) -> None:
        """The node answered that Forget: it holds the object no more."""
        entry = self._unanswered.pop(command_id, None)
        if entry is None:
            return
        segment_id, key, generation = entry
        self._size -= 1
        counts = self._forgetting.get(segment_id)
        if counts is None:
            return
        left = counts.get((key, generation), 0) - 1
        if left > 0:
            counts[(key, generation)] = left
            return
        counts.pop((key, generation), None)
        if not counts:
            del self._forgetting[segment_id]

    # ---- at a mount

    def refuses(self, segment_id: str, key: str, generation: int, known: bool) -> bool:
        """Whether a replica the node reports at a mount must not be adopted. ``known``:
        the master holds that generation of the object (a replica of it may come back)."""
        if segment_id in self._distrusted:
            return not known
        dead = self._dead.get(segment_id)
        if dead is not None and dead.get(key, 0) >= generation:
            return True
        counts = self._forgetting.get(segment_id)
        return counts is not None and (key, generation) in counts

    def mounted(self, segment_id: str) -> None:
        """The segment's report has been reconciled: nothing of it is kept any more."""
        self._distrusted.discard(segment_id)
        self._drop(segment_id)

    # ---- bounds

    def _room(self, segment_id: str) -> bool:
        if self._size < self.limit:
            return True
        self._drop(segment_id)
        self._distrusted.add(segment_id)
        return False

    def _drop(self, segment_id: str) -> None:
        for key in self._away.pop(segment_id, {}):
            self._size -= 1
            segments = self._away_in.get(key)
            if segments is not None:
                segments.discard(segment_id)
                if not segments:
                    del self._away_in[key]
        self._size -= len(self._dead.pop(segment_id, {}))
        if self._forgetting.pop(segment_id, None) is not None:
            for command_id in [c for c, e in self._unanswered.items() if e[0] == segment_id]:
                del self._unanswered[command_id]
                self._size -= 1
