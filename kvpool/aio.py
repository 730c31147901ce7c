"""kvpool for asyncio: ``from kvpool.aio import AsyncClient`` (client/aio.py).

Imported lazily, as ``kvpool.Client`` is: importing this module loads nothing of UCX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["AsyncClient", "AsyncReservation"]

if TYPE_CHECKING:
    from kvpool.client.aio import AsyncClient, AsyncReservation


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kvpool.client import aio

        return getattr(aio, name)
    raise AttributeError(f"module 'kvpool.aio' has no attribute {name!r}")
