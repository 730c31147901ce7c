"""Page-aligned, resident buffers that direct I/O writes from (``O_DIRECT`` wants
block-aligned memory; a caller's buffer seldom is), a bounded number per process.

The node writes what it receives over the checked stream through them
(storage_node/direct_writes.py), and a client on the node's host writes an NVMe segment's
file through them (transport/shared_file.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading

from kvpool.transport.shared_memory import MADV_POPULATE_WRITE


class Bounce:
    """A page-aligned buffer, faulted in once and reused; ``address`` for zero-copy
    views of it (the checksum's)."""

    __slots__ = ("address", "memory")

    def __init__(self, size: int) -> None:
        self.memory = mmap.mmap(-1, size)
        with contextlib.suppress(OSError):  # (older kernels: faulted in by its first use)
            self.memory.madvise(MADV_POPULATE_WRITE)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.memory))


class BouncePool:
    """At most ``count`` bounce buffers of ``size`` bytes, made on first need and reused."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self._left = count
        self._free: list[Bounce] = []
        self._lock = threading.Lock()

    def take(self) -> Bounce | None:
        """A buffer, or None when all are in use (the caller writes another way)."""
        with self._lock:
            if self._free:
                return self._free.pop()
            if not self._left:
                return None
            self._left -= 1
        return Bounce(self.size)

    def give(self, bounce: Bounce) -> None:
        with self._lock:
            self._free.append(bounce)
