"""Telling a blocking call another thread runs to stop at its next step (for ``kvpool.aio``).

The asyncio client runs each call of the blocking ``Client`` on a thread of its own. A step
in progress cannot be interrupted (a master round trip, a transfer: each bounded by the
call's deadline), but a call can be told not to take the next one. Before it moves bytes,
and before it commits a put, a call asks ``cancelled()``; a put told to stop gives its
reservations back (PutRevoke) instead of writing or committing them, so nothing of it is
left half-visible, and a read told to stop leaves the caller's buffers alone from then on.

The flag lives in a thread-local ``scope``: a call outside one (any plain ``Client`` call)
is never cancelled, and costs one attribute lookup per step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class CallCancelled(Exception):
    """Ends a call whose scope was cancelled, at its next step (never seen by callers of
    ``Client``: only a scope's owner cancels it, and it expects this)."""


class CancelScope:
    """One call's cancellation flag, set from the thread that gave up waiting for it."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True  # (one store: read by the call's thread at its next step)


_current = threading.local()


def run_in_scope(scope: CancelScope, call: Callable[[], T]) -> T:
    """Runs ``call`` on this thread with ``scope`` as its cancellation flag; a scope cancelled
    before the call starts stops it before its first step."""
    if scope.cancelled:
        raise CallCancelled
    _current.scope = scope
    try:
        return call()
    finally:
        _current.scope = None


def cancelled() -> bool:
    """Whether the call running on this thread was told to stop."""
    scope = getattr(_current, "scope", None)
    return scope is not None and scope.cancelled


def checkpoint() -> None:
    """Raises CallCancelled when the call running on this thread was told to stop."""
    if cancelled():
        raise CallCancelled
