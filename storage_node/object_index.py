"""What a segment holds: the objects its node has recorded, by key.

``MemoryIndex`` serves DRAM segments (lost with the process, like their bytes).
``DurableIndex`` serves persistent segments (NVMe files, /dev/shm): an append-only log next
to the data (its format, and how a damaged one is read back: ``index_log``), compacted to the
live entries on open. Its directory must be the node's own, its files are never opened
through a symbolic link, and one process at a time holds it (``private_files``).

An index never lets an older generation of a key replace a newer one (``recorded``): a
Persist or copy the master sent before the node's last remount can still be carried out
after it, and the node must not then report the removed older object, nor lose the newer
one, at its next mount or the next leader's rebuild.

Every record is on the disk before ``put`` or ``delete`` returns, so an append waits for the
disk. The log is written ahead with zeros (``ROOM`` bytes at a time) and records overwrite
them in place: an append then changes neither the file's size nor its blocks, and its sync
writes the record alone, with no file-system journal commit. A clean close cuts the zeros
off again; after a crash they stay, and the reader takes them for the end of the log.

The log is compacted on open, and again while the node runs once what was appended since
the last compaction is ``COMPACT_RATIO`` times what that compaction kept (and at least
``COMPACT_AT``): a node serving puts and removals for weeks would otherwise grow its log by
every record it ever wrote, until it filled the disk and its next start replayed all of it.
Compaction is the same atomic rewrite as on open (a new file, synced, renamed over the log),
so a crash during it leaves one log or the other, each whole. It holds up the appends while
it writes (a pass over the live entries, once per ``COMPACT_RATIO`` times as many appends); a
file system with no room for the new file leaves the old log in place and the next try
``COMPACT_AT`` bytes of appends later. So does the compaction on open, where the old log is
intact and of the current format (appends go on after its last record), or its only damage
is a torn last record (a crash mid-append: that record is zeroed first); a log that must be
rewritten (damaged elsewhere, or older) on a full disk stops the open with an error naming
the log and the room it needs, so that a node whose disk filled up can be started again.

An append that finds no room left takes more (zeros) first, and counts it as room only once
written: on a full disk it fails there, before any record, and the next append tries again.
A removal is written only for a put the log holds (or, after an append that failed and could
not be undone, may hold): the removal of an object whose put never reached the log (a full
disk failed it) then needs no room either.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from kvpool.common.file_writes import write_all
from kvpool.common.logging import get_logger
from kvpool.storage_node import metrics, private_files
from kvpool.storage_node.index_log import (
    FORMAT,
    OP_DELETE,
    OP_PUT,
    SALT_BYTES,
    UNCONFIRMED_ABOVE,
    Entry,
    LogDamaged,
    Scan,
    encode,
    frame,
    header_slots,
    read_log,
)

__all__ = ["DurableIndex", "Entry", "MemoryIndex", "live_entries", "recorded"]

log = get_logger("kvpool.node.index")

LOCK_SUFFIX = ".lock"
TMP_SUFFIX = ".tmp"
#: Zeros written ahead of the appends at a time (a record takes some 40 bytes and its key).
ROOM = 1 << 20
#: Appended bytes, as a multiple of what the last compaction kept, that make the log compact.
COMPACT_RATIO = 4
#: Appended bytes below which the log is never compacted while open.
COMPACT_AT = 16 << 20


class MemoryIndex:
    """The objects of a DRAM segment, in memory only. Thread-safe: commands update it on a
    worker thread while the event loop reads it to remount."""

    durable = False

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()
        #: Keys whose entry a damaged log may have removed since (index_log): reported as
        #: unconfirmed until a master confirms them (``confirm``).
        self.unconfirmed: set[str] = set()

    def put(self, entries: Iterable[Entry]) -> list[Entry]:
        """Records ``entries``; returns those recorded (an older generation of a key than
        the one held is not)."""
        with self._lock:
            kept = self._newer(entries)
            unconfirmed = self.unconfirmed
            for entry in kept:
                self._entries[entry.key] = entry
                if unconfirmed:
                    unconfirmed.discard(entry.key)  # (recorded afresh)
            return kept

    def _newer(self, entries: Iterable[Entry]) -> list[Entry]:
        """Those of ``entries`` the index would record (callers hold the lock)."""
        held = self._entries
        return [entry for entry in entries if recorded(held.get(entry.key), entry)]

    def delete(self, entries: Iterable[Entry]) -> None:
        with self._lock:
            for entry in entries:
                current = self._entries.get(entry.key)
                if current is not None and _same_object(current, entry):
                    del self._entries[entry.key]  # only that object: Forgets may come twice
                    self.unconfirmed.discard(entry.key)

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def holds(self, entry: Entry) -> bool:
        """Whether ``entry``'s object (its key, place and generation) is recorded."""
        with self._lock:
            current = self._entries.get(entry.key)
            return current is not None and _same_object(current, entry)

    def confirm(self) -> None:
        """A master adopted what the segment reported, or had the node forget it: nothing
        recorded is in doubt any more."""
        with self._lock:
            self.unconfirmed.clear()

    def delete_now_or_later(self, entries: Iterable[Entry]) -> bool:
        """Removes ``entries`` at once; True once that is durable (see DurableIndex)."""
        self.delete(entries)
        return True

    def write_pending(self) -> bool:
        """True: nothing waits to be written."""
        return True

    def close(self) -> None:
        pass


class DurableIndex(MemoryIndex):
    """The objects of a persistent segment, in a crash-safe log file."""

    durable = True

    def __init__(self, path: Path, header: dict, *, data_file: Path | None = None) -> None:
        """Opens (or creates) the log at ``path``. ``header`` is written to a new log; an
        existing one keeps its own, available as ``self.header``. Refuses (ValueError) a
        directory other users can write, a symbolic link, a log another process holds, and a
        log whose header is lost (then nothing is rewritten); damaged records are skipped and
        counted in ``damaged_records`` and ``undecodable_records``. ``data_file``: the file
        whose objects the log records; a log missing or empty beside it while it holds bytes
        is refused too, and none is created (``_refuse_lost_log``)."""
        super().__init__()
        self.path = path
        private_files.check_private_directory(path.parent)
        self._holder = private_files.hold_exclusively(path.with_name(path.name + LOCK_SUFFIX), path)
        try:
            self.header, self._salt = self._replay(header, data_file)
            #: Where the next record goes, and where the zeros written ahead end.
            try:
                self._end = self._rewrite()
                self._allocated = self._end + ROOM
            except OSError as error:
                self._end, self._allocated = self._keep_log(error)
            self._compact_after = self._end + max(COMPACT_AT, COMPACT_RATIO * self._end)
            self._fd = private_files.open_for_update(path)
            #: One record run at a time, and its entries in memory before the next (a
            #: compaction writes the entries in memory: each must hold all that was appended).
            self._appending = threading.Lock()
            self.compactions = 0
            #: Removals taken in memory whose records the log did not take (it could not be
            #: written: ``delete_now_or_later``); they go ahead of the next records written.
            self._pending: list[bytes] = []
            #: The places (key, offset, generation) of puts an append failed to write whole
            #: that it could not undo: the log may hold them, so their removal is recorded.
            self._doubtful: set[tuple[str, int, int]] = set()
        except BaseException:
            self._holder.close()
            raise

    def put(self, entries: Iterable[Entry]) -> list[Entry]:
        with self._appending:
            with self._lock:  # (one writer at a time: the node's commands, in order)
                kept = self._newer(entries)
            self._write_after_pending([encode(OP_PUT, e) for e in kept], puts=kept)
            kept = super().put(kept)
            self._compact_if_long()
        return kept

    def delete(self, entries: Iterable[Entry]) -> None:
        """Removes ``entries``, durably: a record for each the log may hold (``_logged``);
        one it never took (its put failed, or it was removed already) is removed with no
        write at all, so that a full disk does not fail the removal of nothing."""
        with self._appending:
            logged = self._logged(entries)
            self._write_after_pending([encode(OP_DELETE, e) for e in logged])
            self._doubtful.difference_update(_place(e) for e in logged)
            super().delete(logged)
            self._compact_if_long()

    def _logged(self, entries: Iterable[Entry]) -> list[Entry]:
        """Those of ``entries`` whose put the log holds or may hold: recorded (the same key,
        place and generation), or written by an append that failed and could not be undone
        (``_doubtful``). Callers hold ``_appending``."""
        doubtful = self._doubtful
        with self._lock:
            held = self._entries
            return [
                e
                for e in entries
                if ((current := held.get(e.key)) is not None and _same_object(current, e))
                or (doubtful and _place(e) in doubtful)
            ]

    def delete_now_or_later(self, entries: Iterable[Entry]) -> bool:
        """Removes ``entries`` from memory at once, and from the log now if it can be
        written, else ahead of the next records it takes (``write_pending`` tries again).
        For removals that must not wait on the disk: those a master ordered at a mount, which
        the node may not refuse (an unwritable log must not stop it serving its other
        segments). False when they wait: a restart before they are written finds them again."""
        with self._appending:
            logged = self._logged(entries)
            super().delete(logged)
            self._pending.extend(encode(OP_DELETE, e) for e in logged)
            self._doubtful.difference_update(_place(e) for e in logged)  # (pending now)
            return self._try_pending()

    def write_pending(self) -> bool:
        """Writes the removals waiting, if any; True once none waits."""
        if not self._pending:
            return True
        with self._appending:
            return self._try_pending()

    def _try_pending(self) -> bool:
        try:
            self._write_after_pending([])
        except OSError as error:
            log.warning(
                "index log not written: removals wait",
                path=str(self.path),
                waiting=len(self._pending),
                error=str(error),
            )
            return False
        return True

    def _write_after_pending(self, bodies: list[bytes], puts: Iterable[Entry] = ()) -> None:
        """Writes the removals waiting, then ``bodies`` (in that order: a later put of a key
        comes after its removal); ``puts``: the entries whose put records ``bodies`` hold."""
        pending = self._pending
        if pending:
            self._write(pending + bodies, puts)
            pending.clear()
        else:
            self._write(bodies, puts)

    def close(self) -> None:
        try:
            os.ftruncate(self._fd, self._end)  # the zeros written ahead go
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._holder.close()

    def _write(self, bodies: list[bytes], puts: Iterable[Entry] = ()) -> None:
        """Appends ``bodies``, durably, or raises OSError having appended none of them.
        Where the log has no room left for them, it takes more first: zeros written ahead,
        counted as room only once written (a full disk fails here, before any record). A
        record write or sync that fails is undone (zeros over it) where it can be; where it
        cannot, the entries of ``puts`` may be in the log after all (``_doubtful``)."""
        if not bodies:
            return
        records = b"".join(frame(body, self._salt) for body in bodies)
        start = self._end
        if start + len(records) > self._allocated:
            self._grow(start + len(records) + ROOM)
        try:
            write_all(self._fd, records, start)
            os.fdatasync(self._fd)
        except OSError:
            try:
                write_all(self._fd, bytes(len(records)), start)
                os.fdatasync(self._fd)
            except OSError:
                self._doubtful.update(_place(e) for e in puts)
            raise
        self._end = start + len(records)

    def _grow(self, allocated: int) -> None:
        """Writes zeros up to ``allocated``; the room is what was written, even when the
        write fails part way (no space left, say), and never more."""
        try:
            write_all(self._fd, bytes(allocated - self._end), self._end)
        except OSError:
            with contextlib.suppress(OSError):  # (zeros that did land are room too)
                self._allocated = max(self._allocated, os.fstat(self._fd).st_size)
            raise
        self._allocated = allocated

    def confirm(self) -> None:
        """A master adopted what the segment reported, or had the node forget it: the log is
        rewritten without its unconfirmed mark (a restart then reports every entry as sure)."""
        with self._appending:
            if self.unconfirmed:
                super().confirm()
                self._compact()

    def _compact_if_long(self) -> None:
        """Rewrites the log with its live entries alone once it has grown long enough
        (callers hold ``_appending``)."""
        if self._end >= self._compact_after:
            self._compact()

    def _compact(self) -> None:
        """Rewrites the log with its live entries alone (callers hold ``_appending``)."""
        try:
            end = self._rewrite()
        except (OSError, private_files.UnsafeLocation) as error:
            # (no room for the new file, say: the old log, untouched, serves on)
            self._compact_after = self._end + COMPACT_AT
            log.warning("index log not compacted", path=str(self.path), error=str(error))
            with contextlib.suppress(OSError):
                os.unlink(self.path.with_name(self.path.name + TMP_SUFFIX))
            return
        fd = private_files.open_for_update(self.path)  # (the old one names the old file)
        os.close(self._fd)
        self._fd, self._end, self._allocated = fd, end, end + ROOM
        self._compact_after = end + max(COMPACT_AT, COMPACT_RATIO * end)
        self.compactions += 1
        self._pending.clear()  # (the live entries written are those left after them)
        self._doubtful.clear()  # (the old log, which may hold them, is gone)
        metrics.INDEX_COMPACTIONS.inc()

    @property
    def log_bytes(self) -> int:
        """Bytes of the log: its records and the zeros written ahead of them."""
        return self._allocated

    def _keep_log(self, error: OSError) -> tuple[int, int]:
        """After the compaction on open failed (no room for the new file, say): where the
        next record goes and where the log's zeros end, appending after its last record as
        though it had just been compacted, when that reads back the same (an intact log of
        the current format; its records are all live or removals, which replay alike).
        A log whose only damage is its last record, torn (a crash while it was appended,
        which never returned), is kept too: that record is zeroed, so the next appends
        overwrite it. Otherwise an OSError that names the log and the room to free: a node
        whose disk is full then says what to do, instead of only that it cannot open its
        storage."""
        with contextlib.suppress(OSError):
            os.unlink(self.path.with_name(self.path.name + TMP_SUFFIX))
        kept_end = self._kept_end
        if kept_end is not None and self._torn_end > kept_end:
            try:  # the torn record goes: left, it would be damage that later records follow
                self._zero(kept_end, self._torn_end)
            except OSError as zeroing:
                log.warning("index log's torn end not cut", path=str(self.path), error=str(zeroing))
                kept_end = None
        if kept_end is not None:
            log.warning(
                "index log not compacted on open: appending after its last record",
                path=str(self.path),
                error=str(error),
            )
            return kept_end, max(self._kept_size, kept_end)
        why = (
            "the log is new"
            if not self._kept_size
            else "the log is damaged or of an older format, so it must be rewritten"
        )
        needed = self._kept_size + ROOM
        raise OSError(
            error.errno,
            f"cannot write the index log {self.path} on open ({why}): "
            f"{error.strerror or error}. It needs about {needed} bytes free on its file "
            f"system: free that much in {self.path.parent}'s file system and start again",
        ) from error

    def _zero(self, start: int, end: int) -> None:
        """Overwrites [start, end) of the log with zeros, durably (in place: no new room)."""
        fd = private_files.open_for_update(self.path)
        try:
            write_all(fd, bytes(end - start), start)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def _replay(self, header: dict, data_file: Path | None) -> tuple[dict, bytes]:
        self.damaged_records = self.undecodable_records = 0
        #: What ``_keep_log`` needs: the end of the last record of an intact log of the
        #: current format, or of one whose only damage is a torn last record (None
        #: otherwise), and the file's size.
        self._kept_end: int | None = None
        self._torn_end = 0
        data = private_files.read_nofollow(self.path)
        self._kept_size = len(data) if data else 0
        if not data:
            if data_file is not None:
                _refuse_lost_log(self.path, data is None, data_file)
            return header, os.urandom(SALT_BYTES)
        scan = read_log(data, self.path)
        current = scan.version == FORMAT and scan.salt and not scan.undecodable
        if current and (not scan.damaged or _torn_tail_only(data, scan, self.path)):
            self._kept_end = scan.end  # (after the last record: a key may end in zeros)
            #: Where the bytes of a torn last record end (zeros from there on).
            self._torn_end = len(data.rstrip(b"\0")) if scan.damaged else 0
        split = scan.unconfirmed_before
        for op, entry in scan.records[:split]:
            (super().put if op == OP_PUT else super().delete)([entry])
        above = dict(self._entries)
        for op, entry in scan.records[split:]:
            (super().put if op == OP_PUT else super().delete)([entry])
        # (the entries no record below the damage replaced or removed)
        self.unconfirmed = {key for key, entry in self._entries.items() if above.get(key) is entry}
        self.damaged_records, self.undecodable_records = scan.damaged, scan.undecodable
        return scan.header, scan.salt or os.urandom(SALT_BYTES)  # format 1 had no salt

    def _rewrite(self) -> int:
        """Compacts the log to its header and live entries, atomically, followed by ``ROOM``
        zeros; returns where the zeros begin."""
        tmp = self.path.with_name(self.path.name + TMP_SUFFIX)
        salt = self._salt
        entries = self.entries()
        parts = [header_slots(self.header, salt)]
        unconfirmed = self.unconfirmed
        if unconfirmed:  # first, with the marker after them (index_log)
            parts.extend(frame(encode(OP_PUT, e), salt) for e in entries if e.key in unconfirmed)
            parts.append(frame(UNCONFIRMED_ABOVE, salt))
            entries = [e for e in entries if e.key not in unconfirmed]
        parts.extend(frame(encode(OP_PUT, e), salt) for e in entries)
        log = b"".join(parts)
        fd = private_files.create_new(tmp)
        try:
            write_all(fd, log, 0)
            write_all(fd, bytes(ROOM), len(log))
            os.fsync(fd)
        finally:
            os.close(fd)
        end = len(log)
        tmp.replace(self.path)
        private_files.sync_directory(self.path.parent)
        return end


def live_entries(path: Path) -> dict[str, Entry]:
    """The objects a log says its segment holds, read without changing the file."""
    entries: dict[str, Entry] = {}
    data = private_files.read_nofollow(path)
    if not data:
        return entries
    for op, value in read_log(data, path).records:
        if op == OP_PUT:
            if recorded(entries.get(value.key), value):
                entries[value.key] = value
        elif op == OP_DELETE and _same_object(entries.get(value.key, value), value):
            entries.pop(value.key, None)
    return entries


def _refuse_lost_log(path: Path, missing: bool, data_file: Path) -> None:
    """Refuses (``LogDamaged``) a log missing or empty (``path``) beside a data file that holds
    bytes; returns where the data file is missing or empty: a new segment.

    A new log would start the segment afresh with a new id, and the data file's space would be
    reused as free: every object published on it lost, with no error. That cannot be a new
    segment: its log is created first, whole (header and all, written and synced before it is
    renamed into place, and its directory synced: ``_rewrite``), and only then its data file
    (storage_node/segment.py ``open_persistent_segment``); a log is never empty once there,
    and a start refused for room removes a data file it made (or found empty) before the log.
    (Files of the layout before segment directories move in data first, index last, and a
    start moves an index left behind before it opens it: storage_node/segment_layout.py.)
    So a crash at any point leaves no data file, an empty one, or one with its log; a data
    file with bytes and no log means the log was lost (deleted, truncated, left out of a
    restore), and only someone who knows which can say whether its objects matter."""
    try:
        size = os.stat(data_file).st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    raise LogDamaged(
        f"{path} is {'missing' if missing else 'empty'}, but the data file {data_file} beside "
        f"it holds {size} bytes: the segment's index is lost (an index is written before its "
        "data file, so this is no new segment), and nothing says which objects the file holds. "
        f"Restore {path} and start again, or move {data_file} away (or delete it) to start "
        "the segment empty (its objects are lost)"
    )


def recorded(held: Entry | None, entry: Entry) -> bool:
    """Whether ``entry`` takes the place of ``held``, the entry of its key so far: unless it
    is an older generation (generations grow across the master's terms)."""
    return held is None or entry.generation >= held.generation


def _torn_tail_only(data: bytes, scan: Scan, path: Path) -> bool:
    """Whether the damage ``scan`` found in ``data`` all lies after its last intact record:
    the log read up to there alone is whole (undecodable records never lie after it)."""
    ahead = read_log(data[: scan.end], path)
    return not (ahead.damaged or ahead.undecodable)


def _place(entry: Entry) -> tuple[str, int, int]:
    """What names one put of a key in ``DurableIndex._doubtful``."""
    return entry.key, entry.offset, entry.generation


def _same_object(a: Entry, b: Entry) -> bool:
    """One put of a key: the same place and generation (a later put of the key may land at
    the same offset, and a late or repeated Forget of the earlier one must not remove it)."""
    return (a.offset, a.generation) == (b.offset, b.generation)
