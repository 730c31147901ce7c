"""kvpool's settings in SGLang's ``--hicache-storage-backend-extra-config``, checked with clear
errors.

SGLang hands its storage backend the whole extra-config dict: the keys that name the backend
(``backend_name``, ``module_path``, ``class_name``), ``interface_v1`` (which SGLang reads to
call the zero-copy page interface), and the prefetch settings it pops itself. Every other
key must be one of kvpool's, so that a misspelt setting fails at start instead of being
ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpool.common import integration_settings as check
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
- lookup_lease_s (float): read lease a batch_exists hit takes, so that the page is still
  there when SGLang's io thread loads it (the load leases it again for itself); held
  against the tenant's leases quota until it runs out (default: load_timeout_s)
- store_timeout_s (float): deadline of one batch_set_v1 (default 10)
- key_prefix (str): namespace of SGLang's pages in kvpool (default "sglang/"); keys name
  the model by its --model-path string: a different checkpoint served from the same path
  needs a key_prefix of its own
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
    "lookup_lease_s",
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
    #: (from_extra_config: load_timeout_s unless given)
    lookup_lease_s: float = 5.0
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
        extra = check.settings_dict("the extra config", extra)
        if extra.get("interface_v1") not in (1, True):
            raise ValueError(
                "kvpool's HiCache backend moves pages zero-copy through SGLang's v1 page "
                'interface: add "interface_v1": 1 to --hicache-storage-backend-extra-config'
            )
        unknown = set(extra) - _KNOWN - _SGLANG_KEYS
        if unknown:
            raise ValueError(
                f"unknown kvpool HiCache setting(s) {sorted(unknown)}; known: {sorted(_KNOWN)}"
            )
        check.credential_texts(extra)
        replicas = check.replicas("replicas", extra.get("replicas", 0))
        key_prefix = check.key_prefix(
            "key_prefix", extra.get("key_prefix", DEFAULT_PREFIX), forbidden="@"
        )
        ucx_config = check.string_map("ucx_config", extra.get("ucx_config"))
        load_timeout_s = check.seconds(
            "load_timeout_s", extra.get("load_timeout_s", cls.load_timeout_s)
        )
        return cls(
            master=resolve_master(extra.get("master")),
            credentials=CallerCredentials.resolve(
                extra.get("token"), extra.get("tls_ca"), extra.get("tls_cert"), extra.get("tls_key")
            ),
            replicas=replicas,
            load_timeout_s=load_timeout_s,
            lookup_lease_s=check.seconds(
                "lookup_lease_s", extra.get("lookup_lease_s", load_timeout_s)
            ),
            store_timeout_s=check.seconds(
                "store_timeout_s", extra.get("store_timeout_s", cls.store_timeout_s)
            ),
            key_prefix=key_prefix,
            register_host_pool=check.flag(
                "register_host_pool", extra.get("register_host_pool", cls.register_host_pool)
            ),
            ucx_config=ucx_config,
            same_host_mapping=check.flag(
                "same_host_mapping", extra.get("same_host_mapping", cls.same_host_mapping)
            ),
            metadata_lane=check.flag(
                "metadata_lane", extra.get("metadata_lane", cls.metadata_lane)
            ),
        )

    @staticmethod
    def help() -> str:
        return _HELP
