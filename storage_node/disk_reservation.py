"""Every block of an NVMe segment's file allocated on its disk when the node starts.

A sparse segment file takes blocks from its file system as objects are first written into
it, so the file system can fill up under it: with other files, other nodes' segments, or a
segment declared larger than its disk. A write into a hole then fails for space, long after
the node started and the master counted the segment's bytes as free, and every put placed
there fails until someone frees space. Reserving the whole file at start moves that failure
to the one moment an operator is watching: the node refuses to start and says how much room
its disk has. Once reserved, nothing the node does gives a block back (a removed object's
blocks are reused by the next object placed there), so no write into the segment can fail
for space, and the master need not ask the node to allocate a put's blocks ahead of its
write (``space_reserved`` in the segment's descriptor: no Prepare).

``fallocate(2)`` with mode 0 allocates unwritten extents (no data is written, reads of them
return zeros), in milliseconds per GiB on ext4 and XFS. It is called directly rather than
through ``posix_fallocate``, whose C library fallback writes a byte into every block where
the file system has no ``fallocate`` (hours for a large segment): such a file system is
reported, and the segment stays sparse, as it does with ``--nvme-sparse``.
"""

from __future__ import annotations

import ctypes
import errno
import os

from kvpool.common.libc import LIBC
from kvpool.common.sizes import format_size

_fallocate = LIBC.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


class DiskTooSmall(Exception):
    """The segment's file system has no room for the whole segment."""


def reserve(fd: int, size: int, where: str) -> bool:
    """Allocates every block of the first ``size`` bytes of ``fd``'s file (those allocated
    already stay as they are, with their bytes). True once done; False where the file system
    cannot allocate ahead (the file stays sparse). Raises ``DiskTooSmall`` naming the room
    there is, having allocated what it could (the caller removes a file it created)."""
    if _fallocate(fd, 0, 0, size) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EOPNOTSUPP, errno.ENOSYS):
        return False
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        stat = os.fstatvfs(fd)
        allocated = os.fstat(fd).st_blocks * 512
        room = stat.f_bavail * stat.f_frsize + allocated
        raise DiskTooSmall(
            f"the NVMe segment needs {format_size(size)} on the file system of {where}, "
            f"which has room for {format_size(room)} ({os.strerror(code)}): lower "
            "--nvme-size, free space there, or pass --nvme-sparse to allocate its blocks as "
            "objects are written (puts then fail once the disk is full)"
        )
    raise OSError(code, f"cannot reserve the NVMe segment's blocks in {where}: {os.strerror(code)}")
