"""kvpool as a secondary tier of vLLM's native KV offloading (``TieringOffloadingSpec``).

vLLM loads it from a ``secondary_tiers`` entry of ``kv_connector_extra_config``::

    {"type": "KVPoolTierManager", "module_path": "kvpool.vllm", "master": "HOST:PORT"}

Engines on CPU also name this package's spec, which vLLM 0.32 lacks for them::

    "spec_name": "KVPoolCPUTieringSpec", "spec_module_path": "kvpool.vllm"

``docs/vllm.md`` has whole command lines; ``config.py`` every setting. Importing this package
imports vLLM: it is meant to be imported by vLLM.
"""

from kvpool.vllm.config import KVPoolTierConfig
from kvpool.vllm.cpu_engine import KVPoolCPUTieringSpec
from kvpool.vllm.manager import KVPoolTierManager

__all__ = ["KVPoolCPUTieringSpec", "KVPoolTierConfig", "KVPoolTierManager"]
