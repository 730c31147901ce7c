"""Small asyncio helpers shared by the master and storage node processes."""

from __future__ import annotations

import asyncio


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleeps ``seconds``, or less if ``stop`` is set.

    Built on ``asyncio.wait`` rather than ``asyncio.wait_for``: on Python 3.11, wait_for can
    swallow a cancellation that arrives as its inner wait finishes, leaving a task that was
    told to stop running on forever.
    """
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()
