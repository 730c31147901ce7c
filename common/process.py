"""Process plumbing shared by the master and storage node entry points."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path


def write_ready_file(path: str | None, **fields: object) -> None:
    """Atomically writes ``fields`` as JSON: whoever waits for the file sees all or nothing."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(fields))
    tmp.replace(target)


def stop_event_on_signals(loop: asyncio.AbstractEventLoop) -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, so that servers shut down cleanly."""
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def not_dumpable() -> None:
    """Makes this process not dumpable (``PR_SET_DUMPABLE`` 0): other processes of its user
    can then no longer open its memory or file descriptors through ``/proc``, attach to it,
    or copy in and out of it (CMA); no core dump keeps its secrets. Processes with
    ``CAP_SYS_PTRACE`` (root, usually) still can."""
    import ctypes

    from kvpool.common.libc import LIBC

    pr_set_dumpable = 4
    if LIBC.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
