"""Direct I/O's parts that the node and a client on its host share: a descriptor opened
with ``O_DIRECT`` whose direct writes a file system may turn down (``DirectFile``), and
page-aligned, resident buffers to write from (``O_DIRECT`` wants block-aligned memory; a
caller's buffer seldom is), a bounded number per process (``BouncePool``).

The node writes what it receives over the checked stream through them
(storage_node/direct_writes.py), and a client on the node's host writes an NVMe segment's
file through them (transport/shared_file.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import threading

from kvpool.common.file_writes import write_all
from kvpool.common.logging import get_logger
from kvpool.transport.shared_memory import MADV_POPULATE_WRITE

log = get_logger("kvpool.direct_io")


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

    def after_fork_in_child(self) -> None:
        """Another thread of the parent may have held the lock at the fork (never let go
        here); the buffers it had taken stay taken."""
        self._lock = threading.Lock()


class DirectFile:
    """A file opened for direct I/O. ``usable`` turns False, for good, the first time the
    file system turns a direct write down after all (``EINVAL``: an alignment it wants
    larger); callers then write ``fallback`` (said in the log), and so does every later
    write."""

    def __init__(self, fd: int, fallback: str) -> None:
        self.fd = fd
        self.fallback = fallback
        #: False once the file system turned a direct write down.
        self.usable = True

    def write(self, data: memoryview, offset: int) -> bool:
        """Writes ``data`` (block-aligned memory and length) at ``offset`` (block aligned);
        False, writing nothing more, where direct writes are (or now turn out) refused."""
        if not self.usable:
            return False
        try:
            write_all(self.fd, data, offset)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            self.usable = False
            log.warning(f"direct writes turned down: writing {self.fallback}", error=str(error))
            return False
        return True

    def read(self, into: memoryview, offset: int) -> int | None:
        """Reads into ``into`` (block-aligned memory and length) from ``offset`` (block
        aligned) up to its end or the file's; the bytes read, or None where the file system
        turns direct reads down (``EINVAL``): the caller reads another way."""
        if not self.usable:
            return None
        done = 0
        try:
            while done < len(into):
                got = os.preadv(self.fd, [into[done:]], offset + done)
                if not got:
                    break
                done += got
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            return None
        return done

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
