"""Tombstone records of a master that runs alone, in a file, so that a removal sticks across
its restart.

A lone master keeps its index in memory and rebuilds it from what the nodes report after a
restart. A node that was away when objects were removed (paused, cut off) may still list
them; the master that answered the removals refuses them at its next mount
(master/tombstones.py), but a restarted one would not know and adopt them again. With
``--tombstone-file PATH`` the master writes the segments' durable records there before it
answers (coalesced, as in etcd: master/record_writer.py) and reads them back when it starts.

The file is one JSON object, ``{"records": {segment id: record}}``, each record as etcd holds
one (master/tombstone_format.py's ``encode``), rewritten whole through a temporary file,
``fsync`` and ``rename``, so that a crash leaves the old file or the new one; it is created
readable by the master's user only (mode 0600: it names tenants' keys). Only the master
that runs alone writes it; two masters given the same file would overwrite each other's
records (with several masters the records live in etcd). A file that cannot be read stops
the master at start with what to do, rather than serve without its records.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import threading
import time
from pathlib import Path

from kvpool.common.file_writes import write_all
from kvpool.master.record_writer import WRITE_TIMEOUT, RecordOf, RecordWriter, log
from kvpool.master.tombstone_format import decode, encode
from kvpool.master.tombstones import MAX_AGE, DurableRecord

#: A new temporary file only (never one another user planted, nor a link), readable by this
#: master's user alone: the records name tenants' keys, as sensitive as their prompts.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Bytes the file may hold (records are bounded by tombstones.RECORD_BYTES each, and their
#: entries by tombstones.LIMIT in all).
MAX_FILE_BYTES = 1 << 30


class TombstoneFileError(Exception):
    """The tombstone file cannot be read: the master does not start."""


class TombstoneFile(RecordWriter):
    where = "the tombstone file"

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        #: segment id -> (when last written, its record): what the file holds.
        self._records: dict[str, tuple[float, DurableRecord]] = {}
        #: Writes run in threads, one at a time, and one that timed out may still be under
        #: way when the next starts: a write older than the last one done is dropped.
        self._replacing = threading.Lock()
        self._numbers = itertools.count(1)
        self._replaced = 0

    async def load(self) -> dict[str, DurableRecord]:
        """The records in the file (none when there is no file yet; those past MAX_AGE
        dropped), written back at once: a path this master cannot write is found at its
        start, not at the first removal that needs it. Raises TombstoneFileError when the
        file cannot be read or written."""
        self._records = await asyncio.to_thread(self._read)
        now = time.time()
        self._records = {
            segment: (at, record)
            for segment, (at, record) in self._records.items()
            if now - at <= MAX_AGE
        }
        try:
            await asyncio.to_thread(self._replace, self._content(self._records), 0)
        except OSError as error:
            raise TombstoneFileError(
                f"cannot write the tombstone file {self.path} ({error.strerror or error}): "
                "give --tombstone-file a path in a directory this master may write"
            ) from None
        return {segment: record for segment, (_, record) in self._records.items()}

    @staticmethod
    def _content(records: dict[str, tuple[float, DurableRecord]]) -> bytes:
        return b'{"records":{%s}}' % b",".join(
            json.dumps(segment).encode() + b":" + encode(record, at)
            for segment, (at, record) in sorted(records.items())
        )

    def _read(self) -> dict[str, tuple[float, DurableRecord]]:
        advice = (
            "move it away to start without it (objects removed while their node was away may "
            "then come back), or give --tombstone-file another path"
        )
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                raise TombstoneFileError(
                    f"the tombstone file {self.path} is over {MAX_FILE_BYTES} bytes: {advice}"
                )
            text = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as error:
            raise TombstoneFileError(
                f"cannot read the tombstone file {self.path}: {error.strerror}: {advice}"
            ) from None
        try:
            records = json.loads(text)["records"]
            if not isinstance(records, dict):
                raise ValueError("its records are not an object")
            return {
                str(segment): decode(json.dumps(fields).encode())
                for segment, fields in records.items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise TombstoneFileError(
                f"the tombstone file {self.path} is not one a master wrote ({error}): {advice}"
            ) from None

    async def _write_now(self, segment_ids: set[str], record_of: RecordOf) -> bool:
        now = time.time()
        records = dict(self._records)
        for segment_id in segment_ids:
            record = record_of(segment_id)
            if record is None:
                records.pop(segment_id, None)
            else:
                records[segment_id] = (now, record)
        content = self._content(records)
        try:
            await asyncio.wait_for(
                asyncio.to_thread(self._replace, content, next(self._numbers)), WRITE_TIMEOUT
            )
        except (OSError, TimeoutError) as error:
            log.warning(
                "tombstone records not written",
                path=str(self.path),
                error=str(error) or type(error).__name__,
            )
            return False
        self._records = records
        return True

    def _replace(self, content: bytes, number: int) -> None:
        """Replaces the file with ``content`` (write ``number``): the old file or the new one
        after a crash."""
        with self._replacing:
            if number < self._replaced:
                return  # (a newer write is on the disk)
            temporary = self.path.with_name(self.path.name + ".tmp")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)  # (left by a crash; a link planted there is not followed)
            descriptor = os.open(temporary, _CREATE, 0o600)
            try:
                write_all(descriptor, content)
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            os.replace(temporary, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
            self._replaced = number
