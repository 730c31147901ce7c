"""Log lines a peer can cause pass at a bounded rate, and say how many were dropped."""

from __future__ import annotations

import inspect
import logging

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


def test_a_throttled_log_line_says_how_many_of_its_kind_were_dropped(caplog):
    clock = FakeClock()
    throttle = LogThrottle(burst=1, interval=10.0, clock=clock)
    logger = logging.getLogger("kvpool.test.throttle")
    with caplog.at_level(logging.INFO, logger=logger.name):
        for _ in range(3):
            throttle.log(logger, ("put", "Timeout"), "put failed: %s", "no answer")
        clock.advance(10.0)
        throttle.log(logger, ("put", "Timeout"), "put failed: %s", "no answer", level=logging.INFO)
    assert {r.filename for r in caplog.records} == {"test_log_throttle.py"}, "the caller's"

    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "put failed: no answer"),
        (logging.INFO, "put failed: no answer (2 more since the last such line)"),
    ]


def test_a_helper_that_logs_for_its_callers_names_their_line(caplog):
    throttle = LogThrottle(burst=1, interval=10.0, clock=FakeClock())
    logger = logging.getLogger("kvpool.test.throttle")

    def warn(message: str) -> None:  # (as the adapters' _warn: stacklevel 2)
        throttle.log(logger, message, message, stacklevel=2)

    with caplog.at_level(logging.INFO, logger=logger.name):
        warn("from the helper's caller")
        line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    assert [(r.filename, r.lineno) for r in caplog.records] == [("test_log_throttle.py", line)]
