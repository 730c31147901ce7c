"""What the kvpool tier did, counted on its own threads and read from any thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class TierStats:
    store_jobs: int = 0
    chunks_stored: int = 0
    chunks_already_stored: int = 0
    chunks_not_stored: int = 0
    bytes_stored: int = 0
    load_jobs: int = 0
    chunks_loaded: int = 0
    chunks_not_loaded: int = 0
    bytes_loaded: int = 0
    load_deadlines_missed: int = 0
    lookups: int = 0
    lookup_hits: int = 0
    lookup_failures: int = 0
    #: Keys kvpool answered a lookup of with an error (a quota, an invalid key): misses.
    lookups_refused: int = 0
    #: Jobs failed without running: their deadline passed in the queue ("expired"), or the
    #: master had just not answered a call ("unasked": ``common/master_stall.py``).
    jobs_expired: int = 0
    jobs_unasked: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_store(
        self, new: int, existing: int, failed: int, written: int, skipped: str = ""
    ) -> None:
        with self._lock:
            self.store_jobs += 1
            self._skipped(skipped)
            self.chunks_stored += new
            self.chunks_already_stored += existing
            self.chunks_not_stored += failed
            self.bytes_stored += written

    def count_load(
        self, loaded: int, failed: int, read: int, late: bool, skipped: str = ""
    ) -> None:
        with self._lock:
            self.load_jobs += 1
            self._skipped(skipped)
            self.chunks_loaded += loaded
            self.chunks_not_loaded += failed
            self.bytes_loaded += read
            self.load_deadlines_missed += late

    def count_lookup(self, asked: int, hits: int, failed: bool = False, refused: int = 0) -> None:
        with self._lock:
            self.lookups += asked
            self.lookup_hits += hits
            self.lookup_failures += failed
            self.lookups_refused += refused

    def _skipped(self, reason: str) -> None:
        """(Under the lock.)"""
        if reason == "expired":
            self.jobs_expired += 1
        elif reason == "unasked":
            self.jobs_unasked += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}
