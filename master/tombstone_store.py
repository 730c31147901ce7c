"""Segments' durable tombstone records in etcd, so that a removal sticks across a failover.

A new leader rebuilds its index from what the storage nodes report; a node that was away
(declared dead, or slow to answer a Forget) may report an object removed meanwhile. The
leader that answered the removal knows (master/tombstones.py), and writes what a successor
must refuse under ``<cluster>/tombstones/<segment id>`` before the answer goes out; a new
leader reads them all before it takes a mount, and a record is deleted once its segment
mounted and was reconciled.

Writes are coalesced: while one transaction is in flight, later changes wait and go out in
the next one, each record built at that time. A write is a transaction guarded by the
leader key naming this master, so a deposed leader changes nothing. A write that fails (etcd
unreachable, leadership lost) fails the answers waiting on it: their calls are refused with
UNAVAILABLE and retried by the caller, at whichever master leads then. While writes keep
failing though the master still leads (etcd refusing puts, its space alarm raised), only the
answers that carry a change wait (and are refused): other calls are served meanwhile.

A record nobody has touched for ``MAX_AGE`` seconds (a segment that never came back: its node
was replaced) is deleted by the next leader that reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from kvpool.common.logging import get_logger
from kvpool.master.election import ETCD_ERRORS
from kvpool.master.tombstones import DurableRecord

log = get_logger("kvpool.tombstones")

#: Seconds after its last write a record is dropped: a node away that long has been replaced.
MAX_AGE = 7 * 24 * 3600.0
#: Operations per etcd transaction (etcd's default limit is 128).
OPS_PER_TRANSACTION = 64
#: Bytes of values per etcd transaction (etcd's default request limit is 1.5 MiB; one record
#: holds at most tombstones.RECORD_BYTES).
BYTES_PER_TRANSACTION = 1 << 20
#: Seconds one transaction may take.
WRITE_TIMEOUT = 3.0
#: Seconds between tries of a write that failed.
RETRY_AFTER = 0.5
#: Failed writes in a row after which answers that carry no change stop waiting for writes.
FAILURES_BEFORE_DEGRADED = 3

#: What a write calls back with: True once the records are in etcd, False if they are not.
Done = Callable[[bool], None]


def encode(record: DurableRecord, now: float) -> bytes:
    fields: dict[str, object] = {"at": now, "distrusted": record.distrusted, "keys": record.keys}
    if record.exact:  # (absent when empty: what masters before it wrote and read)
        fields["exact"] = sorted(record.exact)
    return json.dumps(fields, separators=(",", ":")).encode()


def decode(value: bytes) -> tuple[float, DurableRecord]:
    """Raises ValueError on a value no master wrote."""
    try:
        fields = json.loads(value)
        at = float(fields["at"])
        keys = {str(k): int(g) for k, g in dict(fields["keys"]).items()}
        exact = frozenset((str(k), int(g)) for k, g in fields.get("exact", ()))
        return at, DurableRecord(bool(fields["distrusted"]), keys, exact)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"not a tombstone record: {error}") from None


class TombstoneStore:
    def __init__(
        self,
        client: Callable[[], Any],
        cluster_prefix: bytes,
        leader_key: bytes,
        address: Callable[[], str],
    ) -> None:
        """``client``: the election's etcd client now (None when it has none);
        ``address``: this master's advertised address, the leader key's value while it
        leads."""
        self._client = client
        self._prefix = cluster_prefix + b"/tombstones/"
        self._leader_key = leader_key
        self._address = address
        self._dirty: set[str] = set()
        self._waiting: list[Done] = []
        self._record_of: Callable[[str], DurableRecord | None] | None = None
        self._task: asyncio.Task[None] | None = None
        #: Writes that failed in a row.
        self._failures = 0

    # ---- a term

    async def load(self) -> dict[str, DurableRecord]:
        """Every record an earlier leader kept (those past MAX_AGE deleted instead).
        Raises one of ETCD_ERRORS when etcd cannot be read: a leader must not serve without
        them."""
        client = self._client()
        if client is None:
            raise ConnectionError("no etcd client")
        entries = await asyncio.wait_for(client.get_prefix(self._prefix), WRITE_TIMEOUT)
        records: dict[str, DurableRecord] = {}
        stale: list[bytes] = []
        now = time.time()
        for kv in entries:
            segment_id = kv.key[len(self._prefix) :].decode(errors="replace")
            try:
                at, record = decode(kv.value)
            except ValueError as error:
                log.error("a tombstone record is unreadable", segment=segment_id, error=str(error))
                record, at = DurableRecord(True, {}), now  # (adopt nothing it does not hold)
            if now - at > MAX_AGE:
                stale.append(kv.key)
                continue
            records[segment_id] = record
        for key in stale:
            with contextlib.suppress(*ETCD_ERRORS):
                await asyncio.wait_for(client.delete(key), WRITE_TIMEOUT)
        return records

    def begin(self, record_of: Callable[[str], DurableRecord | None]) -> None:
        """A term begins: records are built with ``record_of`` (the new state's)."""
        self.end()
        self._record_of = record_of

    def end(self) -> None:
        """The term ended: nothing more is written, and what waited fails."""
        self._record_of = None
        self._failures = 0
        self._dirty.clear()
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
        writes keep failing (etcd refusing puts while the lease still renews: its space
        alarm): then only the answers that carry changes wait, and are refused, so that
        reads and writes go on meanwhile."""
        return self._task is not None and not self._task.done() and not self.failing

    @property
    def failing(self) -> bool:
        return self._failures >= FAILURES_BEFORE_DEGRADED

    async def _writer(self) -> None:
        while (self._dirty or self._waiting) and self._record_of is not None:
            segment_ids, self._dirty = self._dirty, set()
            waiting, self._waiting = self._waiting, []
            ok = await self._write_now(segment_ids, self._record_of) if segment_ids else True
            for done in waiting:
                done(ok)
            if ok:
                if self.failing:
                    log.warning("tombstone records written again")
                self._failures = 0
            else:  # tried again (until the term ends: a leader cut off from etcd ends it)
                self._failures += 1
                if self._failures == FAILURES_BEFORE_DEGRADED:
                    log.error(
                        "etcd takes no tombstone records: removals are refused until it does "
                        "(check etcd's health and space alarm)"
                    )
                self._dirty |= segment_ids
                await asyncio.sleep(RETRY_AFTER)

    async def _write_now(
        self, segment_ids: set[str], record_of: Callable[[str], DurableRecord | None]
    ) -> bool:
        client = self._client()
        if client is None:
            return False
        now = time.time()
        chunks: list[list[Any]] = [[]]
        size = 0
        for segment_id in sorted(segment_ids):
            key = self._prefix + segment_id.encode()
            record = record_of(segment_id)
            value = b"" if record is None else encode(record, now)
            if len(chunks[-1]) >= OPS_PER_TRANSACTION or (
                chunks[-1] and size + len(key) + len(value) > BYTES_PER_TRANSACTION
            ):
                chunks.append([])
                size = 0
            size += len(key) + len(value)
            if record is None:
                chunks[-1].append(client.transactions.delete(key))
            else:
                chunks[-1].append(client.transactions.put(key, value))
        leading = client.transactions.value(self._leader_key) == self._address().encode()
        try:
            for chunk in chunks:
                if not chunk:
                    continue
                succeeded, _ = await asyncio.wait_for(
                    client.transaction(compare=[leading], success=chunk, failure=[]),
                    WRITE_TIMEOUT,
                )
                if not succeeded:
                    log.warning("tombstone records not written: this master no longer leads")
                    return False
        except ETCD_ERRORS as error:
            log.warning("tombstone records not written", error=str(error) or type(error).__name__)
            return False
        return True
