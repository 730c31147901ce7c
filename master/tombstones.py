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
* **tombstones**: an away replica whose object then ended (removed, evicted, superseded,
  or, lost, followed by a newer generation published) becomes one: the object is gone,
  whatever the node says later.
* **unanswered Forgets**: a Forget sent for a recorded replica, until the node answers it.
* **writes given up while the segment was away**: a Persist or Copy to a segment its node
  was declared dead with, that the master stopped waiting for meanwhile. No Forget can follow
  it, and the node, paused with it queued, may carry it out after its next mount: at that
  mount it counts among the segment's late writes (``mounted``).
* **late writes kept out**: such a write (or one still unanswered) of an object that ended,
  or whose Forget is unanswered, refused after the mount: that generation only. A tombstone
  refuses older generations too (an object removed ends its older generations with it); a
  write that never published its object does not end an older generation that lives, which
  a report may bring back (adopted: a lost object returning with its node).

At the segment's next mount, whatever of these it reports is not adopted (the node is told to
forget it); then the segment's entries are dropped: its report has been reconciled. The answer
that tells the node can be lost (its call timed out, a partition began), so each object a
mount refuses also gets a Forget of its generation (``sent(..., exact=True)``), refused at
later mounts and kept in the durable record until the node answers it. A node holding more
than one call carries reports in parts: what the segment's entries refused at the first part
is held (``mounted(..., in_parts=True)``) and refused of every later part, kept in its
durable record too, until the last (``report_over``).

**Places.** A Forget names a place, and the node forgets nothing elsewhere: an unanswered
one refuses that place only (a copy of the same generation elsewhere on the segment, placed
before it went out, is adopted). The other entries (tombstones, late writes kept out, and
every entry of a durable record, which keeps keys and generations only) refuse every place
of their generation on the segment. No copy of an object is placed on a segment where any
entry of its generation could refuse it, wherever it landed (``refuses`` with ``ANY``;
``MasterState._refused_at_remount``): the node would be told to forget it at the next mount.
The invariant "live copies lie where a remount adopts them" checks both.

**Nodes a new leader has not heard from.** A new leader does not know the segments of a node
that has not remounted yet; once its rebuild window has passed it takes clients anyway, and
that node may still hold objects they remove. So, per such node (``unheard``), every object
that ends from then on is noted under the node's own entry (``node_entry``: a durable record
like a segment's), refused at the mount of any of its segments, and dropped once the node
has mounted them all (``heard``, at its heartbeat). A removal of a whole prefix reaches keys
no one here can list, those such a node may hold: its entry then refuses every key under
that prefix that the master does not hold, up to the newest generation issued
(``distrust_unheard``). Only that prefix: one tenant removing its own keys must not cost
another tenant the objects the node brings back. Only a removal of every key distrusts the
whole node.

**Across leaders.** A new leader starts with an empty index and adopts what nodes report, so
the entries a removal's answer relied on must outlive this master: tombstones, and Forgets
past the master's wait (the removal was answered unconfirmed) or left by a node declared
dead. Those make a segment's *durable record* (``record``); the segments whose record changed
are collected (``take_changed``) for the I/O layer to write to etcd before it answers, and a
new leader ``restore``s the records before it takes mounts (master/tombstone_store.py).
A record holds at most ``RECORD_LIMIT`` keys; past that it says "distrusted" instead.

**Aged out.** A segment away for ``MAX_AGE`` (its node has been replaced: a DRAM segment,
whose id a restarted node never uses again, never comes back at all) loses its entries
(``forget_segment``, which the state calls), as the durable records do: a node paused longer
than that may bring back what was removed while it was away.

**Bounded.** ``limit`` entries in all. A segment that would pass it loses its entries and is
*distrusted* instead: at its next mount it adopts only replicas of objects the master still
holds (an object lost with it stays lost): losing a cached object is allowed, bringing back a
removed one is not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: Entries kept at most (a few hundred bytes each), across every segment.
LIMIT = 1_000_000
#: Seconds after which what is kept of a segment away goes (here, and its durable record):
#: a node away that long has been replaced.
MAX_AGE = 7 * 24 * 3600.0
#: Keys one segment's durable record lists at most; past that, or past ``RECORD_BYTES``, the
#: record says "distrusted" instead.
RECORD_LIMIT = 4096
#: Bytes the keys of one record may take, encoded: well under etcd's 1.5 MiB request limit.
RECORD_BYTES = 768 << 10
#: What each key adds to a record beyond its own bytes (quotes, colon, generation, comma).
_PER_KEY_BYTES = 26
#: Prefixes one node's entry distrusts at most, of one tenant (keys up to the first
#: ``NAMESPACE_END``), and of all: past the first, the tenant's make way for its whole
#: namespace; past the second, the node is distrusted whole (``distrust_unheard``). One
#: tenant cannot make another lose its objects on that node.
MAX_PREFIXES_PER_NAMESPACE = 16
MAX_DISTRUSTED_PREFIXES = 1024
#: Keys of one tenant one node's entry notes as ended at most (``ended``): past that, they
#: make way for a distrust of the tenant's namespace, so that one tenant's removals cannot
#: fill the node's record (which past ``RECORD_LIMIT`` distrusts the whole node).
MAX_ENDED_PER_NAMESPACE = 512
#: What ends a tenant's namespace in a key (security/identity.py's ``TENANT_SEPARATOR``).
NAMESPACE_END = "/"


#: The place of an entry that names none (every place of its key and generation on the
#: segment): what a query about a copy not placed yet asks, and what ``sent`` notes without
#: an offset.
ANY = -1

#: What begins the entry of a node (rather than a segment): no segment id has it.
NODE_PREFIX = "node:"


def node_entry(node_id: str) -> str:
    """The name under which a node's own entry is kept and written, beside its segments'."""
    return NODE_PREFIX + node_id


@dataclass(frozen=True, slots=True)
class DurableRecord:
    """What a new leader must know of one segment: refuse every key in ``keys`` (this
    generation or older) and every (key, generation) in ``exact`` (that one only), or,
    ``distrusted``, adopt nothing it does not already hold."""

    distrusted: bool
    keys: dict[str, int]
    exact: frozenset[tuple[str, int]] = frozenset()
    #: (prefix, generation): every key under the prefix that the master does not hold, that
    #: generation or older (a prefix removal that nodes not heard from may not know of).
    prefixes: frozenset[tuple[str, int]] = frozenset()

    @property
    def empty(self) -> bool:
        """Whether it refuses nothing (no record need be kept)."""
        return not (self.distrusted or self.keys or self.exact or self.prefixes)


@dataclass(frozen=True, slots=True)
class MountRefusals:
    """What the tombstones refused of one segment when its report in parts began, held
    against every part to the last (``Tombstones.mounted`` lets go of the rest at the
    first): ``refuses`` as ``Tombstones.refuses`` did then."""

    distrusted: bool
    #: key -> newest generation ended there (that one and older ones refused).
    dead: dict[str, int]
    #: (key, generation) refused, that one only: late writes kept out.
    exact: frozenset[tuple[str, int]]
    #: (key, generation, offset) refused at that place only: unanswered Forgets.
    at: frozenset[tuple[str, int, int]] = frozenset()

    def refuses(self, key: str, generation: int, known: bool, offset: int = ANY) -> bool:
        if self.distrusted:
            return not known
        if self.dead.get(key, 0) >= generation or (key, generation) in self.exact:
            return True
        if offset != ANY:
            return (key, generation, offset) in self.at or (key, generation, ANY) in self.at
        return any(k == key and g == generation for k, g, _ in self.at)  # (rare: a query)

    def __len__(self) -> int:
        return len(self.dead) + len(self.exact) + len(self.at)


class Tombstones:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        #: segment id -> key -> generation of the replica dropped with it.
        self._away: dict[str, dict[str, int]] = {}
        #: key -> segments where a replica of it went away (to find them when it ends).
        self._away_in: dict[str, set[str]] = {}
        #: segment id -> key -> newest generation ended there.
        self._dead: dict[str, dict[str, int]] = {}
        #: Forget command id -> [(segment id, key, generation, offset, exact)], until
        #: answered (several when Forgets were merged into one command). ``exact``: that
        #: generation only is refused in the durable record (a mount's refusal), not older
        #: ones too (an object that ended).
        self._unanswered: dict[int, list[tuple[str, str, int, int, bool]]] = {}
        #: segment id -> (key, generation) of unanswered Forgets (how many, for each).
        self._forgetting: dict[str, dict[tuple[str, int], int]] = {}
        #: segment id -> (key, generation, offset) of unanswered Forgets (how many, for
        #: each): what a mount refuses. A Forget names a place, and the node forgets nothing
        #: elsewhere: a copy of the same generation at another place on the segment (placed
        #: before the Forget was sent) lives on, and is adopted.
        self._forgetting_at: dict[str, dict[tuple[str, int, int], int]] = {}
        self._distrusted: set[str] = set()
        #: entry -> prefix -> generation: keys under it the master does not hold, that
        #: generation or older, are refused (``distrust_unheard``).
        self._distrusted_prefixes: dict[str, dict[str, int]] = {}
        #: node entry -> namespace -> keys ``ended`` noted there this term (their cap).
        self._ended_in: dict[str, dict[str, int]] = {}
        self._size = 0
        #: Unanswered Forgets that belong in the durable record, by segment.
        self._overdue: dict[str, set[int]] = {}
        #: Segments whose durable record changed since ``take_changed``.
        self._changed: set[str] = set()
        #: segment id -> key -> generation of writes given up while it was not mounted.
        self._given_up: dict[str, dict[str, int]] = {}
        #: segment id -> (key, generation) of late writes kept out (that generation only).
        self._late: dict[str, set[tuple[str, int]]] = {}
        #: The entries (``node_entry``) of nodes not heard from, noting what ends meanwhile;
        #: and every node entry kept (those, and any restored), until ``heard``.
        self._unheard: set[str] = set()
        self._node_entries: set[str] = set()
        #: Segments whose report in parts is under way: what their entry refused at its first
        #: part, refused for every later part and kept in their durable record until the last.
        self._reporting: dict[str, MountRefusals] = {}

    def __len__(self) -> int:
        return self._size

    # ---- what is noted

    def away(self, segment_id: str, key: str, generation: int) -> None:
        """A replica of ``key`` was dropped with its segment (its node declared dead)."""
        if segment_id in self._distrusted or not self._room(segment_id):
            return
        self._put(self._away, segment_id, key, generation)
        self._away_in.setdefault(key, set()).add(segment_id)

    def given_up(self, segment_id: str, key: str, generation: int) -> None:
        """A Persist or Copy to ``segment_id`` (not mounted now) of ``key`` at ``generation``
        was given up on: its node may still carry it out, after its next mount."""
        if segment_id in self._distrusted or not self._room(segment_id):
            return
        self._put(self._given_up, segment_id, key, generation)

    def take_given_up(self, segment_id: str) -> dict[str, int]:
        """The writes to ``segment_id`` given up on while it was not mounted (key ->
        generation), forgotten here: for its mount's late writes."""
        taken = self._given_up.pop(segment_id, {})
        self._size -= len(taken)
        return taken

    def superseded(self, key: str, generation: int) -> None:
        """``generation`` of ``key`` was published: an older one that went away with its node
        (lost) has ended, as a removal would end it. Without this, a new leader that had not
        yet heard from the newer one's nodes would adopt the older from its node's report and
        serve it. (Asked at every publication: one lookup when nothing went away.)"""
        if key in self._away_in:
            self.ended(key, generation - 1)

    def unheard(self, node_ids: Iterable[str]) -> None:
        """A new leader takes clients without having heard from these nodes: what ends from
        now on is refused at their mounts."""
        for node_id in node_ids:
            self._unheard.add(node_entry(node_id))
            self._node_entries.add(node_entry(node_id))

    def heard(self, node_id: str) -> None:
        """The node has mounted all its segments (reconciled): its entry goes."""
        entry = node_entry(node_id)
        self._unheard.discard(entry)
        self._node_entries.discard(entry)
        if entry in self._distrusted or entry in self._dead or entry in self._distrusted_prefixes:
            self._changed.add(entry)
            self._distrusted.discard(entry)
            self._drop(entry)

    def awaits(self, node_id: str) -> bool:
        """Whether the node's entry waits for ``heard`` (asked at every heartbeat)."""
        return bool(self._node_entries) and node_entry(node_id) in self._node_entries

    def ended_unknown(self, key: str, issued: int) -> None:
        """A key the master holds no object of was removed: every generation of it up to
        ``issued`` (the newest this master has issued or adopted: whatever went away with a
        segment, or a node not heard from may hold, is older) is gone for good (a lost
        object, whose nodes are away, would otherwise come back with them). A put of the key
        after the removal is newer, and is not refused."""
        if self._unheard or key in self._away_in:
            self.ended(key, issued)

    def lost_keys(self, prefix: str) -> list[str]:
        """The keys starting with ``prefix`` of which a replica went away (a walk over all
        of them: for a prefix removal's last page)."""
        return [key for key in self._away_in if key.startswith(prefix)]

    def distrust_unheard(self, prefix: str = "", issued: int = 0) -> None:
        """A removal of every key under ``prefix`` reached keys no one here can list: those
        that nodes not heard from may hold. Their mounts then adopt, under ``prefix``, only
        objects the master holds, of generations up to ``issued`` (the newest issued: a
        later put is newer) (losing a cached object is allowed, bringing back a removed one
        is not). ``prefix`` "" (every key): the whole node is distrusted. Bounded per tenant
        and in all (``MAX_PREFIXES_PER_NAMESPACE``, ``MAX_DISTRUSTED_PREFIXES``)."""
        for entry in self._unheard:
            if entry in self._distrusted:
                continue
            if not prefix:
                self._distrust(entry)
            else:
                self._distrust_prefix(entry, prefix, issued)

    def _distrust_prefix(self, entry: str, prefix: str, generation: int) -> None:
        """Notes ``prefix`` up to ``generation`` distrusted in ``entry`` (a node's), within
        the bounds: a tenant past its share gives way to its whole namespace."""
        held = self._distrusted_prefixes.setdefault(entry, {})
        namespace = _namespace(prefix)
        if namespace and namespace in held:
            prefix = namespace  # (all of the tenant's keys are distrusted already)
        elif namespace and prefix not in held:
            under = [p for p in held if p.startswith(namespace)]
            if len(under) >= MAX_PREFIXES_PER_NAMESPACE:
                for p in under:
                    generation = max(generation, held.pop(p))
                    self._size -= 1
                prefix = namespace
        if prefix not in held and len(held) >= MAX_DISTRUSTED_PREFIXES:
            self._distrust(entry)
            return
        if not self._room(entry):
            return
        if prefix not in held:
            self._size += 1
        held[prefix] = max(generation, held.get(prefix, 0))
        self._changed.add(entry)

    def _end_unheard(self, entry: str, key: str, generation: int) -> None:
        """Notes ``key`` ended in a node's ``entry``; past ``MAX_ENDED_PER_NAMESPACE`` of
        its tenant's, they give way to a distrust of the tenant's namespace (which refuses
        what the master does not hold: every one of them, and that tenant's others)."""
        namespace = _namespace(key)
        prefixes = self._distrusted_prefixes.get(entry)
        if namespace and prefixes is not None and namespace in prefixes:
            self._distrust_prefix(entry, namespace, generation)
            return
        dead = self._dead.get(entry)
        if namespace and (dead is None or key not in dead):
            counts = self._ended_in.setdefault(entry, {})
            counts[namespace] = counts.get(namespace, 0) + 1
            if counts[namespace] > MAX_ENDED_PER_NAMESPACE:
                del counts[namespace]
                newest = generation
                if dead is not None:
                    for ended in [k for k in dead if k.startswith(namespace)]:
                        newest = max(newest, dead.pop(ended))
                        self._size -= 1
                self._distrust_prefix(entry, namespace, newest)
                return
        self._put(self._dead, entry, key, generation)
        self._changed.add(entry)

    def _distrust(self, entry: str) -> None:
        """Nothing but what the master holds is adopted from ``entry``'s segments."""
        self._drop(entry)
        self._distrusted.add(entry)
        self._changed.add(entry)

    def ended(self, key: str, generation: int) -> None:
        """The object (``generation`` of ``key``) is gone for good: its replicas that went
        away (this generation or older) become tombstones, and nodes not heard from refuse
        it."""
        for entry in self._unheard:
            if entry not in self._distrusted and self._room(entry):
                self._end_unheard(entry, key, generation)
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
            self._size -= 1  # (the away entry becomes a tombstone)
            self._put(self._dead, segment_id, key, generation)
            self._changed.add(segment_id)

    def sent(
        self,
        command_id: int,
        segment_id: str,
        key: str,
        generation: int,
        exact: bool = False,
        offset: int = ANY,
    ) -> None:
        """A Forget went out for a recorded replica (at ``offset``): refused there at a
        remount until answered. ``exact``: the Forget of a replica a mount refused, which ends
        that generation only (in the durable record too): an older one may live on."""
        if segment_id in self._distrusted or not self._room(segment_id):
            return
        self._unanswered[command_id] = [(segment_id, key, generation, offset, exact)]
        counts = self._forgetting.setdefault(segment_id, {})
        counts[(key, generation)] = counts.get((key, generation), 0) + 1
        places = self._forgetting_at.setdefault(segment_id, {})
        place = (key, generation, offset)
        places[place] = places.get(place, 0) + 1
        self._size += 1

    def merged(self, absorbed: int, into: int) -> None:
        """Forget ``absorbed`` went out as part of Forget ``into`` (one segment's, in a row):
        its answer is that one's."""
        entries = self._unanswered.pop(absorbed, None)
        if entries is not None:
            self._unanswered.setdefault(into, []).extend(entries)

    def answered(self, command_id: int) -> None:
        """The node answered that Forget: it holds the objects no more."""
        entries = self._unanswered.pop(command_id, None)
        if entries is None:
            return
        for segment_id, key, generation, offset, _ in entries:
            self._size -= 1
            overdue = self._overdue.get(segment_id)
            if overdue is not None and command_id in overdue:
                overdue.discard(command_id)
                if not overdue:
                    del self._overdue[segment_id]
                self._changed.add(segment_id)
            _count_down(self._forgetting, segment_id, (key, generation))
            _count_down(self._forgetting_at, segment_id, (key, generation, offset))

    def overdue(self, command_id: int) -> None:
        """The master answers without that Forget's answer (it waited long enough, or the
        node was declared dead): it goes into the segment's durable record."""
        for segment_id, *_ in self._unanswered.get(command_id, ()):
            self._overdue.setdefault(segment_id, set()).add(command_id)
            self._changed.add(segment_id)

    # ---- across leaders

    @property
    def changed(self) -> bool:
        """Whether a durable record changed since ``take_changed``."""
        return bool(self._changed)

    def take_changed(self) -> set[str]:
        """The segments whose durable record changed since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def record(self, segment_id: str) -> DurableRecord | None:
        """The segment's durable record now (None: nothing to keep)."""
        held = self._reporting.get(segment_id)
        if segment_id in self._distrusted or (held is not None and held.distrusted):
            return DurableRecord(True, {})
        prefixes = frozenset(self._distrusted_prefixes.get(segment_id, {}).items())
        keys = dict(self._dead.get(segment_id, {}))
        exact = set(self._late.get(segment_id, ()))
        if held is not None:
            for key, generation in held.dead.items():
                keys[key] = max(generation, keys.get(key, 0))
            exact.update(held.exact)
            exact.update((key, generation) for key, generation, _ in held.at)
        for command_id in self._overdue.get(segment_id, ()):
            for held_in, key, generation, _, only in self._unanswered.get(command_id, ()):
                if held_in != segment_id:
                    continue
                if only:
                    exact.add((key, generation))
                else:
                    keys[key] = max(generation, keys.get(key, 0))
        if not keys and not exact and not prefixes:
            return None
        if (
            len(keys) + len(exact) + len(prefixes) > RECORD_LIMIT
            or _encoded_bytes(keys)
            + _encoded_bytes(key for key, _ in exact)
            + _encoded_bytes(prefix for prefix, _ in prefixes)
            > RECORD_BYTES
        ):
            return DurableRecord(True, {})
        return DurableRecord(False, keys, frozenset(exact), prefixes)

    def restore(self, segment_id: str, record: DurableRecord) -> None:
        """A record an earlier leader kept: refused at the segment's next mount as if noted
        here (and kept in the record until then)."""
        if segment_id.startswith(NODE_PREFIX):
            self._node_entries.add(segment_id)
        if record.distrusted or (record.prefixes and not segment_id.startswith(NODE_PREFIX)):
            # (prefixes are a node's, kept until it is heard; a segment's entry goes at its
            # mount, and a report in parts would not hold them: this master never writes
            # them so, and distrusts the segment rather than half honour them)
            self._drop(segment_id)
            self._distrusted.add(segment_id)
        else:
            for key, generation in record.keys.items():
                if segment_id in self._distrusted or not self._room(segment_id):
                    return
                self._put(self._dead, segment_id, key, generation)
            for key, generation in record.exact:
                if segment_id in self._distrusted or not self._room(segment_id):
                    return
                self._keep_out(segment_id, key, generation)
            for prefix, generation in record.prefixes:
                if segment_id in self._distrusted or not self._room(segment_id):
                    return
                held = self._distrusted_prefixes.setdefault(segment_id, {})
                if prefix not in held:
                    self._size += 1
                held[prefix] = max(generation, held.get(prefix, 0))

    # ---- at a mount

    def went_away(self, segment_id: str, key: str, generation: int) -> bool:
        """Whether this replica went away with its segment and its object has not ended
        since (the master knew it there: a report of it is no surprise)."""
        held = self._away.get(segment_id)
        return held is not None and held.get(key) == generation

    def refuses(
        self,
        segment_id: str,
        key: str,
        generation: int,
        known: bool,
        node_id: str = "",
        offset: int = ANY,
    ) -> bool:
        """Whether a replica the node reports at a mount (at ``offset``) must not be
        adopted. ``known``: the master holds that generation of the object (a replica of it
        may come back). ``node_id``: the segment's node, whose own entry counts too. An
        ``offset`` of ``ANY`` asks about a copy of the object not placed yet: whether one
        anywhere on the segment could be refused (an unanswered Forget of that generation,
        wherever it names, counts)."""
        if node_id and self._refuses(node_entry(node_id), key, generation, known, offset):
            return True
        return self._refuses(segment_id, key, generation, known, offset)

    def _refuses(
        self, segment_id: str, key: str, generation: int, known: bool, offset: int
    ) -> bool:
        held = self._reporting.get(segment_id)
        if held is not None and held.refuses(key, generation, known, offset):
            return True
        if segment_id in self._distrusted:
            return not known
        prefixes = self._distrusted_prefixes.get(segment_id)
        if (
            prefixes is not None
            and not known
            and any(key.startswith(p) and generation <= g for p, g in prefixes.items())
        ):
            return True
        dead = self._dead.get(segment_id)
        if dead is not None and dead.get(key, 0) >= generation:
            return True
        late = self._late.get(segment_id)
        if late is not None and (key, generation) in late:
            return True
        if offset == ANY:
            counts = self._forgetting.get(segment_id)
            return counts is not None and (key, generation) in counts
        places = self._forgetting_at.get(segment_id)
        return places is not None and (
            (key, generation, offset) in places or (key, generation, ANY) in places
        )

    def mounted(
        self,
        segment_id: str,
        late: Sequence[tuple[str, int, int, bool]] = (),
        *,
        in_parts: bool = False,
    ) -> None:
        """The segment's report has been reconciled: nothing of it is kept any more, but for
        ``late`` writes: (key, generation, offset, whether the object lives) of Persists and
        Copies
        sent to it before this mount and not answered, or given up while it was away
        (``take_given_up``). Its node may carry them out after its report (they were queued
        while it was paused), and a new leader would adopt what they record. One of an object
        that lives, or that is only lost (a replica of it went away with another segment,
        and may come back with it), goes away again, and becomes a tombstone if the object
        ends (``ended``). One of an object that ended (no Forget for it may follow it on the
        node), or whose Forget is still unanswered (at its place: ``ANY`` where that is not
        known), stays refused: that generation only (an older one the report brought back
        lives on).

        ``in_parts``: the report was the first part of several; what was refused of the
        segment until now is refused of every later part too, until ``report_over``. A late
        write of an object that went away with this very segment is not refused then: the
        object is lost, not ended, and a later part may bring it back."""
        held = self._refusals(segment_id) if in_parts else None
        forgetting = self._forgetting.get(segment_id, {})
        places = self._forgetting_at.get(segment_id, {})
        kept: list[tuple[str, int]] = []
        removed: list[tuple[str, int]] = []
        for key, generation, offset, lives in late:
            if offset == ANY:
                forgotten = (key, generation) in forgetting
            else:
                forgotten = (key, generation, offset) in places or (key, generation, ANY) in places
            goes_away = not forgotten and (
                lives
                or self._away_elsewhere(segment_id, key, generation)
                # (a later part may report it here: adopted then, not refused)
                or (in_parts and self.went_away(segment_id, key, generation))
            )
            (kept if goes_away else removed).append((key, generation))
        if segment_id in self._distrusted or self.record(segment_id) is not None:
            self._changed.add(segment_id)
        self._distrusted.discard(segment_id)
        self._drop(segment_id)
        for key, generation in removed:
            if self._room(segment_id):
                self._keep_out(segment_id, key, generation)
                self._changed.add(segment_id)
        for key, generation in kept:
            self.away(segment_id, key, generation)
        if held is not None:
            self._reporting[segment_id] = held
            self._size += len(held)
            self._changed.add(segment_id)

    def report_over(self, segment_id: str) -> None:
        """The last part of the segment's report in parts came: what its first part's mount
        held (``mounted`` with ``in_parts``) is let go of."""
        held = self._reporting.pop(segment_id, None)
        if held is not None:
            self._size -= len(held)
            self._changed.add(segment_id)

    def _refusals(self, segment_id: str) -> MountRefusals | None:
        """What ``_refuses`` holds against the segment's own entry now (None: nothing)."""
        held = self._reporting.get(segment_id)
        distrusted = segment_id in self._distrusted or (held is not None and held.distrusted)
        dead = dict(held.dead) if held is not None else {}
        for key, generation in self._dead.get(segment_id, {}).items():
            dead[key] = max(generation, dead.get(key, 0))
        exact = set(held.exact) if held is not None else set()
        exact.update(self._late.get(segment_id, ()))
        at = set(held.at) if held is not None else set()
        at.update(self._forgetting_at.get(segment_id, ()))
        if not distrusted and not dead and not exact and not at:
            return None
        if distrusted:
            return MountRefusals(True, {}, frozenset())
        return MountRefusals(False, dead, frozenset(exact), frozenset(at))

    def _away_elsewhere(self, segment_id: str, key: str, generation: int) -> bool:
        """Whether a replica of ``key`` at ``generation`` went away with another segment
        than ``segment_id`` (the object is lost until that segment comes back)."""
        return any(
            self._away.get(other, {}).get(key, -1) >= generation
            for other in self._away_in.get(key, ())
            if other != segment_id
        )

    # ---- bounds

    def forget_segment(self, segment_id: str) -> None:
        """The segment has been away ``MAX_AGE``: nothing of it is kept (its durable record
        goes too)."""
        if segment_id in self._distrusted or self.record(segment_id) is not None:
            self._changed.add(segment_id)
        self._distrusted.discard(segment_id)
        self._drop(segment_id)

    def _put(
        self, table: dict[str, dict[str, int]], segment_id: str, key: str, generation: int
    ) -> None:
        """Notes ``key`` at ``generation`` (or newer, if noted so) for the segment in
        ``table``, counting a new entry."""
        entries = table.setdefault(segment_id, {})
        if key not in entries:
            self._size += 1
        entries[key] = max(generation, entries.get(key, 0))

    def _keep_out(self, segment_id: str, key: str, generation: int) -> None:
        """Refuses ``key`` at ``generation`` (only) at the segment's next mount."""
        late = self._late.setdefault(segment_id, set())
        if (key, generation) not in late:
            late.add((key, generation))
            self._size += 1

    def _room(self, segment_id: str) -> bool:
        if self._size < self.limit:
            return True
        self._drop(segment_id)
        self._distrusted.add(segment_id)
        self._changed.add(segment_id)
        return False

    def _drop(self, segment_id: str) -> None:
        held = self._reporting.pop(segment_id, None)
        if held is not None:
            self._size -= len(held)
        for key in self._away.pop(segment_id, {}):
            self._size -= 1
            segments = self._away_in.get(key)
            if segments is not None:
                segments.discard(segment_id)
                if not segments:
                    del self._away_in[key]
        self._size -= len(self._dead.pop(segment_id, {}))
        self._size -= len(self._distrusted_prefixes.pop(segment_id, {}))
        self._ended_in.pop(segment_id, None)
        self._size -= len(self._given_up.pop(segment_id, {}))
        self._size -= len(self._late.pop(segment_id, ()))
        self._overdue.pop(segment_id, None)
        self._forgetting_at.pop(segment_id, None)
        if self._forgetting.pop(segment_id, None) is not None:
            for command_id, entries in list(self._unanswered.items()):
                kept = [e for e in entries if e[0] != segment_id]
                self._size -= len(entries) - len(kept)
                if kept:
                    self._unanswered[command_id] = kept
                else:
                    del self._unanswered[command_id]


def _encoded_bytes(keys: Iterable[str]) -> int:
    """About what ``keys`` take in a record (JSON, keys escaped at most twice their size)."""
    return sum(2 * len(key.encode()) + _PER_KEY_BYTES for key in keys)


def _count_down(table: dict[str, dict[Any, int]], segment_id: str, entry: Any) -> None:
    """One of ``entry`` fewer in the segment's counts of ``table`` (gone at none)."""
    counts = table.get(segment_id)
    if counts is None:
        return
    left = counts.get(entry, 0) - 1
    if left > 0:
        counts[entry] = left
        return
    counts.pop(entry, None)
    if not counts:
        del table[segment_id]


def _namespace(key: str) -> str:
    """The tenant's namespace ``key`` (or a prefix) lies in: up to and with the first
    ``NAMESPACE_END`` ("" where it has none)."""
    end = key.find(NAMESPACE_END)
    return key[: end + 1] if end >= 0 else ""
