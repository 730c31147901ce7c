"""How a segment's durable tombstone record lies in etcd: pieces, one per bucket of its keys.

A record (master/tombstones.py's ``DurableRecord``) changes one key at a time: a removal while
the segment's node is away adds a tombstone, an answered Forget takes one off. Written whole at
each change, a record of a few thousand keys put up to 768 KiB into etcd per removal, and etcd
keeps every revision inside its compaction window and its recent raft entries in memory: its
resident memory grew with the bytes rewritten (docs/reliability.md). So a record is split by
a stable hash of each key into ``BUCKETS`` pieces, each a small record of its own, and a write
puts only the pieces that changed (master/tombstone_store.py keeps what it wrote).

Layout: ``<cluster>/tombstone-pieces/<bucket, two hex digits>/<segment id>``, the bucket first
so that any segment id (slashes included) reads back unambiguously. Each value is a whole
record's JSON (``encode``) holding that bucket's keys; a distrusted record is one piece, in
bucket 0. Reading merges a segment's pieces (``merge``): any piece distrusted makes the record
distrusted, keys and late writes are the union. Records written whole under
``<cluster>/tombstones/<segment id>`` by masters before this layout are still read, and
replaced by the first write of their segment.

**Masters before the pieces** (a rolling upgrade) read only the whole records. So while a
segment has pieces, its whole record is a *marker* (``marker``): a distrusted record with
``"pieces": true``, which such a master reads as "adopt nothing from this segment that you do
not hold" (cached objects may be lost through that one failover; none removed comes back),
and which this layout skips (``is_marker``). It is written when a segment's first piece is,
and deleted with its last one: no more than a put per segment while nodes are away.

**Distrusted prefixes** (a prefix removal while a node was not heard from: refuse, under the
prefix, what the master does not hold) lie in bucket 0's piece as ``"scoped"``, and that
piece says ``"distrusted": true`` for masters before them, which read it as a whole
distrust (safe: nothing removed comes back; other tenants' cached objects on that node may
be lost through that one failover). This layout reads such a piece as not distrusted.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable

from kvpool.master.tombstones import DurableRecord

#: Pieces one record is split into (a segment's write is at most this many puts and deletes).
BUCKETS = 32
#: Under the cluster's prefix: the pieces, and the whole records of older masters.
PIECES = b"/tombstone-pieces/"
WHOLE = b"/tombstones/"


def encode(record: DurableRecord, now: float) -> bytes:
    fields: dict[str, object] = {"at": now, "distrusted": record.distrusted, "keys": record.keys}
    if record.exact:  # (absent when empty: what masters before it wrote and read)
        fields["exact"] = sorted(record.exact)
    if record.prefixes and not record.distrusted:
        fields["scoped"] = sorted(record.prefixes)
        fields["distrusted"] = True  # (what a master before them must read: see above)
    return json.dumps(fields, separators=(",", ":")).encode()


def decode(value: bytes) -> tuple[float, DurableRecord]:
    """Raises ValueError on a value no master wrote."""
    try:
        fields = json.loads(value)
        at = float(fields["at"])
        keys = {str(k): int(g) for k, g in dict(fields["keys"]).items()}
        exact = frozenset((str(k), int(g)) for k, g in fields.get("exact", ()))
        if "scoped" in fields:
            prefixes = frozenset((str(p), int(g)) for p, g in fields["scoped"])
            return at, DurableRecord(False, keys, exact, prefixes)
        return at, DurableRecord(bool(fields["distrusted"]), keys, exact)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"not a tombstone record: {error}") from None


def marker(now: float) -> bytes:
    """The whole record of a segment that has pieces (see above)."""
    fields = {"at": now, "distrusted": True, "keys": {}, "pieces": True}
    return json.dumps(fields, separators=(",", ":")).encode()


def is_marker(value: bytes) -> bool:
    """Whether a whole record is a marker (its pieces hold the record)."""
    try:
        fields = json.loads(value)
    except ValueError:
        return False
    return isinstance(fields, dict) and fields.get("pieces") is True


def bucket_of(key: str) -> int:
    """The piece ``key`` lies in: the same on every master (not Python's salted hash)."""
    return zlib.crc32(key.encode()) % BUCKETS


def split(record: DurableRecord | None) -> dict[int, DurableRecord]:
    """The pieces of ``record`` by bucket (none for no record; buckets with nothing to keep
    have no piece)."""
    if record is None:
        return {}
    if record.distrusted:
        return {0: DurableRecord(True, {})}
    keys: dict[int, dict[str, int]] = {}
    exact: dict[int, set[tuple[str, int]]] = {}
    for key, generation in record.keys.items():
        keys.setdefault(bucket_of(key), {})[key] = generation
    for entry in record.exact:
        exact.setdefault(bucket_of(entry[0]), set()).add(entry)
    buckets = keys.keys() | exact.keys() | ({0} if record.prefixes else set())
    return {
        bucket: DurableRecord(
            False,
            keys.get(bucket, {}),
            frozenset(exact.get(bucket, ())),
            record.prefixes if bucket == 0 else frozenset(),
        )
        for bucket in sorted(buckets)
    }


def merge(pieces: Iterable[DurableRecord]) -> DurableRecord:
    """One segment's record from its pieces (a whole record of an older master included)."""
    keys: dict[str, int] = {}
    exact: set[tuple[str, int]] = set()
    prefixes: dict[str, int] = {}
    for piece in pieces:
        if piece.distrusted:
            return DurableRecord(True, {})
        for key, generation in piece.keys.items():
            keys[key] = max(generation, keys.get(key, 0))
        exact |= piece.exact
        for prefix, generation in piece.prefixes:
            prefixes[prefix] = max(generation, prefixes.get(prefix, 0))
    return DurableRecord(False, keys, frozenset(exact), frozenset(prefixes.items()))


def piece_key(cluster_prefix: bytes, bucket: int, segment_id: str) -> bytes:
    return cluster_prefix + PIECES + b"%02x/" % bucket + segment_id.encode()


def whole_key(cluster_prefix: bytes, segment_id: str) -> bytes:
    return cluster_prefix + WHOLE + segment_id.encode()


def segment_of_piece(cluster_prefix: bytes, key: bytes) -> str | None:
    """The segment id a piece's etcd key names (None: not a piece's key)."""
    rest = key[len(cluster_prefix + PIECES) :]
    if len(rest) < 4 or rest[2:3] != b"/":
        return None
    try:
        if int(rest[:2], 16) >= BUCKETS:
            return None
    except ValueError:
        return None
    return rest[3:].decode(errors="replace")
