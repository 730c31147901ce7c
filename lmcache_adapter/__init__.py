"""kvpool as LMCache's L2 (remote KV) tier, loaded by LMCache's plugin adapter type::

    --l2-adapter '{"type": "plugin", "module_path": "kvpool.lmcache",
                   "class_name": "KVPoolL2Adapter",
                   "adapter_params": {"master": "HOST:PORT"}}'

Needs ``lmcache`` (0.5.6): install with ``scripts/install_lmcache.sh`` (or the ``lmcache``
extra plus ``pip install --no-deps lmcache==0.5.6``). Settings: ``KVPoolL2AdapterConfig``.
"""

from kvpool.lmcache.adapter import KVPoolL2Adapter
from kvpool.lmcache.config import KVPoolL2AdapterConfig
from kvpool.lmcache.keys import KeyCodec

__all__ = ["KVPoolL2Adapter", "KVPoolL2AdapterConfig", "KeyCodec"]
