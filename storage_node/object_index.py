"""What a segment holds: the objects its node has recorded, by key.

``MemoryIndex`` serves DRAM segments (lost with the process, like their bytes).
``DurableIndex`` serves persistent segments (NVMe files, /dev/shm): an append-only log next
to the data, each record framed by a magic number, its length and a CRC-32C of its body. A
torn or corrupted record is skipped (the scan resynchronises on the next magic), never
trusted; on open the log is compacted to the live entries.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import google_crc32c

MAGIC = 0x4B56504C  # "KVPL"
FRAME = struct.Struct("<III")  # magic, body length, crc32c(body)
ENTRY = struct.Struct("<BQQQIB")  # op, offset, size, generation, crc32c, has_crc
OP_HEADER, OP_PUT, OP_DELETE = 0, 1, 2
MAX_BODY = 1 << 16


class Entry(NamedTuple):
    """One recorded object (a named tuple: one is made per object of every command)."""

    key: str
    offset: int
    size: int
    generation: int
    crc32c: int | None = None


class MemoryIndex:
    """The objects of a DRAM segment, in memory only. Thread-safe: commands update it on a
    worker thread while the event loop reads it to remount."""

    durable = False

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()

    def put(self, entries: Iterable[Entry]) -> None:
        with self._lock:
            for entry in entries:
                self._entries[entry.key] = entry

    def delete(self, entries: Iterable[Entry]) -> None:
        with self._lock:
            for entry in entries:
                current = self._entries.get(entry.key)
                if current is not None and _same_object(current, entry):
                    del self._entries[entry.key]  # only that object: Forgets may come twice

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def close(self) -> None:
        pass


class DurableIndex(MemoryIndex):
    """The objects of a persistent segment, in a crash-safe log file."""

    durable = True

    def __init__(self, path: Path, header: dict) -> None:
        """Opens (or creates) the log at ``path``. ``header`` is written to a new log; an
        existing one keeps its own, available as ``self.header``."""
        super().__init__()
        self.path = path
        self.skipped_records = 0
        if path.exists() and path.stat().st_size > 0:
            self.header = self._replay()
        else:
            self.header = header
        self._rewrite()
        self._file = open(path, "ab")  # noqa: SIM115 - kept open for appends until close()

    def put(self, entries: Iterable[Entry]) -> None:
        entries = list(entries)
        self._append([_encode(OP_PUT, e) for e in entries])
        super().put(entries)

    def delete(self, entries: Iterable[Entry]) -> None:
        entries = list(entries)
        self._append([_encode(OP_DELETE, e) for e in entries])
        super().delete(entries)

    def close(self) -> None:
        self._file.close()

    def _append(self, bodies: list[bytes]) -> None:
        if not bodies:
            return
        self._file.write(b"".join(_frame(body) for body in bodies))
        self._file.flush()
        os.fdatasync(self._file.fileno())

    def _replay(self) -> dict:
        header = {}
        for op, value in read_records(self.path.read_bytes(), self):
            if op == OP_HEADER:
                header = value
            else:
                (super().put if op == OP_PUT else super().delete)([value])
        return header

    def _rewrite(self) -> None:
        """Compacts the log to its header and live entries, atomically."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as out:
            out.write(_frame(bytes([OP_HEADER]) + json.dumps(self.header).encode()))
            out.write(b"".join(_frame(_encode(OP_PUT, e)) for e in self.entries()))
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def read_records(data: bytes, counter: DurableIndex | None = None):
    """Yields (op, header dict or Entry) for every intact record of a log; damaged ones are
    skipped (and counted in ``counter.skipped_records``)."""
    position = 0
    while position + FRAME.size <= len(data):
        magic, length, crc = FRAME.unpack_from(data, position)
        body = data[position + FRAME.size : position + FRAME.size + length]
        if magic != MAGIC or length > MAX_BODY or len(body) != length or not body:
            intact = False
        else:
            intact = google_crc32c.value(body) == crc
        if not intact:
            if counter is not None:
                counter.skipped_records += 1
            position = _next_magic(data, position + 1)
            continue
        position += FRAME.size + length
        op = body[0]
        if op == OP_HEADER:
            yield op, json.loads(body[1:])
        elif op in (OP_PUT, OP_DELETE):
            yield op, _decode(body)


def live_entries(path: Path) -> dict[str, Entry]:
    """The objects a log says its segment holds, read without changing the file."""
    entries: dict[str, Entry] = {}
    for op, value in read_records(path.read_bytes()):
        if op == OP_PUT:
            entries[value.key] = value
        elif op == OP_DELETE and _same_object(entries.get(value.key, value), value):
            entries.pop(value.key, None)
    return entries


def _same_object(a: Entry, b: Entry) -> bool:
    """One put of a key: the same place and generation (a later put of the key may land at
    the same offset, and a late or repeated Forget of the earlier one must not remove it)."""
    return (a.offset, a.generation) == (b.offset, b.generation)


def _frame(body: bytes) -> bytes:
    return FRAME.pack(MAGIC, len(body), google_crc32c.value(body)) + body


def _encode(op: int, entry: Entry) -> bytes:
    has_crc = entry.crc32c is not None
    crc = entry.crc32c if has_crc else 0
    return (
        ENTRY.pack(op, entry.offset, entry.size, entry.generation, crc, has_crc)
        + entry.key.encode()
    )


def _decode(body: bytes) -> Entry:
    _, offset, size, generation, crc, has_crc = ENTRY.unpack_from(body)
    key = body[ENTRY.size :].decode()
    return Entry(key, offset, size, generation, crc if has_crc else None)


def _next_magic(data: bytes, start: int) -> int:
    found = data.find(struct.pack("<I", MAGIC), start)
    return len(data) if found < 0 else found
