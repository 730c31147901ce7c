"""A node tells how far its wall clock is from the master's (storage_node/clock_offset.py):
capabilities carry the master's time, and the node checks them against its own."""

from __future__ import annotations

import pytest

from kvpool.storage_node.clock_offset import WARN_EVERY, ClockOffset

ALLOWED_MS = 1000


def test_the_offset_is_taken_at_the_middle_of_the_round_trip():
    clocks = ClockOffset()
    estimate = clocks.heard(100.0, 100.2, master_time_ms=95_100, allowed_ms=ALLOWED_MS)
    assert estimate is not None
    assert estimate.offset == pytest.approx(5.0)
    assert estimate.uncertainty == pytest.approx(0.1)
    assert estimate.too_far


def test_an_offset_within_the_round_trips_doubt_is_not_called_too_far():
    """1.05 s off but with 0.1 s of doubt either way: it may be within the 1 s allowed."""
    estimate = ClockOffset().heard(10.0, 10.2, master_time_ms=9_050, allowed_ms=ALLOWED_MS)
    assert estimate is not None and not estimate.too_far


def test_a_node_behind_the_master_is_too_far_as_well():
    estimate = ClockOffset().heard(10.0, 10.0, master_time_ms=70_000, allowed_ms=ALLOWED_MS)
    assert estimate is not None and estimate.offset == pytest.approx(-60.0)
    assert estimate.too_far


def test_a_master_that_sends_no_time_or_a_clock_set_back_gives_no_estimate():
    clocks = ClockOffset()
    assert clocks.heard(10.0, 10.1, master_time_ms=0, allowed_ms=ALLOWED_MS) is None
    assert clocks.heard(10.0, 9.0, master_time_ms=10_000, allowed_ms=ALLOWED_MS) is None
    assert clocks.latest is None and clocks.warn(0.0) is None


def test_a_warning_once_then_every_so_often_and_a_word_when_it_is_over():
    clocks = ClockOffset()
    clocks.heard(100.0, 100.0, master_time_ms=40_000, allowed_ms=ALLOWED_MS)
    assert clocks.warn(0.0) == "too_far"
    assert clocks.warn(1.0) is None
    assert clocks.warn(WARN_EVERY) == "too_far"
    clocks.heard(100.0, 100.0, master_time_ms=100_000, allowed_ms=ALLOWED_MS)
    assert clocks.warn(WARN_EVERY + 1) == "back_in_range"
    assert clocks.warn(WARN_EVERY + 2) is None
