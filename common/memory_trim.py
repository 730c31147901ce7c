"""Handing freed memory back to the system once a process's resident memory has grown.

glibc's allocator keeps what a process frees in its heaps for later use, and gives back only
what lies at a heap's top: memory freed in the middle of a heap, or in the heaps of other
threads (gRPC's), stays resident until ``malloc_trim`` releases its pages. So a master that
served a burst of large calls (a batch near the limit, a node's inventory after a failover)
stays at its peak resident size although nothing holds that memory any more, which is what an
operator sees and what a container's memory limit counts.

``TrimRule`` (pure: the caller passes the time and reads the resident size) says when to trim:
at most every ``every`` seconds it looks at the resident size, and once that has grown by
``growth`` since the last trim (or the start), it is time. ``malloc_trim`` walks every free
chunk: on a large fragmented heap that takes tens of milliseconds, so the master runs it on a
worker thread (ctypes lets go of the interpreter lock meanwhile). Where the C library is not
glibc there is nothing to call and nothing is trimmed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

#: Growth of the resident size since the last trim that calls for another.
GROWTH = 64 << 20
#: Seconds between looks at the resident size.
EVERY = 10.0


class TrimRule:
    """When to trim: the resident size grew by ``growth`` since the last trim (or the first
    look), looked at no more often than every ``every`` seconds."""

    def __init__(self, growth: int = GROWTH, every: float = EVERY) -> None:
        self.growth = growth
        self.every = every
        self._floor: int | None = None
        self._next_look = float("-inf")

    def due(self, now: float, resident: Callable[[], int]) -> bool:
        """Whether to trim now (``resident`` is read only when it is time to look)."""
        if now < self._next_look:
            return False
        self._next_look = now + self.every
        size = resident()
        if self._floor is None or size < self._floor:
            self._floor = size
            return False
        return size - self._floor >= self.growth

    def trimmed(self, resident_after: int) -> None:
        """A trim ended with ``resident_after`` bytes resident: growth counts from there."""
        self._floor = resident_after


def resident_bytes() -> int:
    """This process's resident memory (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> Callable[[], None] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None  # not glibc
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def trim_all() -> None:
        trim(0)

    return trim_all


#: glibc's ``malloc_trim(0)``, or None where the C library has none.
malloc_trim = _malloc_trim()
