"""Locks taken by lookup-and-lock: a count per key, and a master lease kept alive until unlock.

A lock is a kvpool read lease: while it lasts the master neither evicts nor (without force)
removes the object. Leases have a TTL, so a renewal thread re-leases, in one batch, every
locked key whose lease has less than half its TTL left, until ``submit_unlock`` drops the
key's last lock. An object that vanished anyway (its last storage node died) stays counted
until unlocked but is no longer renewed; its load reports a miss.

kvpool has no call that ends a lease early: after the last unlock the lease simply runs out
(at most ``ttl`` later). Deletes therefore remove with force, which the master allows while a
lease lasts without ever reusing the space before the lease ends.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable

from lmcache.logging import init_logger

from kvpool.errors import ClientClosed, KVPoolError
from kvpool.lmcache.control import ControlPlane

logger = init_logger(__name__)

RETRY_DELAY = 0.5


class LockTable:
    def __init__(self, control: ControlPlane, ttl: float, timeout: float) -> None:
        self._control = control
        self.ttl = ttl
        self._timeout = min(timeout, ttl / 4)
        self._counts: dict[str, int] = {}
        #: When the lease of each locked, still existing key ends (monotonic clock).
        self._lease_until: dict[str, float] = {}
        self._retry_at = 0.0
        self._cond = threading.Condition()
        self._stopping = False
        self.renewals = 0
        self.renewal_failures = 0
        self._thread = threading.Thread(
            target=self._renew_loop, name="kvpool-lease-renewal", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ bookkeeping

    def lock(self, keys: Iterable[str], lease_until: float) -> None:
        """Counts one lock on each key, whose lease (just granted) lasts until ``lease_until``."""
        with self._cond:
            for key in keys:
                self._counts[key] = self._counts.get(key, 0) + 1
                self._lease_until[key] = max(self._lease_until.get(key, 0.0), lease_until)
            self._cond.notify()

    def unlock(self, keys: Iterable[str]) -> None:
        """Drops one lock per key; keys not locked are ignored (unlock never fails)."""
        with self._cond:
            for key in keys:
                count = self._counts.get(key)
                if count is None:
                    continue
                if count > 1:
                    self._counts[key] = count - 1
                else:
                    del self._counts[key]
                    self._lease_until.pop(key, None)

    def is_locked(self, key: str) -> bool:
        with self._cond:
            return key in self._counts

    def locked_count(self) -> int:
        with self._cond:
            return len(self._counts)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        with self._cond:
            self._counts.clear()
            self._lease_until.clear()

    # ------------------------------------------------------------------ renewal

    def _renew_loop(self) -> None:
        while True:
            due = self._wait_for_due()
            if due is None:
                return
            try:
                leased = self._control.lease(due, self.ttl, self._timeout)
                if len(leased.sizes) != len(due):
                    raise KVPoolError(f"the master answered {len(leased.sizes)} of {len(due)} keys")
            except ClientClosed:
                return
            except Exception as error:  # (KVPoolError, or a bug: the renewals must go on)
                logger.warning("kvpool: could not renew %d lock lease(s): %s", len(due), error)
                with self._cond:
                    self.renewal_failures += 1
                    self._retry_at = time.monotonic() + RETRY_DELAY
                continue
            with self._cond:
                self.renewals += 1
                for key, size in zip(due, leased.sizes, strict=True):
                    if key not in self._counts:
                        continue  # unlocked meanwhile
                    if size is None:
                        self._lease_until.pop(key, None)  # gone: nothing left to hold
                    else:
                        self._lease_until[key] = leased.until

    def _wait_for_due(self) -> list[str] | None:
        """Blocks until some lease needs renewing; returns those keys (None: stopping)."""
        margin = self.ttl / 2
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                earliest = min(self._lease_until.values(), default=math.inf)
                wake_at = max(earliest - margin, self._retry_at)
                if wake_at <= now:
                    return [k for k, until in self._lease_until.items() if until - margin <= now]
                self._cond.wait(None if math.isinf(wake_at) else wake_at - now)
            return None
