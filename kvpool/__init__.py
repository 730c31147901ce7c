"""kvpool: a distributed object store for LLM KV cache.

``from kvpool import Client`` for the Python API; ``kvpool.errors`` for its exceptions; the
types its calls return (``ObjectInfo``, ``KeyPage``, ``ClusterStatus``, ...) come from here
too. They are imported lazily so that ``kvpool master`` does not load UCX.

Importing kvpool changes nothing in the process that imports it (an inference server's):
no environment variable, no global setting. ``tune_grpc()`` opts into the gRPC settings
kvpool's own processes use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
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
    "__version__",
    "tune_grpc",
]
#: The types ``Client`` calls return (client/types.py), by name.
_TYPES = frozenset(__all__) - {"Client", "__version__", "tune_grpc"}


def tune_grpc() -> bool:
    """Applies the gRPC settings kvpool's own processes run with (common/grpc_tuning.py: the
    classic poller instead of gRPC's EventEngine, measured faster on small machines). It must
    run before anything imports grpc, and changes the whole process: call it from a program's
    entry point, if at all. Returns whether it took effect."""
    from kvpool.common import grpc_tuning

    return grpc_tuning.apply()


if TYPE_CHECKING:
    from kvpool.client.client import Client
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


def __getattr__(name: str) -> Any:
    if name == "Client":
        from kvpool.client.client import Client

        return Client
    if name in _TYPES:
        from kvpool.client import types

        return getattr(types, name)
    raise AttributeError(f"module 'kvpool' has no attribute {name!r}")
