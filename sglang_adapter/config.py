"""kvpool's settings in SGLang's ``--hicache-storage-backend-extra-config``, checked with clear
errors.

SGLang hands its storage backend the whole extra-config dict: the keys that name the backend
(``backend_name``, ``module_path``, ``class_name``), ``interface_v1`` (which SGLang reads to
call the zero-copy page interface), and the prefetch settings it pops itself. Every other
key must be one of kvpool's, so that a misspelt setting fails at start instead of being
ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpool.common.master_address import resolve_master
from kvpool.security.caller import CallerCredentials

DEFAULT_PREFIX = "sglang/"

_HELP = """\
kvpool HiCache storage backend, settings in --hicache-storage-backend-extra-config:
- interface_v1 (1, required): SGLang then moves pages through batch_get_v1/batch_set_v1,
  straight between its host pool and kvpool (zero copy)
- master (str): kvpool master HOST:PORT (default: $KVPOOL_MASTER)
- replicas (int): copies per stored page, on distinct storage nodes (default 0: the
  master's default)
- load_timeout_s (float): deadline of one batch_get_v1 and of one batch_exists: what has
  not arrived by then is a miss (default 5)
- store_timeout_s (float): deadline of one batch_set_v1 (default 10)
- key_prefix (str): namespace of SGLang's pages in kvpool (default "sglang/")
- register_host_pool (bool): register SGLang's host KV pool with UCX once (default true)
- ucx_config (dict[str, str]): UCX settings without the UCX_ prefix, e.g. {"TLS": "tcp"}
- same_host_mapping (bool): map the memory of storage nodes on this host and copy directly
  instead of using UCX (default true)
- metadata_lane (bool): send the hot metadata calls over the master's metadata lane when it
  has one, else gRPC (default true)
- token (str): a client token of the tenant whose pages this engine shares, or
  "@/path/to/file" holding it (default: $KVPOOL_TOKEN, or the file $KVPOOL_TOKEN_FILE)
- tls_ca (str): CA of the master's certificate (default: $KVPOOL_TLS_CA)
- tls_cert, tls_key (str): a client certificate and its key, where the master asks for one
Example: {"backend_name": "kvpool", "module_path": "kvpool.sglang",
          "class_name": "KVPoolHiCacheStorage", "interface_v1": 1, "master": "10.0.0.5:50051"}"""

_KNOWN = {
    "master",
    "replicas",
    "load_timeout_s",
    "store_timeout_s",
    "key_prefix",
    "register_host_pool",
    "ucx_config",
    "same_host_mapping",
    "metadata_lane",
    "token",
    "tls_ca",
    "tls_cert",
    "tls_key",
}
#: Keys SGLang itself reads from the same dict (the dynamic backend's name, its zero-copy
#: switch, the prefetch settings of its cache controllers).
_SGLANG_KEYS = {
    "backend_name",
    "module_path",
    "class_name",
    "interface_v1",
    "prefetch_threshold",
    "prefetch_timeout_base",
    "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys",
    "tp_lcm_size",
}


@dataclass(frozen=True)
class KVPoolHiCacheConfig:
    master: str
    credentials: CallerCredentials
    replicas: int = 0
    load_timeout_s: float = 5.0
    store_timeout_s: float = 10.0
    key_prefix: str = DEFAULT_PREFIX
    register_host_pool: bool = True
    ucx_config: dict[str, str] = field(default_factory=dict)
    same_host_mapping: bool = True
    metadata_lane: bool = True

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> KVPoolHiCacheConfig:
        """The settings in SGLang's extra config; ValueError, saying what to change, for a
        missing ``interface_v1``, an unknown key or a bad value."""
        extra = dict(extra or {})
        if not extra.get("interface_v1"):
            raise ValueError(
                "kvpool's HiCache backend moves pages zero-copy through SGLang's v1 page "
                'interface: add "interface_v1": 1 to --hicache-storage-backend-extra-config'
            )
        unknown = set(extra) - _KNOWN - _SGLANG_KEYS
        if unknown:
            raise ValueError(
                f"unknown kvpool HiCache setting(s) {sorted(unknown)}; known: {sorted(_KNOWN)}"
            )
        for name in ("token", "tls_ca", "tls_cert", "tls_key"):
            value = extra.get(name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        replicas = extra.get("replicas", 0)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas must be an integer >= 0, got {replicas!r}")
        key_prefix = extra.get("key_prefix", DEFAULT_PREFIX)
        if not isinstance(key_prefix, str) or "@" in key_prefix:
            raise ValueError(f"key_prefix must be a string without '@', got {key_prefix!r}")
        ucx_config = extra.get("ucx_config") or {}
        if not (
            isinstance(ucx_config, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in ucx_config.items())
        ):
            raise ValueError(f"ucx_config must map strings to strings, got {ucx_config!r}")
        return cls(
            master=resolve_master(extra.get("master")),
            credentials=CallerCredentials.resolve(
                extra.get("token"), extra.get("tls_ca"), extra.get("tls_cert"), extra.get("tls_key")
            ),
            replicas=replicas,
            load_timeout_s=_seconds(extra, "load_timeout_s", cls.load_timeout_s),
            store_timeout_s=_seconds(extra, "store_timeout_s", cls.store_timeout_s),
            key_prefix=key_prefix,
            register_host_pool=_flag(extra, "register_host_pool", cls.register_host_pool),
            ucx_config=dict(ucx_config),
            same_host_mapping=_flag(extra, "same_host_mapping", cls.same_host_mapping),
            metadata_lane=_flag(extra, "metadata_lane", cls.metadata_lane),
        )

    @staticmethod
    def help() -> str:
        return _HELP


def _seconds(extra: Mapping[str, Any], name: str, default: float) -> float:
    value = extra.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _flag(extra: Mapping[str, Any], name: str, default: bool) -> bool:
    value = extra.get(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value
