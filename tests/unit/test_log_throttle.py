"""Log lines a peer can cause pass at a bounded rate, and say how many were dropped."""

from __future__ import annotations

from state_helpers import FakeClock

from kvpool.common.log_throttle import MAX_KEYS, LogThrottle


def test_a_burst_passes_then_lines_are_dropped_and_counted_until_the_window_ends():
    clock = FakeClock()
    throttle = LogThrottle(burst=3, interval=10.0, clock=clock)
    assert [throttle.allow("refused") for _ in range(3)] == [0, 0, 0]
    assert [throttle.allow("refused") for _ in range(5)] == [None] * 5
    clock.advance(10.0)
    assert throttle.allow("refused") == 5, "the next line says how many were dropped"
    assert throttle.allow("refused") == 0


def test_keys_are_throttled_apart_and_the_table_stays_bounded():
    clock = FakeClock()
    throttle = LogThrottle(burst=1, interval=10.0, clock=clock)
    assert throttle.allow(("read", "EXPIRED")) == 0
    assert throttle.allow(("read", "EXPIRED")) is None
    assert throttle.allow(("write", "FORGED")) == 0, "another key has its own budget"
    for n in range(MAX_KEYS * 2):
        throttle.allow(n)
    assert len(throttle._windows) <= MAX_KEYS
