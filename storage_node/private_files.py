"""Files only the node may write: the directory that holds a persistent segment, and the
opens that must not be turned elsewhere.

A persistent segment keeps its files in a directory the node created for it (mode 0700) or
that passes the same test: a real directory (not a symbolic link), owned by the node's user,
writable by no other user (``check_private_directory``). There no other user can plant a name
ahead of the node; every open of an index file refuses a symbolic link besides (O_NOFOLLOW),
a temporary file is created anew (O_EXCL), and one process at a time holds a segment (an
exclusive ``flock``).
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


def hold_exclusively(path: Path, what: Path) -> int:
    """Takes the lock file ``path`` (created if missing), which guards ``what``, for this
    process until the descriptor returned is closed (or the process ends); SegmentInUse when
    another process holds it. The holder's pid is written in it, for the message."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    except OSError as error:
        raise _refused(path, error) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 16, 0).strip()
        os.close(fd)
        by = f" (pid {int(holder)})" if holder.isdigit() else ""
        raise SegmentInUse(f"{what} is in use by another process{by}") from None
    os.ftruncate(fd, 0)
    write_all(fd, str(os.getpid()).encode(), 0)
    return fd


def _refused(path: Path, error: OSError) -> OSError | UnsafeLocation:
    if error.errno == errno.ELOOP:
        return UnsafeLocation(
            f"{path} is a symbolic link: refused (a segment's files are never links)"
        )
    if error.errno == errno.EEXIST:
        return UnsafeLocation(f"{path} appeared while the node was creating it: refused")
    return error
