"""kvpool: a distributed object store for LLM KV cache.

``from kvpool import Client`` for the Python API; ``kvpool.errors`` for its exceptions.
The client is imported lazily so that ``kvpool master`` does not load UCX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvpool.common import grpc_tuning

grpc_tuning.apply()  # before anything imports grpc

__version__ = "0.1.0"
__all__ = ["Client", "__version__"]

if TYPE_CHECKING:
    from kvpool.client.client import Client


def __getattr__(name: str) -> Any:
    if name == "Client":
        from kvpool.client.client import Client

        return Client
    raise AttributeError(f"module 'kvpool' has no attribute {name!r}")
