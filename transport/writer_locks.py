"""Byte-range locks that a same-host writer holds on a node's file while it copies into it.

A client that maps a node's DRAM segment (transport/shared_memory.py) or writes its NVMe
file itself (transport/shared_file.py) copies a put's bytes with no node in the way, and
nothing can stop that copy from outside. It checks its deadline before each piece; a writer
stopped between that check and the piece (SIGSTOP, a frozen cgroup, a paused VM, heavy
swapping) for longer than the master keeps the space of its lost reservation would finish
the piece into whatever object the master placed there since: a published object, read back
wrong with no error.

So the writer holds a shared lock (an open file description lock, ``F_OFD_SETLK``) on each
range for as long as it may copy into it, and the node, told to forget that range (the
master's Forget of a reservation that ended unwritten), answers only once no writer holds a
lock on it (storage_node/commands.py): until then the master keeps the space out of use
(quarantine). Such a lock belongs to the open file description it was taken through, and
goes when the last descriptor of that description closes: a writer killed mid-copy leaves
none behind. The writer therefore takes its locks through a description of its own (opened
anew through ``/proc/self/fd``), never through one the node handed over, which the node and
other clients share and which would keep a dead writer's locks for as long as the node runs.

A lock is only a lock: the node never takes one, it asks (``F_OFD_GETLK``) whether a write
lock would conflict, so a writer never waits on a lock and a lock never fails for a conflict.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
from collections.abc import Iterable

#: struct flock: l_type, l_whence, (padding), l_start, l_len, l_pid, (padding).
_FLOCK = struct.Struct("hh4xqqi4x")


def own_description(fd: int, *, writable: bool = False, handed_over: bool = False) -> int | None:
    """A new open file description of the file behind ``fd`` (a descriptor of the process),
    for locks of this process alone. Where the file cannot be opened again (a file of
    another user), and ``fd`` was ``handed_over`` by the node, a duplicate of ``fd``: the
    node hands each client a description of its own (storage_node/mapping_server.py). Else
    None: then no lock is taken through it. (The duplicate shares its description with the
    mapping: a fork child that keeps the mapping keeps a lock its killed parent held, and
    the range stays out of use, never spoilt, until the child exits.)"""
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
    try:
        return os.open(f"/proc/self/fd/{fd}", flags)
    except OSError:
        pass
    if handed_over:
        try:
            return os.dup(fd)  # (close-on-exec, as every dup of Python's)
        except OSError:
            return None
    return None


def hold(fd: int, ranges: Iterable[tuple[int, int]]) -> None:
    """Takes a shared lock on each (offset, length) of ``ranges`` through ``fd``. Best
    effort: a lock the kernel refuses (``ENOLCK``: its table of locks is full) leaves the
    range as unguarded as it was before writers took locks, and the write goes on."""
    _set(fd, fcntl.F_RDLCK, ranges)


def let_go(fd: int, ranges: Iterable[tuple[int, int]]) -> None:
    """Drops the locks ``hold`` took on ``ranges`` (the same ranges: a writer's ranges never
    overlap one another, so dropping one leaves the others whole)."""
    _set(fd, fcntl.F_UNLCK, ranges)


def _set(fd: int, kind: int, ranges: Iterable[tuple[int, int]]) -> None:
    setlk, pack = fcntl.F_OFD_SETLK, _FLOCK.pack
    for offset, length in ranges:
        if length > 0:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, setlk, pack(kind, os.SEEK_SET, offset, length, 0))


def written_at(fd: int, offset: int, length: int) -> bool:
    """Whether a writer holds a lock on any byte of [offset, offset + length) (asked through
    ``fd``, a description of the asker's own that holds no lock)."""
    if length <= 0:
        return False
    asked = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, length, 0)
    return _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, asked))[0] != fcntl.F_UNLCK
