"""``adapter_params`` of the kvpool L2 adapter: what users set, checked with clear errors.

LMCache's plugin loader finds this class by its name (``KVPoolL2Adapter`` + ``Config``) and
builds it with ``from_dict(adapter_params)``; Python callers may also pass a plain dict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase

from kvpool.common import integration_settings as check
from kvpool.common.master_address import resolve_master
from kvpool.lmcache.keys import DEFAULT_PREFIX
from kvpool.security.caller import CallerCredentials

_HELP = """\
kvpool L2 adapter (plugin) adapter_params:
- master (str): kvpool master HOST:PORT (default: $KVPOOL_MASTER)
- replicas (int): copies per stored chunk, on distinct storage nodes (default 0: the
  master's default)
- lock_ttl_s (float): read lease taken by lookup-and-lock and renewed until submit_unlock
  (default 30; the master grants no single lease longer than its max_lease_ttl, a
  MasterConfig setting that `kvpool master` has no flag for)
- store_timeout_s (float): deadline of one store batch, counted from its submission: a
  store still queued then fails without starting (default 10)
- load_timeout_s (float): deadline of one load batch, counted from its submission: what
  has not arrived by then is reported as a miss (default 5)
- lookup_timeout_s (float): deadline of one lookup-and-lock batch, counted from its
  submission (default 2)
- control_timeout_s (float): deadline of delete, list_l2_keys and lease renewals (default 5)
- health_timeout_s (float): deadline of the master probe behind report_status (default 1)
- key_prefix (str): namespace of LMCache's keys in kvpool (default "lmcache/")
- max_capacity_gb (float): capacity LMCache's L2 eviction may assume (default 0: none;
  get_usage then reports the cluster's capacity, and LMCache's own L2 eviction stays off)
- register_l1 (bool): register the L1 arena with UCX once, for zero-copy (default true)
- ucx_config (dict[str, str]): UCX settings without the UCX_ prefix, e.g. {"TLS": "tcp"}
- same_host_mapping (bool): map the memory of storage nodes on this host and copy directly
  instead of using UCX (default true)
- metadata_lane (bool): send the hot metadata calls over the master's metadata lane when it
  has one, else gRPC (default true)
- token (str): a client token of the tenant whose objects this engine shares (`kvpool token
  create --role client --tenant T`), or "@/path/to/file" holding it (default:
  $KVPOOL_TOKEN, or the file $KVPOOL_TOKEN_FILE)
- tls_ca (str): CA of the master's certificate (default: $KVPOOL_TLS_CA)
- tls_cert, tls_key (str): a client certificate and its key, where the master asks for one
  (default: $KVPOOL_TLS_CERT, $KVPOOL_TLS_KEY)
Example: {"type": "plugin", "module_path": "kvpool.lmcache",
          "class_name": "KVPoolL2Adapter", "adapter_params": {"master": "10.0.0.5:50051"}}"""

_FLOATS = {
    "lock_ttl_s": 30.0,
    "store_timeout_s": 10.0,
    "load_timeout_s": 5.0,
    "lookup_timeout_s": 2.0,
    "control_timeout_s": 5.0,
    "health_timeout_s": 1.0,
}
_KNOWN = {
    "master",
    "replicas",
    "key_prefix",
    "max_capacity_gb",
    "register_l1",
    "ucx_config",
    "same_host_mapping",
    "metadata_lane",
    "token",
    "tls_ca",
    "tls_cert",
    "tls_key",
    *_FLOATS,
}
#: The largest capacity the setting may name (2**40 GiB, an exbibyte): LMCache's
#: eviction compares byte counts with it.
MAX_CAPACITY_GB = 2**30
#: Keys LMCache itself may leave in the dict (consumed by its own config parser).
_LMCACHE_KEYS = {"type", "eviction", "serde", "persist_enabled", "shared", "affinity_tag"}


class KVPoolL2AdapterConfig(L2AdapterConfigBase):
    def __init__(
        self,
        master: str | None = None,
        *,
        replicas: int = 0,
        lock_ttl_s: float = _FLOATS["lock_ttl_s"],
        store_timeout_s: float = _FLOATS["store_timeout_s"],
        load_timeout_s: float = _FLOATS["load_timeout_s"],
        lookup_timeout_s: float = _FLOATS["lookup_timeout_s"],
        control_timeout_s: float = _FLOATS["control_timeout_s"],
        health_timeout_s: float = _FLOATS["health_timeout_s"],
        key_prefix: str = DEFAULT_PREFIX,
        max_capacity_gb: float = 0.0,
        register_l1: bool = True,
        ucx_config: Mapping[str, str] | None = None,
        same_host_mapping: bool = True,
        metadata_lane: bool = True,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        super().__init__()
        self.master = resolve_master(master)
        check.credential_texts(
            {"token": token, "tls_ca": tls_ca, "tls_cert": tls_cert, "tls_key": tls_key}
        )
        #: The credentials (checked: a malformed token or a missing file is a ValueError).
        self.credentials = CallerCredentials.resolve(token, tls_ca, tls_cert, tls_key)
        self.replicas = check.replicas("replicas", replicas)
        self.lock_ttl_s = check.seconds("lock_ttl_s", lock_ttl_s)
        self.store_timeout_s = check.seconds("store_timeout_s", store_timeout_s)
        self.load_timeout_s = check.seconds("load_timeout_s", load_timeout_s)
        self.lookup_timeout_s = check.seconds("lookup_timeout_s", lookup_timeout_s)
        self.control_timeout_s = check.seconds("control_timeout_s", control_timeout_s)
        self.health_timeout_s = check.seconds("health_timeout_s", health_timeout_s)
        self.key_prefix = check.key_prefix("key_prefix", key_prefix, forbidden="@")
        if (
            isinstance(max_capacity_gb, bool)
            or not isinstance(max_capacity_gb, int | float)
            or not math.isfinite(max_capacity_gb)
            or not 0 <= max_capacity_gb <= MAX_CAPACITY_GB
        ):
            raise ValueError(
                f"max_capacity_gb must be a number of GiB from 0 (none) to {MAX_CAPACITY_GB}, "
                f"got {max_capacity_gb!r}"
            )
        self.max_capacity_bytes = int(max_capacity_gb * 1024**3)
        self.register_l1 = check.flag("register_l1", register_l1)
        self.ucx_config = check.string_map("ucx_config", ucx_config)
        self.same_host_mapping = check.flag("same_host_mapping", same_host_mapping)
        self.metadata_lane = check.flag("metadata_lane", metadata_lane)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KVPoolL2AdapterConfig:
        d = check.settings_dict("adapter_params", d)
        unknown = set(d) - _KNOWN - _LMCACHE_KEYS
        if unknown:
            raise ValueError(
                f"unknown kvpool adapter setting(s) {sorted(unknown)}; known: {sorted(_KNOWN)}"
            )
        kwargs = {k: v for k, v in d.items() if k in _KNOWN and k != "master"}
        return cls(d.get("master"), **kwargs)

    @classmethod
    def help(cls) -> str:
        return _HELP
