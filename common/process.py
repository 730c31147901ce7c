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
