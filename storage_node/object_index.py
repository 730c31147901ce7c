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
intact and of the current format (appends go on after its last record); a log that must be
rewritten (damaged, or older) on a full disk stops the open with an error naming the log and
the room it needs, so that a node whose disk filled up can be started again.
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

    def __init__(self, path: Path, header: dict) -> None:
        """Opens (or creates) the log at ``path``. ``header`` is written to a new log; an
        existing one keeps its own, available as ``self.header``. Refuses (ValueError) a
        directory other users can write, a symbolic link, a log another process holds, and a
        log whose header is lost (then nothing is rewritten); damaged records are skipped and
        counted in ``damaged_records`` and ``undecodable_records``."""
        super().__init__()
        self.path = path
        private_files.check_private_directory(path.parent)
        self._holder = private_files.hold_exclusively(path.with_name(path.name + LOCK_SUFFIX), path)
        try:
            self.header, self._salt = self._replay(header)
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
        except BaseException:
            os.close(self._holder)
            raise

    def put(self, entries: Iterable[Entry]) -> list[Entry]:
        with self._appending:
            with self._lock:  # (one writer at a time: the node's commands, in order)
                kept = self._newer(entries)
            self._write_after_pending([encode(OP_PUT, e) for e in kept])
            kept = super().put(kept)
            self._compact_if_long()
        return kept

    def delete(self, entries: Iterable[Entry]) -> None:
        entries = list(entries)
        with self._appending:
            self._write_after_pending([encode(OP_DELETE, e) for e in entries])
            super().delete(entries)
            self._compact_if_long()

    def delete_now_or_later(self, entries: Iterable[Entry]) -> bool:
        """Removes ``entries`` from memory at once, and from the log now if it can be
        written, else ahead of the next records it takes (``write_pending`` tries again).
        For removals that must not wait on the disk: those a master ordered at a mount, which
        the node may not refuse (an unwritable log must not stop it serving its other
        segments). False when they wait: a restart before they are written finds them again."""
        entries = list(entries)
        with self._appending:
            super().delete(entries)
            self._pending.extend(encode(OP_DELETE, e) for e in entries)
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

    def _write_after_pending(self, bodies: list[bytes]) -> None:
        """Writes the removals waiting, then ``bodies`` (in that order: a later put of a key
        comes after its removal)."""
        pending = self._pending
        if pending:
            self._write(pending + bodies)
            pending.clear()
        else:
            self._write(bodies)

    def close(self) -> None:
        try:
            os.ftruncate(self._fd, self._end)  # the zeros written ahead go
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            os.close(self._holder)

    def _write(self, bodies: list[bytes]) -> None:
        if not bodies:
            return
        records = b"".join(frame(body, self._salt) for body in bodies)
        if self._end + len(records) > self._allocated:
            self._allocated = self._end + len(records) + ROOM
            write_all(self._fd, bytes(self._allocated - self._end), self._end)
        write_all(self._fd, records, self._end)
        self._end += len(records)
        os.fdatasync(self._fd)

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
        Otherwise an OSError that names the log and the room to free: a node whose disk is
        full then says what to do, instead of only that it cannot open its storage."""
        with contextlib.suppress(OSError):
            os.unlink(self.path.with_name(self.path.name + TMP_SUFFIX))
        sound = self._kept_end is not None
        if sound:
            assert self._kept_end is not None
            log.warning(
                "index log not compacted on open: appending after its last record",
                path=str(self.path),
                error=str(error),
            )
            return self._kept_end, max(self._kept_size, self._kept_end)
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

    def _replay(self, header: dict) -> tuple[dict, bytes]:
        self.damaged_records = self.undecodable_records = 0
        #: What ``_keep_log`` needs: the end of the last record of an intact log of the
        #: current format (None otherwise), and the file's size.
        self._kept_end: int | None = None
        data = private_files.read_nofollow(self.path)
        self._kept_size = len(data) if data else 0
        if not data:
            return header, os.urandom(SALT_BYTES)
        scan = read_log(data, self.path)
        if not (scan.damaged or scan.undecodable) and scan.version == FORMAT and scan.salt:
            self._kept_end = scan.end  # (after the last record: a key may end in zeros)
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


def recorded(held: Entry | None, entry: Entry) -> bool:
    """Whether ``entry`` takes the place of ``held``, the entry of its key so far: unless it
    is an older generation (generations grow across the master's terms)."""
    return held is None or entry.generation >= held.generation


def _same_object(a: Entry, b: Entry) -> bool:
    """One put of a key: the same place and generation (a later put of the key may land at
    the same offset, and a late or repeated Forget of the earlier one must not remove it)."""
    return (a.offset, a.generation) == (b.offset, b.generation)
