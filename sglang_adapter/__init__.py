"""kvpool as SGLang's HiCache storage tier, loaded by SGLang's "dynamic" backend::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvpool",
        "module_path": "kvpool.sglang", "class_name": "KVPoolHiCacheStorage",
        "interface_v1": 1, "master": "HOST:PORT"}'

Needs ``sglang`` (0.5.23); ``scripts/install_sglang.sh`` installs its interface on a machine
without a GPU. Settings: ``KVPoolHiCacheConfig`` (docs/sglang.md).
"""

from kvpool.sglang.config import KVPoolHiCacheConfig
from kvpool.sglang.storage import KVPoolHiCacheStorage

__all__ = ["KVPoolHiCacheConfig", "KVPoolHiCacheStorage"]
