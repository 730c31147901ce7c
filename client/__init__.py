"""kvpool's client: ``Client`` and the types its calls return (client/types.py).

``Client`` is imported lazily (it loads UCX); the types are plain dataclasses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvpool.client.types import (
    ClusterStatus,
    KeyPage,
    ObjectInfo,
    PrefixRemoval,
    RegisteredRegion,
    ReplicaInfo,
    SegmentStatus,
    StoryEvent,
)

__all__ = [
    "Client",
    "ClusterStatus",
    "KeyPage",
    "ObjectInfo",
    "PrefixRemoval",
    "RegisteredRegion",
    "ReplicaInfo",
    "SegmentStatus",
    "StoryEvent",
]

if TYPE_CHECKING:
    from kvpool.client.client import Client


def __getattr__(name: str) -> Any:
    if name == "Client":
        from kvpool.client.client import Client

        return Client
    raise AttributeError(f"module 'kvpool.client' has no attribute {name!r}")
