"""Helpers of the SGLang backend tests: the storage config SGLang's cache controller builds,
the backend attached the way SGLang attaches it, and page keys as SGLang makes them."""

from __future__ import annotations

import os
from typing import Any

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory


def storage_config(master: str, **fields: Any) -> HiCacheStorageConfig:
    """What SGLang's cache controller builds (``_generate_storage_config``) for a TP1 engine
    started with ``--hicache-storage-backend dynamic`` and kvpool's extra config."""
    params = fields.pop("params", {})
    values: dict[str, Any] = {
        "tp_rank": 0,
        "tp_size": 1,
        "pp_rank": 0,
        "pp_size": 1,
        "attn_cp_rank": 0,
        "attn_cp_size": 1,
        "is_mla_model": False,
        "enable_storage_metrics": False,
        "is_page_first_layout": True,
        "model_name": "test/model",
        "extra_config": {
            "backend_name": "kvpool",
            "module_path": "kvpool.sglang",
            "class_name": "KVPoolHiCacheStorage",
            "interface_v1": 1,
            "master": master,
            **params,
        },
    }
    values.update(fields)
    return HiCacheStorageConfig(**values)


def attach(config: HiCacheStorageConfig, host_pool: Any) -> HiCacheStorage:
    """The backend as SGLang's ``attach_storage_backend`` makes it: the factory's dynamic
    loading, then the host pool registered."""
    backend = StorageBackendFactory.create_backend("dynamic", config, host_pool)
    backend.register_mem_pool_host(host_pool)
    backend.on_host_pools_registered()
    return backend


def hashes(count: int) -> list[str]:
    """Page keys as SGLang makes them (hex SHA-256 of the page's tokens and its prefix)."""
    return [os.urandom(32).hex() for _ in range(count)]
