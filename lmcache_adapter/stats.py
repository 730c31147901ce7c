"""Counters of what the adapter did, for ``report_status`` (and tests that check a path)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class Stats:
    store_tasks: int = 0
    store_keys: int = 0
    stored_keys: int = 0
    store_failures: int = 0
    stored_bytes: int = 0
    lookup_tasks: int = 0
    lookup_keys: int = 0
    lookup_hits: int = 0
    lookup_failures: int = 0
    load_tasks: int = 0
    load_keys: int = 0
    load_hits: int = 0
    loaded_bytes: int = 0
    load_deadlines_missed: int = 0
    deleted_keys: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_store(self, keys: int, stored: int, failures: int, written: int) -> None:
        with self._lock:
            self.store_tasks += 1
            self.store_keys += keys
            self.stored_keys += stored
            self.store_failures += failures
            self.stored_bytes += written

    def count_lookup(self, keys: int, hits: int, *, failed: bool = False) -> None:
        with self._lock:
            self.lookup_tasks += 1
            self.lookup_keys += keys
            self.lookup_hits += hits
            self.lookup_failures += int(failed)

    def count_load(self, keys: int, hits: int, loaded: int, timed_out: bool) -> None:
        with self._lock:
            self.load_tasks += 1
            self.load_keys += keys
            self.load_hits += hits
            self.loaded_bytes += loaded
            self.load_deadlines_missed += int(timed_out)

    def count_delete(self, keys: int) -> None:
        with self._lock:
            self.deleted_keys += keys

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}
