"""Log lines a peer can cause, at a bounded rate.

A storage node logs each transfer it refuses, and a peer decides how many it sends: without a
bound, a hostile or broken client fills the node's disk and drowns the lines that matter.
``LogThrottle`` lets through at most ``burst`` lines per key every ``interval`` seconds and
counts the rest; the next line let through for that key carries how many were dropped
(``suppressed``). Counters in /metrics still count every event. Keys are the caller's
constants (an event and a status), so the table stays small; it is bounded anyway.
Thread-safe; the clock is injected (tests).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

#: Keys kept at most (older ones are forgotten first).
MAX_KEYS = 256


class LogThrottle:
    def __init__(
        self, burst: int = 10, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        #: key -> [window start, lines let through in it, lines dropped since the last one]
        self._windows: dict[Hashable, list[float]] = {}

    def allow(self, key: Hashable) -> int | None:
        """None: drop this line. Else log it, with the returned count of lines dropped for
        ``key`` since the last one let through (0: none)."""
        now = self._clock()
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window[0] >= self.interval:
                dropped = int(window[2]) if window is not None else 0
                if window is None and len(self._windows) >= MAX_KEYS:
                    del self._windows[next(iter(self._windows))]
                self._windows[key] = [now, 1, 0]
                return dropped
            if window[1] < self.burst:
                window[1] += 1
                dropped, window[2] = int(window[2]), 0
                return dropped
            window[2] += 1
            return None

    def log(
        self,
        logger: Any,
        key: Hashable,
        message: str,
        *args: object,
        level: int = logging.WARNING,
        stacklevel: int = 1,
    ) -> None:
        """``logger.log(level, message, *args)`` (a stdlib logger: %-style arguments) unless
        ``allow(key)`` drops it; a line let through says how many of ``key`` were dropped
        before it. ``stacklevel`` as ``logging``'s, counted from the caller: a helper that
        logs for its own callers passes 2, so that the line names where they called it."""
        dropped = self.allow(key)
        if dropped is not None:
            # (stacklevel: the line names the caller's file and line, as engines' formats show)
            logger.log(
                level, message + "%s", *args, dropped_since(dropped), stacklevel=stacklevel + 1
            )


def dropped_since(dropped: int) -> str:
    """What a line let through says of the lines dropped before it ('' for none)."""
    return f" ({dropped} more since the last such line)" if dropped else ""
