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

A segment larger than one file may be there (ext4 with 4 KiB blocks: 16 TiB; or the
process's ``RLIMIT_FSIZE``) is refused the same way, sparse or not, before any block is
taken: ``set_size`` names the largest file allowed (``FileTooLarge``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource

from kvpool.common.libc import LIBC
from kvpool.common.sizes import format_size

_fallocate = LIBC.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


class DiskTooSmall(Exception):
    """The segment's file system has no room for the whole segment."""


class FileTooLarge(DiskTooSmall):
    """The segment is larger than one file may be on its file system (or for this process:
    ``RLIMIT_FSIZE``)."""


def set_size(
    fd: int, size: int, where: str, *, what: str = "the NVMe segment", option: str = "--nvme-size"
) -> None:
    """Gives ``fd``'s file the length ``size`` (a sparse one: no block taken). Raises
    ``FileTooLarge`` where no file there may be that long (EFBIG; EINVAL from some file
    systems), naming the largest length allowed, the file given its length back."""
    try:
        os.ftruncate(fd, size)
    except OSError as error:
        if error.errno not in (errno.EFBIG, errno.EINVAL) or size <= 0:
            raise
        raise _too_large(fd, size, where, error.errno, what, option) from None


def reserve(fd: int, size: int, where: str) -> bool:
    """Allocates every block of the first ``size`` bytes of ``fd``'s file (those allocated
    already stay as they are, with their bytes). True once done; False where the file system
    cannot allocate ahead (the file stays sparse). Raises ``DiskTooSmall`` naming the room
    there is, having allocated what it could (the caller removes a file it created), or
    ``FileTooLarge`` (EFBIG) naming the largest file allowed."""
    if _fallocate(fd, 0, 0, size) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EOPNOTSUPP, errno.ENOSYS):
        return False
    if code == errno.EFBIG:  # (past the process's RLIMIT_FSIZE, set lower since it was made)
        raise _too_large(fd, size, where, code, "the NVMe segment", "--nvme-size")
    if code in (errno.ENOSPC, errno.EDQUOT):
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


def _too_large(fd: int, size: int, where: str, code: int, what: str, option: str) -> FileTooLarge:
    """The refusal of a segment of ``size`` bytes longer than ``fd``'s file may be, with the
    largest length it may have where that is known: this process's ``RLIMIT_FSIZE``, else
    the file system's own limit, found by setting lengths between its length now and
    ``size`` (a few dozen ``ftruncate`` calls, no block taken) before giving it back."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY and soft < size:
        limit, whose = soft, "this process's limit on a file's size (RLIMIT_FSIZE, `ulimit -f`)"
        advice = f"raise that limit, or pass {option} {_at_most(limit)} or less"
    else:
        limit = _longest(fd, os.fstat(fd).st_size, size)
        whose = "its file system's largest file"
        advice = f"pass {option} {_at_most(limit)} or less" if limit else f"lower {option}"
        if option == "--nvme-size":
            advice += " (more --nvme directories on that disk hold more: a segment each)"
    known = f": {whose} is {format_size(limit)} ({limit} bytes)" if limit else ""
    return FileTooLarge(
        f"{what} of {format_size(size)} is larger than one file may be in {where}{known} "
        f"({os.strerror(code)}): {advice}"
    )


def _longest(fd: int, start: int, size: int) -> int:
    """The greatest length ``fd``'s file takes, between ``start`` (its length now) and
    ``size`` (one it refused), by bisection; 0 where none above ``start`` is found. The file
    is given its length back: every length set was above it, so no byte it holds changes."""
    low, high = start, size
    try:
        while high - low > 1:
            middle = (low + high) // 2
            try:
                os.ftruncate(fd, middle)
            except OSError:
                high = middle
            else:
                low = middle
    finally:
        os.ftruncate(fd, start)
    return low if low > start else 0


def _at_most(limit: int) -> str:
    """The largest size of whole GiB (else MiB, else bytes) within ``limit``, as the size
    options take it."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB")):
        if limit >= unit:
            return f"{limit // unit}{name}"
    return str(limit)
