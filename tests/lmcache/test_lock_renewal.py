"""The renewal thread of the adapter's locks (lmcache_adapter/locks.py) outlives any error
one renewal meets: locked objects keep their leases as long as they are locked.

The master's side of a renewal is a GetReplicas, covered by the contract tests against a
real cluster; here the control plane is a recorder that fails as told, to reach errors no
healthy master gives (an answer that does not parse, one of the wrong length).
"""

from __future__ import annotations

import threading
import time

import pytest
from google.protobuf.message import DecodeError
from helpers import wait_until

from kvpool.common.status import KeyStatus
from kvpool.errors import ClientClosed
from kvpool.lmcache.control import Leased
from kvpool.lmcache.locks import LockTable


class FailingControl:
    """Answers every lease with each key found, after failing the first ones as told."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = list(failures)
        self.calls = 0
        self.lock = threading.Lock()

    def lease(self, keys, ttl, timeout) -> Leased:
        with self.lock:
            self.calls += 1
            if self.failures:
                raise self.failures.pop(0)
        return Leased([4096] * len(keys), time.monotonic() + ttl)


class ShortAnswer(FailingControl):
    def lease(self, keys, ttl, timeout) -> Leased:
        with self.lock:
            self.calls += 1
        return Leased([], time.monotonic() + ttl)


@pytest.mark.parametrize(
    "error",
    [DecodeError("garbled"), ValueError("zip() argument 2 is shorter"), RuntimeError("bug")],
    ids=["does not parse", "value error", "runtime error"],
)
def test_an_unexpected_error_in_one_renewal_does_not_end_the_renewals(error):
    control = FailingControl([error])
    table = LockTable(control, ttl=0.4, timeout=1.0)
    try:
        table.lock(["k"], time.monotonic() + 0.4)
        assert wait_until(lambda: table.renewals >= 2, timeout=10)
        assert table.alive()
        assert table.renewal_failures == 1
    finally:
        table.stop()


def test_an_answer_for_fewer_keys_than_asked_is_a_failed_renewal_not_a_dead_thread():
    control = ShortAnswer([])
    table = LockTable(control, ttl=0.4, timeout=1.0)
    try:
        table.lock(["a", "b"], time.monotonic() + 0.4)
        assert wait_until(lambda: table.renewal_failures >= 2, timeout=10)
        assert table.alive()
    finally:
        table.stop()


def test_a_closed_client_ends_the_renewals():
    control = FailingControl([ClientClosed("the client is closed")])
    table = LockTable(control, ttl=0.4, timeout=1.0)
    table.lock(["k"], time.monotonic() + 0.4)
    assert wait_until(lambda: not table.alive(), timeout=10)
    assert control.calls == 1
    table.stop()


class RefusingControl(FailingControl):
    """Refuses the first renewals for the tenant's leases quota (the object is still
    there), then grants them; records the keys given back."""

    def __init__(self, refusals: int) -> None:
        super().__init__([])
        self.refusals = refusals
        self.granted = 0
        self.released: list[str] = []

    def lease(self, keys, ttl, timeout) -> Leased:
        with self.lock:
            self.calls += 1
            if self.refusals:
                self.refusals -= 1
                until = time.monotonic() + ttl
                return Leased([None] * len(keys), until, [KeyStatus.QUOTA_EXCEEDED] * len(keys))
            self.granted += 1
        return Leased([4096] * len(keys), time.monotonic() + ttl, [KeyStatus.OK] * len(keys))

    def release(self, keys, timeout) -> int:
        with self.lock:
            self.released.extend(keys)
        return len(keys)


def test_a_renewal_refused_for_a_quota_is_retried_not_given_up():
    # Only NOT_FOUND means the object is gone; a refused lease is retried until granted.
    control = RefusingControl(refusals=2)
    table = LockTable(control, ttl=0.4, timeout=1.0)
    try:
        table.lock(["k"], time.monotonic() + 0.4)
        assert wait_until(lambda: control.granted >= 2, timeout=10)
        assert table.renewal_failures == 2
    finally:
        table.stop()


def test_the_last_unlock_gives_the_lease_back_and_stop_gives_back_the_rest():
    control = RefusingControl(refusals=0)
    table = LockTable(control, ttl=30.0, timeout=1.0)
    try:
        until = time.monotonic() + 30
        table.lock(["a", "b", "c"], until)
        table.lock(["a"], until)
        table.unlock(["a", "b"])  # a: one lock left
        assert wait_until(lambda: control.released == ["b"], timeout=5)
        table.unlock(["a"])
        assert wait_until(lambda: control.released == ["b", "a"], timeout=5)
        table.unlock(["a"])  # not locked: nothing to give back again
        time.sleep(0.2)
        assert control.released == ["b", "a"]
    finally:
        table.stop()
    assert control.released == ["b", "a", "c"]  # c was still locked
