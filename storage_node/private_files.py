"""Files only the node may write: the directory that holds a persistent segment, and the
opens that must not be turned elsewhere.

A persistent segment keeps its files in a directory the node created for it (mode 0700) or
that passes the same test: a real directory (not a symbolic link), owned by the node's user,
writable by no other user (``check_private_directory``). There no other user can plant a name
ahead of the node; every open of an index file refuses a symbolic link besides (O_NOFOLLOW),
a temporary file is created anew (O_EXCL), and one process at a time holds a segment (an
exclusive ``flock`` of its directory: ``hold_exclusively``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from kvpool.common.file_writes import write_all

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeLocation(ValueError):
    """A segment's directory or file is one other users could tamper with."""


class SegmentInUse(ValueError):
    """Another process holds this segment (another node on this host?)."""


def make_private_directory(directory: Path) -> Path:
    """Creates ``directory`` (mode 0700) where missing, then checks it as below."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_directory(directory)
    return directory


def check_private_directory(directory: Path) -> None:
    """UnsafeLocation unless ``directory`` is a real directory of this user that no other
    user can write: not every user (o+w), nor a group this user is not in (g+w for one of its
    own groups is allowed: Kubernetes makes a volume's directories writable by the pod's
    fsGroup, to which the node's user then belongs)."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        raise UnsafeLocation(f"{directory} does not exist") from None
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeLocation(
            f"{directory} is a symbolic link: a segment's files stay in a real directory of "
            "their own (remove the link, or point the flag at its target)"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeLocation(f"{directory} is not a directory")
    if info.st_uid != os.geteuid():
        raise UnsafeLocation(
            f"{directory} belongs to user {info.st_uid}, not to this node's user "
            f"{os.geteuid()}: a segment's directory must be the node's own"
        )
    others = info.st_mode & stat.S_IWOTH or (
        info.st_mode & stat.S_IWGRP and info.st_gid not in {os.getegid(), *os.getgroups()}
    )
    if others:
        raise UnsafeLocation(
            f"{directory} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}): "
            f"`chmod go-w {directory}`, so that nobody else can plant files in it"
        )


def read_nofollow(path: Path) -> bytes | None:
    """The bytes of the regular file ``path`` (not a link to one); None when it is missing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)  # a FIFO: no wait
    except FileNotFoundError:
        return None
    except OSError as error:
        raise _refused(path, error) from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeLocation(f"{path} is not a regular file")
        return file.read()


def open_for_update(path: Path) -> int:
    """A descriptor writing the existing regular file ``path`` (not a link to one) in place."""
    try:
        fd = os.open(path, os.O_WRONLY | _NOFOLLOW)
    except OSError as error:
        raise _refused(path, error) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeLocation(f"{path} is not a regular file")
    return fd


def create_new(path: Path) -> int:
    """Creates ``path`` afresh (mode 0600) and opens it for writing: a stale file of that name
    (left by a crash) is removed first, and anything that takes the name meanwhile, a link
    included, makes the create fail rather than be written through."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # removes a link itself, never its target
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    except OSError as error:
        raise _refused(path, error) from None


def sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Holder:
    """A segment held by this process (``hold_exclusively``) until ``close``."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.pop())


def hold_exclusively(path: Path, what: Path) -> Holder:
    """Takes the segment whose file ``what`` is, for this process until the holder returned
    is closed (or the process ends); SegmentInUse when another process holds it.

    The lock is an exclusive ``flock`` of the segment's directory, ``what``'s own (private):
    a lock file beside the files could be removed while its holder runs (a stale lock, as
    an operator or a cleanup script would take it), and the next node would then take the
    segment too, each rewriting the other's log. A directory cannot be removed while it
    holds the segment's files. (A flock belongs to one open of its file: a second open in
    this same process is refused too.) The lock file ``path`` (created if missing) is taken
    as well, as kvpool did before, so that a node of an earlier version refuses it while
    this one runs; the holder's pid is written in it, for the message. A file system that
    cannot lock a directory (NFS emulates flock with locks of files open for writing) has
    the lock file alone."""
    directory = what.parent
    try:
        held = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as error:
        raise _refused(directory, error) from None
    fds = [held]
    try:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SegmentInUse(f"{what} is in use by another process{_pid_in(path)}") from None
        except OSError as error:
            if error.errno not in _NO_DIRECTORY_LOCKS:
                raise
            os.close(fds.pop())  # (the lock file alone, then)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
        except OSError as error:
            raise _refused(path, error) from None
        fds.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SegmentInUse(f"{what} is in use by another process{_pid_in(path)}") from None
        os.ftruncate(fd, 0)
        write_all(fd, str(os.getpid()).encode(), 0)
    except BaseException:
        Holder(fds).close()
        raise
    return Holder(fds)


#: What ``flock`` of a directory fails with where its file system cannot lock one.
_NO_DIRECTORY_LOCKS = (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP)


def _pid_in(path: Path) -> str:
    """The pid the lock file ``path`` names, as the message shows it ("" if unknown)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
    except OSError:
        return ""
    try:
        holder = os.pread(fd, 16, 0).strip()
    except OSError:
        return ""
    finally:
        os.close(fd)
    return f" (pid {int(holder)})" if holder.isdigit() else ""


def _refused(path: Path, error: OSError) -> OSError | UnsafeLocation:
    if error.errno == errno.ELOOP:
        return UnsafeLocation(
            f"{path} is a symbolic link: refused (a segment's files are never links)"
        )
    if error.errno == errno.EEXIST:
        return UnsafeLocation(f"{path} appeared while the node was creating it: refused")
    return error
