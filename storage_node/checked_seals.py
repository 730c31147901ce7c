"""Grants a storage node no longer honours, and the checked transfers running under grants.

A capability names a grant by its id: the put id, which is the object's generation, for a
write and for a read alike. Two commands of the master end grants here:

* **Persist** (the object is recorded, about to be published) seals its *write* grant: the
  writer can change nothing more;
* **Forget** (the master dropped the object or the reservation: revoked, failed, timed out,
  removed, evicted, moved away) seals *every* grant of that generation or older for that
  range, reads included, and interrupts the transfers in flight under them (their
  connections are shut down, and the Forget waits, ``wait`` at most, until their threads
  have left the segment's memory). Only then does the node answer; from that answer on no
  byte of the old grants moves, so the master reuses the space at the answer (its forget
  barrier, master/forget_barrier.py) instead of waiting for the grants to expire.

A grant is named by the offset its range starts at (the object's place): a grant for a new
object in reused space has a newer generation, so it is not refused.

**Copies keep their generation.** A replica the node copies in (a demotion or promotion on
the node, a copy from a peer for re-replication or a drain) is the same object, with the
put's generation, and may land where a seal of that generation or a newer one lies: its own
earlier place (demoted, then promoted back into the DRAM it left), or where a newer object
was evicted from. Once recorded (``recorded``), reads under grants of exactly its generation
are honoured there again: a generation names one object, so such a grant, however old, was
for these very bytes, of the same tenant. Writes stay sealed, and other generations too.

**Bounded.** One entry per offset. A Forget's seal is dropped once every grant it sealed
has expired: when the master says they end (``grants_end_ms``: the latest it granted for the
segment's space, the clock allowance included: earlier terms' grants are refused by their
term) plus ``SEAL_MARGIN``, and at the latest
``SEAL_LIFE`` after the Forget (a master that does not say), as the node refuses any
capability expiring further ahead than that (``longest_grant``). So the table holds about
the Forgets of the last lease (seconds, by default), not of the last half hour: every
evicted or removed object leaves an entry until then. After the node follows a master of a
lower term than before (``distrust_grant_ends``: a cluster moved to masters whose terms
count from elsewhere), grants of the higher term are not refused by their term: for
``SEAL_LIFE`` every Forget's seal is kept that long. A Persist's seal lasts until the
object's Forget.

**Counted.** A connection may run several transfers under one grant at once (small reads
gathered until sent while a large one starts): each ``admit`` counts one, each ``leave``
ends one, and a seal interrupts the connection while any of them runs.
"""

from __future__ import annotations

import contextlib
import heapq
import socket
import threading
import time
from collections.abc import Callable, Iterable

from kvpool.security import capabilities as caps

#: How long a Forget's seal is kept at most; no capability expiring later than this ahead is
#: honoured.
SEAL_LIFE = 1800.0
#: How much longer than the master says its grants run a Forget's seal is kept (for a step
#: of the master's wall clock between a grant and the Forget).
SEAL_MARGIN = 10.0
#: How long a Forget waits at most for the transfers it interrupted to leave the segment.
INTERRUPT_WAIT = 10.0

_WRITES, _ALL, _DROP_AT, _READABLE = 0, 1, 2, 3
#: A connection's transfers under one grant: the oldest generation, whether one writes, how
#: many run.
_OLDEST, _WRITING, _RUNNING = 0, 1, 2


class Seals:
    """Thread-safe: transfer threads ``admit`` and ``leave``, the command thread seals."""

    #: The longest a capability may still run when a node first sees it, in seconds.
    longest_grant = SEAL_LIFE

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._left = threading.Condition(self._lock)
        #: segment digest -> offset -> [writes sealed up to generation, all sealed up to
        #: generation, when the latter is dropped (ms), the generation of a copy recorded
        #: there since, read under its own grants (-1: none)]
        self._sealed: dict[bytes, dict[int, list[int]]] = {}
        #: (when a Forget's seal is dropped (ms), segment digest, offset), a heap, soonest
        #: first: one item per offset with a Forget's seal (whose entry's drop time is not 0),
        #: put back at its later time when the seal was made longer since.
        self._expiries: list[tuple[int, bytes, int]] = []
        #: (segment digest, offset) -> connection -> [oldest generation, writes (0/1),
        #: transfers running] of the transfers in flight.
        self._active: dict[tuple[bytes, int], dict[socket.socket, list[int]]] = {}
        #: Seals waiting for transfers to leave.
        self._waiting = 0
        #: Until when (ms) Forgets' seals are kept ``SEAL_LIFE`` whatever the master says its
        #: grants' end is (``distrust_grant_ends``).
        self._ends_distrusted_until = 0

    # ---- transfer threads

    def admit(
        self, segment: bytes, offset: int, generation: int, write: bool, connection: socket.socket
    ) -> bool:
        """Whether a transfer under the grant (``generation`` at ``offset``) may run; if so
        it counts as in flight on ``connection`` until ``leave``."""
        with self._lock:
            sealed = self._sealed.get(segment)
            if sealed is not None:
                entry = sealed.get(offset)
                if entry is not None and _refused(entry, generation, write):
                    return False
            key = (segment, offset)
            active = self._active.get(key)
            if active is None:
                self._active[key] = {connection: [generation, write, 1]}
            elif (running := active.get(connection)) is None:
                active[connection] = [generation, write, 1]
            else:
                running[_OLDEST] = min(running[_OLDEST], generation)
                running[_WRITING] |= write
                running[_RUNNING] += 1
            return True

    def generation_in_flight(
        self, segment: bytes, offset: int, connection: socket.socket
    ) -> int | None:
        """The generation of the grant (at ``offset``) a transfer on ``connection`` runs
        under (the oldest, if several), or None when none does."""
        with self._lock:
            running = self._active.get((segment, offset), {}).get(connection)
            return None if running is None else running[_OLDEST]

    def leave(self, segment: bytes, offset: int, connection: socket.socket) -> None:
        """The transfer on ``connection`` touches the segment no more."""
        with self._lock:
            self._leave(segment, offset, connection)

    def leave_all(self, transfers: list[tuple[bytes, int]], connection: socket.socket) -> None:
        """``leave`` for each (segment digest, offset) of ``transfers``: a batch of reads."""
        with self._lock:
            for segment, offset in transfers:
                self._leave(segment, offset, connection)

    def _leave(self, segment: bytes, offset: int, connection: socket.socket) -> None:
        key = (segment, offset)
        active = self._active.get(key)
        if active is None or (running := active.get(connection)) is None:
            return
        running[_RUNNING] -= 1
        if running[_RUNNING]:
            return  # (another transfer of the connection still runs under the grant)
        del active[connection]
        if not active:
            del self._active[key]
        if self._waiting:
            self._left.notify_all()

    # ---- commands

    def busy(self, segment_id: str, offsets: Iterable[int] | None = None) -> bool:
        """Whether transfers run on the segment now, under grants at one of ``offsets``
        (None: any): a seal of them would then wait for them to stop."""
        active = self._active
        if not active:
            return False  # (the common case: no checked transfer runs now)
        digest = caps.segment_digest(segment_id)
        if offsets is None:
            return any(key[0] == digest for key in list(active))
        return any((digest, offset) in active for offset in offsets)

    def seal(self, segment_id: str, objects: Iterable[tuple[int, int]]) -> bool:
        """Persist: ``objects`` ((offset, generation)) were recorded; their write grants end,
        and writes in flight under them are interrupted. False: one did not stop in time."""
        return self._seal(segment_id, objects, everything=False, wait=INTERRUPT_WAIT)

    def forget(
        self,
        segment_id: str,
        objects: Iterable[tuple[int, int]],
        wait: float = INTERRUPT_WAIT,
        grants_end_ms: int = 0,
    ) -> bool:
        """Forget: every grant of ``objects`` ((offset, generation)) ends, and the transfers
        in flight under them are interrupted; True once none touches the segment any more
        (False: one did not leave within ``wait``). ``grants_end_ms``: when the master says
        every grant for them has ended, clock allowance included (0: not said)."""
        return self._seal(segment_id, objects, everything=True, wait=wait, until=grants_end_ms)

    def distrust_grant_ends(self) -> None:
        """The node now follows a master of a lower term than before: grants of the higher
        term (not refused by their term any more) are not counted in what its Forgets say
        about their grants' end; for ``SEAL_LIFE`` from now, when every such grant has run
        out, seals are kept ``SEAL_LIFE``."""
        with self._lock:
            self._ends_distrusted_until = int((self._clock() + SEAL_LIFE) * 1000)

    def sealed(self, segment: bytes, offset: int, generation: int, write: bool = True) -> bool:
        """Whether a grant (``generation`` at ``offset`` of the segment with digest
        ``segment``) is refused now."""
        with self._lock:
            entry = self._sealed.get(segment, {}).get(offset)
            return entry is not None and _refused(entry, generation, write)

    def recorded(self, segment_id: str, offset: int, generation: int) -> None:
        """A copy of the object of ``generation`` was recorded at ``offset`` (its bytes are
        all there): reads under its grants are honoured there again, whatever seal covers
        the place (see the module's docstring), until a Forget of it."""
        with self._lock:
            sealed = self._sealed.get(caps.segment_digest(segment_id))
            entry = sealed.get(offset) if sealed is not None else None
            if entry is not None:  # (else nothing is refused there)
                entry[_READABLE] = generation

    def __len__(self) -> int:
        with self._lock:
            return sum(len(sealed) for sealed in self._sealed.values())

    def _seal(
        self,
        segment_id: str,
        objects: Iterable[tuple[int, int]],
        everything: bool,
        wait: float,
        until: int = 0,
    ) -> bool:
        digest = caps.segment_digest(segment_id)
        now = int(self._clock() * 1000)
        drop_at = now + int(SEAL_LIFE * 1000)
        if until and now >= self._ends_distrusted_until:
            drop_at = min(drop_at, max(now, until) + int(SEAL_MARGIN * 1000))
        victims: list[tuple[tuple[bytes, int], socket.socket]] = []
        with self._lock:
            self._prune(now)
            sealed = self._sealed.setdefault(digest, {})
            for offset, generation in objects:
                entry = sealed.get(offset)
                if entry is None:
                    entry = sealed[offset] = [-1, -1, 0, -1]
                if everything:
                    entry[_ALL] = max(entry[_ALL], generation)
                    if generation >= entry[_READABLE]:  # (the copy is forgotten in turn)
                        entry[_READABLE] = -1
                    if not entry[_DROP_AT]:
                        heapq.heappush(self._expiries, (drop_at, digest, offset))
                    # (never shorter: an earlier Forget's grants may run longer)
                    entry[_DROP_AT] = max(entry[_DROP_AT], drop_at)
                else:
                    entry[_WRITES] = max(entry[_WRITES], generation)
                key = (digest, offset)
                for connection, running in self._active.get(key, {}).items():
                    if running[_OLDEST] <= generation and (everything or running[_WRITING]):
                        victims.append((key, connection))
            if not victims:
                return True
            for _, connection in victims:  # (under the lock: its thread cannot close it now)
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
            deadline = time.monotonic() + wait
            self._waiting += 1
            try:
                while any(connection in self._active.get(key, ()) for key, connection in victims):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._left.wait(left)
            finally:
                self._waiting -= 1
            return True

    def _prune(self, now: int) -> None:
        """Drops the Forgets' seals whose grants have all expired (callers hold the lock)."""
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            drop_at, digest, offset = heapq.heappop(expiries)
            sealed = self._sealed.get(digest)
            entry = sealed.get(offset) if sealed is not None else None
            if sealed is None or entry is None:
                continue
            if entry[_DROP_AT] > drop_at:  # (sealed again since, for longer)
                heapq.heappush(expiries, (entry[_DROP_AT], digest, offset))
                continue
            if entry[_WRITES] > entry[_ALL]:
                entry[_ALL], entry[_DROP_AT] = -1, 0  # (a newer object's write seal stays)
            else:
                del sealed[offset]
                if not sealed:
                    del self._sealed[digest]


def _refused(entry: list[int], generation: int, write: bool) -> bool:
    """Whether a seal ``entry`` refuses a grant of ``generation`` (a write, or a read)."""
    if write:
        return entry[_ALL] >= generation or entry[_WRITES] >= generation
    return entry[_ALL] >= generation and generation != entry[_READABLE]
