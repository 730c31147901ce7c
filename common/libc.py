"""The C library, loaded once for the few calls Python's standard library lacks (mincore,
sync_file_range, mmap at a chosen protection, madvise on raw addresses, prctl). Each user
sets the argument types of the functions it calls; they are distinct functions, so no two
users disagree on one."""

from __future__ import annotations

import ctypes

#: The process's own symbols, libc's among them (``None``: no library search, which would
#: run ``ldconfig`` in a subprocess at import).
LIBC = ctypes.CDLL(None, use_errno=True)
