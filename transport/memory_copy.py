"""Memory copies for mapped segments: cut into pieces, each started only before a deadline,
and shared with a helper thread when there is enough to copy.

One thread does not saturate memory bandwidth: a large copy runs faster on two threads than
on one. ``ctypes.memmove`` releases the GIL, so a helper thread copies in parallel with the
caller. Below ``PARALLEL_MIN`` bytes the hand-off (a thread wake-up) would cost more than it
saves, and the caller copies alone.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kvpool.common.helper_threads import Helpers

#: A copy checks its deadline before each piece of this size: a missed deadline stops it
#: within one piece.
PIECE = 4 << 20
#: Copies of at least this many bytes in all are shared with the helper thread.
PARALLEL_MIN = 8 << 20


@dataclass(frozen=True, slots=True)
class Copy:
    target: int
    source: int
    length: int


class Copier:
    """Runs batches of copies on the calling thread and up to ``threads - 1`` helpers."""

    def __init__(self, threads: int = 2) -> None:
        if threads < 1:
            raise ValueError(f"a copier needs at least one thread, got {threads}")
        self.threads = threads
        self._helpers: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, copies: Sequence[Copy], deadline: float) -> list[bool]:
        """Copies everything it can start before ``deadline`` (time.monotonic); entry i is
        False when copy i was not completed. Returns, or raises (an interrupt included),
        only once every helper has stopped touching the memory."""
        total = sum([copy.length for copy in copies])
        if self.threads == 1 or total < PARALLEL_MIN:
            return _run_alone(copies, deadline)
        pieces = [
            (index, copy.target + offset, copy.source + offset, min(PIECE, copy.length - offset))
            for index, copy in enumerate(copies)
            for offset in range(0, copy.length, PIECE)
        ]
        done = [True] * len(copies)
        next_piece = itertools.count()  # next() is atomic under the GIL: a shared work queue
        helpers = Helpers(self._pool()) if len(pieces) > 1 else None

        def work() -> None:
            for number in next_piece:
                if number >= len(pieces):
                    return
                index, target, source, length = pieces[number]
                if (helpers is not None and helpers.stopped) or time.monotonic() >= deadline:
                    done[index] = False
                    continue
                ctypes.memmove(target, source, length)

        if helpers is None:
            work()
            return done
        try:
            with helpers:  # (an interrupt is raised once no helper touches the memory)
                for _ in range(min(self.threads, len(pieces)) - 1):
                    helpers.submit(work)
                work()
        except BaseException:
            helpers.stop_and_wait()  # (see Helpers: an interrupt as the block ended)
            raise
        for helper in helpers.futures:
            helper.result()
        return done

    def close(self) -> None:
        with self._lock:
            if self._helpers is not None:
                self._helpers.shutdown(wait=True)
                self._helpers = None

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._helpers is None:
                self._helpers = ThreadPoolExecutor(
                    self.threads - 1, thread_name_prefix="kvpool-copy"
                )
            return self._helpers


def _run_alone(copies: Sequence[Copy], deadline: float) -> list[bool]:
    """``Copier.run`` on the calling thread alone (a batch too small to share): the same
    pieces, each started only before ``deadline``, without the shared work queue (a batch of
    small copies, such as 32 objects of 4 KiB, spent more on that than on copying)."""
    done = [True] * len(copies)
    memmove, monotonic = ctypes.memmove, time.monotonic
    for index, copy in enumerate(copies):
        target, source, length = copy.target, copy.source, copy.length
        for offset in range(0, length, PIECE):
            if monotonic() >= deadline:
                done[index] = False
                break
            memmove(target + offset, source + offset, min(PIECE, length - offset))
    return done
