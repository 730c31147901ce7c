"""Locks taken by lookup-and-lock: a count per key, and a master lease kept alive until unlock.

A lock is a kvpool read lease: while it lasts the master neither evicts nor (without force)
removes the object. Leases have a TTL, so a renewal thread re-leases, in one batch, every
locked key whose lease has less than half its TTL left, until ``unlock`` drops the key's last
lock. An object that vanished anyway (its last storage node died) stays counted until
unlocked but is no longer renewed; its load reports a miss. A renewal the master refuses for
another reason (the tenant's leases quota reached) is retried: the object is still there.

When a key's last lock goes, the same thread gives its lease back (``ReleaseLeases``, in
batches): an unlocked chunk must not stay pinned against eviction, nor count against its
tenant's leases quota, for up to ``ttl`` more. ``stop`` gives back the leases of every key
still locked. The master ends only the lease of the client that leased last, which is why
the control plane leases under the load client's id (``control.py``). A lookup leases and
locks under a gate that a release holds too, so a release never ends a lease that a lookup
took after the release chose its keys. A release that fails is not retried: those leases
run out by themselves, at most ``ttl`` later. Deletes remove with force, which the master
allows while someone else's lease lasts without reusing the space before it ends.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Sequence

from lmcache.logging import init_logger

from kvpool.common.log_throttle import LogThrottle
from kvpool.errors import ClientClosed, KVPoolError, MasterUnavailable
from kvpool.lmcache.control import ControlPlane, Leased

logger = init_logger(__name__)

RETRY_DELAY = 0.5
#: Deadline of a release: best effort (the leases run out anyway), and lookups wait for it.
RELEASE_TIMEOUT = 1.0


class LockTable:
    def __init__(self, control: ControlPlane, ttl: float, timeout: float) -> None:
        self._control = control
        self.ttl = ttl
        self._timeout = min(timeout, ttl / 4)
        self._release_timeout = min(timeout, RELEASE_TIMEOUT)
        self._counts: dict[str, int] = {}
        #: When the lease of each locked, still existing key ends (monotonic clock).
        self._lease_until: dict[str, float] = {}
        #: Keys whose last lock went, whose leases the renewal thread gives back (in order).
        self._releasing: dict[str, None] = {}
        self._retry_at = 0.0
        self._cond = threading.Condition()
        #: Held by a lookup from its lease to its lock, and by a release from choosing its
        #: keys to the master's answer (always taken before ``_cond``).
        self._gate = threading.Lock()
        self._stopping = False
        self.renewals = 0
        self.renewal_failures = 0
        self.released = 0
        self._log = LogThrottle(burst=1, interval=10.0)
        self._thread = threading.Thread(
            target=self._renew_loop, name="kvpool-lease-renewal", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ bookkeeping

    def lease_and_lock(self, keys: Sequence[str], timeout: float) -> Leased:
        """Leases ``keys`` (within ``timeout``) and locks each one found, with no release in
        between: a release under way is waited for (it is short), and raises
        ``MasterUnavailable`` if it outlasts ``timeout``."""
        started = time.monotonic()
        if not self._gate.acquire(timeout=max(timeout, 0.0)):
            raise MasterUnavailable(
                "giving lock leases back took longer than the lookup's deadline"
            )
        try:
            leased = self._control.lease(keys, self.ttl, timeout - (time.monotonic() - started))
            found = [key for key, size in zip(keys, leased.sizes, strict=True) if size is not None]
            self.lock(found, leased.until)
            return leased
        finally:
            self._gate.release()

    def lock(self, keys: Iterable[str], lease_until: float) -> None:
        """Counts one lock on each key, whose lease (just granted) lasts until ``lease_until``."""
        with self._cond:
            for key in keys:
                self._counts[key] = self._counts.get(key, 0) + 1
                self._lease_until[key] = max(self._lease_until.get(key, 0.0), lease_until)
                self._releasing.pop(key, None)  # its new lease stays
            self._cond.notify()

    def unlock(self, keys: Iterable[str]) -> None:
        """Drops one lock per key; keys not locked are ignored (unlock never fails). A key
        whose last lock went has its lease given back soon, by the renewal thread."""
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
                    self._releasing[key] = None
            if self._releasing:
                self._cond.notify()

    def is_locked(self, key: str) -> bool:
        with self._cond:
            return key in self._counts

    def locked_count(self) -> int:
        with self._cond:
            return len(self._counts)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Ends the renewals, then gives back every lease still held (locked keys, and
        unlocked ones not given back yet) within a short deadline."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        with self._cond:
            keys = [*self._counts, *self._releasing]
            self._counts.clear()
            self._lease_until.clear()
            self._releasing.clear()
        if keys:
            try:
                self.released += self._control.release(keys, self._release_timeout)
            except Exception as error:  # (closed, unreachable: the leases run out anyway)
                logger.debug("kvpool: could not give back %d lock lease(s): %s", len(keys), error)

    # ------------------------------------------------------------------ renewal and release

    def _renew_loop(self) -> None:
        while True:
            work = self._wait_for_work()
            if work is None:
                return
            due, releasing = work
            try:
                if releasing:
                    self._release_unlocked()
                if due:
                    self._renew(due)
            except ClientClosed:
                return

    def _release_unlocked(self) -> None:
        """Gives back the leases of keys unlocked since the last call (those locked again
        meanwhile keep theirs)."""
        with self._gate:
            with self._cond:
                keys, self._releasing = list(self._releasing), {}
            if not keys:
                return
            try:
                released = self._control.release(keys, self._release_timeout)
            except ClientClosed:
                raise
            except Exception as error:  # (KVPoolError, or a bug: the renewals must go on)
                self._warn("release", error, f"could not give back {len(keys)} lock lease(s)")
                self._retry_later(renewal=False)
                return
        with self._cond:
            self.released += released

    def _renew(self, due: list[str]) -> None:
        try:
            leased = self._control.lease(due, self.ttl, self._timeout)
            if len(leased.sizes) != len(due):
                raise KVPoolError(f"the master answered {len(leased.sizes)} of {len(due)} keys")
        except ClientClosed:
            raise
        except Exception as error:  # (KVPoolError, or a bug: the renewals must go on)
            self._warn("renew", error, f"could not renew {len(due)} lock lease(s)")
            self._retry_later()
            return
        refused: list[int] = []
        with self._cond:
            self.renewals += 1
            for i, key in enumerate(due):
                if key not in self._counts:
                    continue  # unlocked meanwhile
                if leased.sizes[i] is not None:
                    self._lease_until[key] = leased.until
                elif leased.gone(i):
                    self._lease_until.pop(key, None)  # gone: nothing left to hold
                else:
                    refused.append(i)  # still there (a quota): kept due, retried
        if refused:
            status = leased.statuses[refused[0]] if leased.statuses else "?"
            self._warn(
                "refused",
                KVPoolError(f"status {status} for {len(refused)} key(s)"),
                f"the master refused to renew {len(refused)} of {len(due)} lock lease(s)",
            )
            self._retry_later()

    def _retry_later(self, *, renewal: bool = True) -> None:
        """Calls the master again (renewals and releases) only after ``RETRY_DELAY``."""
        with self._cond:
            self.renewal_failures += int(renewal)
            self._retry_at = time.monotonic() + RETRY_DELAY

    def _warn(self, kind: str, error: Exception, what: str) -> None:
        """One line per kind and error class every 10 s: a master away for minutes fails a
        renewal every ``RETRY_DELAY``."""
        self._log.log(
            logger, (kind, type(error).__name__), "kvpool: %s: %s", what, error, stacklevel=2
        )

    def _wait_for_work(self) -> tuple[list[str], bool] | None:
        """Blocks until some lease needs renewing or giving back; returns the keys to renew
        and whether some are to be given back (None: stopping)."""
        margin = self.ttl / 2
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                earliest = min(self._lease_until.values(), default=math.inf) - margin
                if self._releasing:
                    earliest = min(earliest, now)
                wake_at = max(earliest, self._retry_at)
                if wake_at <= now:
                    due = [k for k, until in self._lease_until.items() if until - margin <= now]
                    return due, bool(self._releasing)
                self._cond.wait(None if math.isinf(wake_at) else wake_at - now)
            return None
