"""Segments' durable tombstone records in etcd, so that a removal sticks across a failover.

A new leader rebuilds its index from what the storage nodes report; a node that was away
(declared dead, or slow to answer a Forget) may report an object removed meanwhile. The
leader that answered the removal knows (master/tombstones.py), and writes what a successor
must refuse in etcd before the answer goes out; a new leader reads them all before it takes
a mount, and a record is deleted once its segment mounted and was reconciled. A record lies
in pieces by buckets of its keys (master/tombstone_format.py), and a write puts only the
pieces that changed since this term last wrote them: a removal adds one key to one piece,
not a whole record of thousands to etcd's history.

Writes are coalesced, and a failed one refuses the answers waiting on it
(master/record_writer.py). A write is a transaction guarded by the leader key naming this
master, so a deposed leader changes nothing.

A record none of whose pieces was written for ``MAX_AGE`` seconds (a segment that never came
back: its node was replaced) is deleted by the next leader that reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import aetcd
from aetcd import rpc
from aetcd.utils import prefix_range_end

from kvpool.common.logging import get_logger
from kvpool.master.election import ETCD_ERRORS, ETCD_PAGE_KEYS
from kvpool.master.record_writer import WRITE_TIMEOUT, RecordOf, RecordWriter
from kvpool.master.tombstone_format import (
    BUCKETS,
    PIECES,
    WHOLE,
    decode,
    encode,
    is_marker,
    marker,
    merge,
    piece_key,
    segment_of_piece,
    split,
    whole_key,
)
from kvpool.master.tombstones import MAX_AGE, DurableRecord

log = get_logger("kvpool.tombstones")

#: Operations per etcd transaction (etcd's default limit is 128).
OPS_PER_TRANSACTION = 64
#: Bytes of values per etcd transaction (etcd's default request limit is 1.5 MiB; one record,
#: all its pieces, holds at most tombstones.RECORD_BYTES). A segment's puts and deletes (at
#: most BUCKETS + 1) go in one transaction, so that a reader never sees half of a change.
BYTES_PER_TRANSACTION = 1 << 20


async def read_prefix(client: Any, prefix: bytes, revision: int = 0) -> tuple[list[Any], int]:
    """Every key and value under ``prefix`` (at ``revision``, 0: the latest) and the revision
    read, in pages of ETCD_PAGE_KEYS keys at most: the records may hold far more than one
    answer takes (each RECORD_BYTES, and a cluster may keep many). A page etcd's answer is
    too large for (a client with a smaller receive limit than the masters') is asked again
    in halves. Raises one of ETCD_ERRORS."""
    await asyncio.wait_for(client.connect(), WRITE_TIMEOUT)
    end = prefix_range_end(prefix)
    start = prefix
    limit = ETCD_PAGE_KEYS
    found: list[Any] = []
    while True:
        request = rpc.RangeRequest(key=start, range_end=end, limit=limit, revision=revision)
        try:
            response = await asyncio.wait_for(
                client.kvstub.Range(request, timeout=WRITE_TIMEOUT, metadata=client.metadata),
                WRITE_TIMEOUT,
            )
        except rpc.AioRpcError as error:
            if error.code() is rpc.StatusCode.RESOURCE_EXHAUSTED and limit > 1:
                limit //= 2
                continue
            raise aetcd.ClientError(f"{error.code().name}: {error.details()}") from error
        revision = revision or response.header.revision
        found.extend(response.kvs)
        if not response.more or not response.kvs:
            return found, revision
        start = response.kvs[-1].key + b"\0"


class TombstoneStore(RecordWriter):
    """The records in etcd, where every master reaches them."""

    where = "etcd"

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
        super().__init__()
        self._client = client
        self._cluster_prefix = cluster_prefix
        self._leader_key = leader_key
        self._address = address
        #: segment id -> its pieces in etcd by bucket, as this term wrote them (a segment not
        #: here: not known, its next write puts every piece and deletes every other bucket).
        self._written: dict[str, dict[int, DurableRecord]] = {}
        #: Bytes of keys and values of the pieces sent to etcd (bench/tombstone_writes.py).
        self.bytes_put = 0

    # ---- a term

    async def load(self) -> dict[str, DurableRecord]:
        """Every record an earlier leader kept (those past MAX_AGE deleted instead), read in
        pages (``read_prefix``: together they may be far larger than one answer of etcd).
        Raises one of ETCD_ERRORS when etcd cannot be read: a leader must not serve without
        them."""
        client = self._client()
        if client is None:
            raise ConnectionError("no etcd client")
        prefix = self._cluster_prefix
        pieces, revision = await read_prefix(client, prefix + PIECES)
        wholes, _ = await read_prefix(client, prefix + WHOLE, revision)
        #: segment id -> (when written, what it holds: None for a marker), and the keys.
        found: dict[str, list[tuple[float, DurableRecord | None]]] = {}
        keys: dict[str, list[bytes]] = {}
        now = time.time()
        for kv in [*pieces, *wholes]:
            if kv.key.startswith(prefix + PIECES):
                segment_id = segment_of_piece(prefix, kv.key)
                if segment_id is None:
                    log.error("a tombstone piece's key is unreadable", key=repr(kv.key))
                    continue
            else:
                segment_id = kv.key[len(prefix + WHOLE) :].decode(errors="replace")
            record: DurableRecord | None
            try:
                at, record = decode(kv.value)
                if is_marker(kv.value):
                    record = None  # (for masters before the pieces: the pieces say it all)
            except ValueError as error:
                log.error("a tombstone record is unreadable", segment=segment_id, error=str(error))
                record, at = DurableRecord(True, {}), now  # (adopt nothing it does not hold)
            found.setdefault(segment_id, []).append((at, record))
            keys.setdefault(segment_id, []).append(kv.key)
        records: dict[str, DurableRecord] = {}
        stale: list[bytes] = []
        for segment_id, read in found.items():
            if now - max(at for at, _ in read) > MAX_AGE:
                stale += keys[segment_id]
                continue
            merged = merge(record for _, record in read if record is not None)
            if not merged.empty:
                records[segment_id] = merged
        for key in stale:
            with contextlib.suppress(*ETCD_ERRORS):
                await asyncio.wait_for(client.delete(key), WRITE_TIMEOUT)
        return records

    def _forget_written(self) -> None:
        self._written.clear()  # (another leader may write before the next term)

    async def _write_now(self, segment_ids: set[str], record_of: RecordOf) -> bool:
        client = self._client()
        if client is None:
            return False
        now = time.time()
        #: Transactions to run: their operations, and each segment's pieces once done.
        chunks: list[tuple[list[Any], dict[str, dict[int, DurableRecord]]]] = [([], {})]
        size = 0
        for segment_id in sorted(segment_ids):
            pieces = split(record_of(segment_id))
            ops, put = self._changes(client, segment_id, pieces, now)
            if not ops:
                continue
            chunk_ops = chunks[-1][0]
            if chunk_ops and (
                len(chunk_ops) + len(ops) > OPS_PER_TRANSACTION
                or size + put > BYTES_PER_TRANSACTION
            ):
                chunks.append(([], {}))
                size = 0
            size += put
            chunks[-1][0].extend(ops)
            chunks[-1][1][segment_id] = pieces
        leading = client.transactions.value(self._leader_key) == self._address().encode()
        pending = {segment for _, done in chunks for segment in done}
        try:
            for ops, done in chunks:
                if not ops:
                    continue
                succeeded, _ = await asyncio.wait_for(
                    client.transaction(compare=[leading], success=ops, failure=[]),
                    WRITE_TIMEOUT,
                )
                if not succeeded:
                    log.warning("tombstone records not written: this master no longer leads")
                    return False
                for segment_id, pieces in done.items():
                    pending.discard(segment_id)
                    if pieces:
                        self._written[segment_id] = pieces
                    else:
                        self._written.pop(segment_id, None)
        except ETCD_ERRORS as error:
            log.warning("tombstone records not written", error=str(error) or type(error).__name__)
            return False
        finally:
            for segment_id in pending:  # (perhaps written, perhaps not: rewritten whole)
                self._written.pop(segment_id, None)
        return True

    def _changes(
        self, client: Any, segment_id: str, pieces: dict[int, DurableRecord], now: float
    ) -> tuple[list[Any], int]:
        """The operations that make the segment's pieces in etcd ``pieces``, and the bytes
        they put: only what changed since this term wrote it, or, not known, every piece
        put and every other bucket deleted; the whole record is the marker for older
        masters while there are pieces (tombstone_format.py), else deleted."""
        prefix = self._cluster_prefix
        known = self._written.get(segment_id)
        ops: list[Any] = []
        put = 0
        for bucket, piece in pieces.items():
            if known is None or known.get(bucket) != piece:
                key, value = piece_key(prefix, bucket, segment_id), encode(piece, now)
                ops.append(client.transactions.put(key, value))
                put += len(key) + len(value)
        whole = whole_key(prefix, segment_id)
        if known is None:
            gone: list[int] = [bucket for bucket in range(BUCKETS) if bucket not in pieces]
            if pieces:  # (replaces an older master's whole record, if any)
                value = marker(now)
                ops.append(client.transactions.put(whole, value))
                put += len(whole) + len(value)
            else:
                ops.append(client.transactions.delete(whole))
        else:  # (pieces there: the marker too)
            gone = [bucket for bucket in known if bucket not in pieces]
            if not pieces:
                ops.append(client.transactions.delete(whole))
        for bucket in gone:
            ops.append(client.transactions.delete(piece_key(prefix, bucket, segment_id)))
        self.bytes_put += put
        return ops, put
