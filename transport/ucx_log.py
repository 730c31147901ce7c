"""UCX's own log lines, in kvpool's structured log instead of on the caller's terminal.

UCX prints what goes wrong inside it (``mm_sysv.c:61 UCX ERROR shmat(...) failed`` each time
an endpoint to a same-host node that died is tried) straight onto the process's stdout. In a
client that is the application's output, and kvpool already turns the failure into an
exception (or a retry). So a handler in front of UCX's own (``ucp_helpers.c``) keeps each
message in a bounded ring, and a thread here moves them into structlog (logger
``kvpool.ucx``) at a level that says what they mean to a kvpool user: UCX errors as
warnings, UCX warnings as info, anything finer as debug. A storm of one message (every put
to a dead node) is rate-limited: at most ``BURST`` lines per source line of UCX per
``WINDOW`` seconds, the next one that gets through saying how many were left out (the ring
itself keeps only a few messages of one source line at a time, counting the others, so that a
storm leaves room for other messages).

Set ``UCX_LOG_FILE`` to have UCX write its lines where it is told as well (UCX's own
debugging); ``UCX_LOG_LEVEL`` still decides which messages UCX produces (default: warnings).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import libucx

from kvpool.common.logging import get_logger

libucx.load_library()

from kvpool.transport._ucp_cffi import ffi, lib  # noqa: E402  (needs libucp loaded first)

log = get_logger("kvpool.ucx")

#: Lines logged per UCX source line per window; the rest are counted.
BURST = 5
WINDOW = 10.0
#: Source lines whose counts are kept (the oldest is forgotten beyond that).
MAX_SOURCES = 256
#: UCX's level names (ucs_log_level_t), and the structlog method each one maps to.
UCX_LEVELS = ("FATAL", "ERROR", "WARN", "DIAG", "INFO", "DEBUG", "TRACE")
_METHODS = {"FATAL": "error", "ERROR": "warning", "WARN": "info"}
_TAKE = 32  # entries moved out of the ring per call


@dataclass(slots=True)
class _Source:
    window_start: float
    logged: int = 0
    suppressed: int = 0


@dataclass
class RateLimit:
    """At most ``burst`` messages per source per ``window`` seconds."""

    burst: int = BURST
    window: float = WINDOW
    clock: Callable[[], float] = time.monotonic
    max_sources: int = MAX_SOURCES
    _sources: dict[str, _Source] = field(default_factory=dict)

    def admit(self, source: str) -> tuple[bool, int]:
        """Whether a message from ``source`` is logged now, and how many of its messages were
        left out since its last logged one (to say so with this one)."""
        now = self.clock()
        state = self._sources.get(source)
        if state is None:
            if len(self._sources) >= self.max_sources:
                del self._sources[next(iter(self._sources))]
            state = self._sources[source] = _Source(now)
        elif now - state.window_start >= self.window:
            state.window_start, state.logged = now, 0
        if state.logged >= self.burst:
            state.suppressed += 1
            return False, 0
        state.logged += 1
        suppressed, state.suppressed = state.suppressed, 0
        return True, suppressed

    def left_out(self, source: str, count: int) -> None:
        """``count`` messages from ``source`` were not kept at all (the ring held enough of
        its lines): the next one logged says so."""
        state = self._sources.get(source)
        if state is not None:
            state.suppressed += count


class _Router:
    """Owns the ring's wake-up pipe and the thread that drains it."""

    def __init__(self) -> None:
        self.limit = RateLimit()
        self._lock = threading.Lock()
        self._entries = ffi.new("kv_log_entry_t[]", _TAKE)
        self._dropped = ffi.new("uint64_t *")
        self._wake_r = self._wake_w = -1
        self._start()

    def _start(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        lib.kv_log_install(self._wake_w, int("UCX_LOG_FILE" in os.environ))
        thread = threading.Thread(target=self._run, args=(self._wake_r,), name="ucx-log")
        thread.daemon = True
        thread.start()

    def after_fork_in_child(self) -> None:
        """The thread did not survive the fork (and the ring may hold the parent's lines)."""
        self._lock = threading.Lock()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._start()

    def _run(self, wake_r: int) -> None:
        while True:
            try:
                if not os.read(wake_r, 4096):
                    return
            except OSError:
                return  # closed after a fork (in the child, where this thread is gone anyway)
            self.drain()

    def drain(self) -> None:
        """Moves every message waiting in the ring into the structured log."""
        with self._lock:
            while True:
                n = lib.kv_log_take(self._entries, _TAKE, self._dropped)
                dropped = self._dropped[0]
                if dropped:
                    log.warning(
                        "ucx messages dropped",
                        count=dropped,
                        why="UCX logged faster than they could be kept",
                    )
                for entry in self._entries[0:n]:
                    self._log(entry)
                if n < _TAKE:
                    return

    def _log(self, entry: Any) -> None:
        level = UCX_LEVELS[min(entry.level, len(UCX_LEVELS) - 1)]
        source = f"{_text(entry.file)}:{entry.line}"
        logged, suppressed = self.limit.admit(source)
        self.limit.left_out(source, entry.repeats)
        if not logged:
            return
        fields: dict[str, Any] = {"detail": _text(entry.text), "ucx_level": level, "source": source}
        if suppressed:
            fields["suppressed"] = suppressed  # since the last line logged from this source
        getattr(log, _METHODS.get(level, "debug"))("ucx reported", **fields)


def _text(chars: Any) -> str:
    return ffi.string(chars).decode(errors="replace")


_ROUTER = _Router()
os.register_at_fork(after_in_child=_ROUTER.after_fork_in_child)
atexit.register(_ROUTER.drain)  # what UCX said just before the process ends


def drain() -> None:
    """Logs what UCX has said so far, now (the thread does so soon in any case)."""
    _ROUTER.drain()


def emit(level: str, text: str, line: int = 0) -> None:
    """Logs ``text`` through UCX's own log dispatch at UCX level ``level``, as from source line
    ``line`` of ``kv_log_emit.c`` (for tests)."""
    lib.kv_log_emit(UCX_LEVELS.index(level), line, text.encode())
