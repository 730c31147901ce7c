"""One process at a time changes a file that is read, changed and written back whole.

``kvpool token``, ``kvpool quota`` and ``kvpool capability-keys rotate`` each read a file, change
it and write it back (renamed over the old one). Two of them at once, a lock within one process
does not order: the later write drops the earlier change (a token handed out that does not
work, a revoke undone). The lock is a file beside the data, ``NAME.lock``: the data file itself
is replaced by each change, so a lock on it would hold the old copy.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

#: What the lock of a file is named after it: ``NAME.lock``, beside it.
LOCK_SUFFIX = ".lock"
#: The lock file's mode: it holds nothing, and a lock taken by root (``sudo kvpool token``)
#: must not keep the file's own user from opening it to wait its turn.
LOCK_MODE = 0o644


def _lock(lock_path: Path) -> int:
    """A descriptor of ``lock_path`` holding its exclusive flock (waits for it). A lock file
    removed by the holder before us (``_unlock``) is not the lock any more: lock the new one."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        try:
            descriptor = os.open(lock_path, flags, LOCK_MODE)
        except PermissionError:
            raise PermissionError(
                errno.EACCES,
                f"permission denied on {lock_path.name}, another user's; if no kvpool "
                "command runs now it is left over from one that was killed: remove it",
            ) from None
        try:
            if os.fstat(descriptor).st_uid == os.geteuid():  # (made now, or ours: whatever
                os.fchmod(descriptor, LOCK_MODE)  # the umask, every user may open it)
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            held = os.fstat(descriptor)
            try:
                current: os.stat_result | None = os.stat(lock_path, follow_symlinks=False)
            except FileNotFoundError:
                current = None
        except BaseException:
            os.close(descriptor)
            raise
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            return descriptor
        os.close(descriptor)


def _unlock(lock_path: Path, descriptor: int) -> None:
    """Removes the lock file (none is left beside the data) while still holding it, then
    lets go: a process waiting on it sees it removed and locks a new one."""
    with contextlib.suppress(OSError):
        os.unlink(lock_path)
    os.close(descriptor)


@contextlib.contextmanager
def exclusive_change(path: Path, error: Callable[[OSError], Exception]) -> Iterator[None]:
    """Held, by one process at a time, while ``path`` is read, changed and written back whole
    (``kvpool token``, ``kvpool quota``, ``kvpool capability-keys rotate``): two admins'
    changes at once both land, and a revoke is never undone by a create that read the file
    before it. The lock is a file beside it, ``NAME.lock`` (mode 0600; the file itself is
    replaced by each change, so a lock on it would hold the old copy). ``error`` makes what
    to raise when the lock cannot be taken (the caller's own error type)."""
    lock_path = path.with_name(path.name + LOCK_SUFFIX)
    try:
        descriptor = _lock(lock_path)
    except OSError as problem:
        raise error(problem) from None
    try:
        yield
    finally:
        _unlock(lock_path, descriptor)
