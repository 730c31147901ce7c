"""Writing every byte to a file descriptor, or an error.

A ``write`` or ``pwrite`` may take fewer bytes than it was given (a file system filling up,
a signal) and report it only in its count; Python's buffered files go further and return a
short count instead of raising when an error cuts a large write short. Durable records
written once and counted on (an index log, a key file, a tombstone file) must not come out
torn with nothing said: these loops write the rest, and the next call raises the error.
"""

from __future__ import annotations

import errno
import os


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """Writes all of ``data`` at ``offset`` (``pwrite``), or at the file's position."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        if offset is None:
            written = os.write(fd, view[done:])
        else:
            written = os.pwrite(fd, view[done:], offset + done)
        if written <= 0:  # (a regular file never takes nothing without an error)
            raise OSError(errno.EIO, "the file took no bytes")
        done += written
