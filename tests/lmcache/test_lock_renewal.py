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
