"""Where a master keeps the tombstone records a removal's answer relies on, written before
the answer goes out: the coalescing and failure rules every place shares.

A removal answered while a node was away must stick at the next master, which rebuilds its
index from what the nodes report (master/tombstones.py). So the records of the segments a
change touched are written first (etcd with several masters: master/tombstone_store.py; a
file for a master that runs alone: master/tombstone_file.py), and the answers wait.

Writes are coalesced: while one is under way, later changes wait and go out in the next one,
each record built at that time. A write that fails fails the answers waiting on it: their
calls are refused with UNAVAILABLE and retried by the caller (at whichever master leads
then). While writes keep failing though the master still serves (etcd refusing puts, its
space alarm raised; a full disk), only the answers that carry a change wait (and are
refused): other calls are served meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvpool.common.logging import get_logger
from kvpool.master.tombstones import DurableRecord

log = get_logger("kvpool.tombstones")

#: Seconds one write may take.
WRITE_TIMEOUT = 3.0
#: Seconds between tries of a write that failed.
RETRY_AFTER = 0.5
#: Failed writes in a row after which answers that carry no change stop waiting for writes.
FAILURES_BEFORE_DEGRADED = 3

#: What a write calls back with: True once the records are kept, False if they are not.
Done = Callable[[bool], None]
#: A segment's record now (None: nothing to keep).
RecordOf = Callable[[str], DurableRecord | None]


class RecordWriter:
    """Subclasses say where: ``load`` every record kept, ``_write_now`` some segments'."""

    #: Where the records go, for the log and errors ("etcd", "the tombstone file").
    where = ""

    def __init__(self) -> None:
        self._dirty: set[str] = set()
        self._waiting: list[Done] = []
        self._record_of: RecordOf | None = None
        self._task: asyncio.Task[None] | None = None
        #: Writes that failed in a row.
        self._failures = 0

    async def load(self) -> dict[str, DurableRecord]:
        """Every record an earlier master kept (those past tombstones.MAX_AGE dropped)."""
        raise NotImplementedError

    async def _write_now(self, segment_ids: set[str], record_of: RecordOf) -> bool:
        """Writes the records of ``segment_ids``: whether they are kept."""
        raise NotImplementedError

    def _forget_written(self) -> None:
        """The term ended: what this one wrote may be changed by another master."""

    # ---- a term

    def begin(self, record_of: RecordOf) -> None:
        """A term begins: records are built with ``record_of`` (the new state's)."""
        self.end()
        self._record_of = record_of

    def end(self) -> None:
        """The term ended: nothing more is written, and what waited fails."""
        self._record_of = None
        self._failures = 0
        self._dirty.clear()
        self._forget_written()
        waiting, self._waiting = self._waiting, []
        for done in waiting:
            done(False)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    # ---- writes

    def write(self, segment_ids: set[str], done: Done) -> None:
        """Writes the records of ``segment_ids`` as they are when the write goes out; then
        ``done(True)``, or ``done(False)`` if they could not be written. With no segment,
        ``done`` comes after the write under way, if any."""
        if self._record_of is None:
            done(False)
            return
        self._dirty |= segment_ids
        self._waiting.append(done)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._writer())

    @property
    def busy(self) -> bool:
        """A write is under way: answers given meanwhile wait for it (``write`` with no
        segment), so that none overtakes a record written for an earlier one. Not while
        writes keep failing: then only the answers that carry changes wait, and are refused,
        so that reads and writes go on meanwhile."""
        return self._task is not None and not self._task.done() and not self.failing

    @property
    def failing(self) -> bool:
        return self._failures >= FAILURES_BEFORE_DEGRADED

    async def _writer(self) -> None:
        while (self._dirty or self._waiting) and self._record_of is not None:
            segment_ids, self._dirty = self._dirty, set()
            waiting, self._waiting = self._waiting, []
            try:
                ok = await self._write_now(segment_ids, self._record_of) if segment_ids else True
            except Exception as error:  # (a bug: counted as a failed write, tried again, and
                # the answers waiting on it are given, never left hanging)
                log.error("writing tombstone records failed", to=self.where, error=repr(error))
                ok = False
            for done in waiting:
                try:
                    done(ok)
                except Exception as error:
                    log.error("an answer waiting on tombstone records failed", error=repr(error))
            if ok:
                if self.failing:
                    log.warning("tombstone records written again", to=self.where)
                self._failures = 0
            else:  # tried again (until the term ends: a leader cut off from etcd ends it)
                self._failures += 1
                if self._failures == FAILURES_BEFORE_DEGRADED:
                    log.error(
                        f"{self.where} takes no tombstone records: removals are refused until "
                        "it does (check its health: etcd's space alarm, the file's disk)"
                    )
                self._dirty |= segment_ids
                await asyncio.sleep(RETRY_AFTER)
