"""The settings of a kvpool tier: the keys of its ``secondary_tiers`` entry, checked.

vLLM's tier factory passes every key of the entry except ``type``, ``module_path`` and
``backpressure`` to the tier's constructor; the tier hands them here. Unknown keys and
malformed values are a ``ValueError`` naming the key and what it takes, raised while vLLM
starts (not at the first request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpool.common import integration_settings as check
from kvpool.common.master_address import resolve_master
from kvpool.security.caller import CallerCredentials

DEFAULT_PREFIX = "vllm"

HELP = """\
kvpool tier settings (keys of the secondary_tiers entry, beside "type" and "module_path"):
- master (str): kvpool master HOST:PORT, HOST:PORT,HOST:PORT or etcd://HOST:2379/CLUSTER
  (default: $KVPOOL_MASTER)
- replicas (int): copies per stored chunk, on distinct storage nodes (default 0: the
  master's default)
- key_prefix (str): namespace of this tier's keys in kvpool (default "vllm"); the rest of a
  key names the model (its --model string), its KV layout, chunk size and parallelism
  (vLLM's own FileMapper), so engines of the same model share chunks and others never read
  them; another checkpoint served under the same --model string needs its own key_prefix
- store_timeout_s (float): deadline of one store job, counted from its submission: a job
  still queued then fails without starting (default 10)
- load_timeout_s (float): deadline of one load job, counted from its submission: a chunk not
  loaded by then fails its job and is recomputed (default 5)
- lookup_timeout_s (float): deadline of one request's batch of lookups; after a batch
  failed as a whole (master unreachable), lookups miss without asking for this long
  (default 2)
- lookup_lease_s (float): read lease a lookup hit takes, so that the chunk is not evicted
  before its load starts (vLLM submits the load a scheduler step or a few after the
  lookup answered; the load takes a lease of its own and ends it when the job ends); held
  against the tenant's leases quota until it runs out (default 5)
- register_primary (bool): register the primary tier's memory with kvpool once, for zero
  copy (default true)
- ucx_config (dict[str, str]): UCX settings without the UCX_ prefix, e.g. {"TLS": "tcp"}
- same_host_mapping (bool): map the memory of storage nodes on this host and copy directly
  instead of using UCX (default true)
- metadata_lane (bool): metadata calls over the master's metadata lane when it has one
  (default true)
- token (str): a client token of the tenant whose chunks this engine shares, or
  "@/path/to/file" holding it (default: $KVPOOL_TOKEN, or the file $KVPOOL_TOKEN_FILE)
- tls_ca (str): CA of the master's certificate (default: $KVPOOL_TLS_CA)
- tls_cert, tls_key (str): a client certificate and key, where the master asks for one
- locality (str): "LOCAL" or "REMOTE", how vLLM's per-request tier filters see this tier
  (default: unset)
- enable_kv_events (bool): emit BlockStored events for chunks stored here, when vLLM's KV
  events are on (default false)
Example: {"type": "KVPoolTierManager", "module_path": "kvpool.vllm",
          "master": "10.0.0.5:50051", "replicas": 2}"""

_FLOATS = {
    "store_timeout_s": 10.0,
    "load_timeout_s": 5.0,
    "lookup_timeout_s": 2.0,
    "lookup_lease_s": 5.0,
}
_BOOLS = {
    "register_primary": True,
    "same_host_mapping": True,
    "metadata_lane": True,
    "enable_kv_events": False,
}
_STRINGS = check.CREDENTIALS
KNOWN = frozenset(
    {"master", "replicas", "key_prefix", "ucx_config", "locality", *_FLOATS, *_BOOLS, *_STRINGS}
)
LOCALITIES = ("LOCAL", "REMOTE")


@dataclass(frozen=True)
class KVPoolTierConfig:
    master: str
    credentials: CallerCredentials = field(repr=False)
    replicas: int = 0
    key_prefix: str = DEFAULT_PREFIX
    store_timeout_s: float = _FLOATS["store_timeout_s"]
    load_timeout_s: float = _FLOATS["load_timeout_s"]
    lookup_timeout_s: float = _FLOATS["lookup_timeout_s"]
    lookup_lease_s: float = _FLOATS["lookup_lease_s"]
    register_primary: bool = True
    ucx_config: Mapping[str, str] = field(default_factory=dict)
    same_host_mapping: bool = True
    metadata_lane: bool = True
    locality: str | None = None
    enable_kv_events: bool = False

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> KVPoolTierConfig:
        settings = check.settings_dict("the tier's settings", settings)
        unknown = set(settings) - KNOWN
        if unknown:
            raise ValueError(
                f"unknown kvpool tier setting(s) {sorted(unknown)}; known: {sorted(KNOWN)}\n" + HELP
            )
        check.credential_texts(settings)
        credentials = CallerCredentials.resolve(*(settings.get(name) for name in _STRINGS))
        replicas = check.replicas("replicas", settings.get("replicas", 0))
        prefix = check.key_prefix(
            "key_prefix", settings.get("key_prefix", DEFAULT_PREFIX), empty_allowed=False
        )
        ucx = check.string_map("ucx_config", settings.get("ucx_config"))
        locality = settings.get("locality")
        if locality is not None and locality not in LOCALITIES:
            raise ValueError(f"locality must be one of {LOCALITIES} or unset, got {locality!r}")
        return cls(
            master=resolve_master(settings.get("master")),
            credentials=credentials,
            replicas=replicas,
            key_prefix=prefix,
            ucx_config=ucx,
            locality=locality,
            store_timeout_s=_seconds(settings, "store_timeout_s"),
            load_timeout_s=_seconds(settings, "load_timeout_s"),
            lookup_timeout_s=_seconds(settings, "lookup_timeout_s"),
            lookup_lease_s=_seconds(settings, "lookup_lease_s"),
            register_primary=_flag(settings, "register_primary"),
            same_host_mapping=_flag(settings, "same_host_mapping"),
            metadata_lane=_flag(settings, "metadata_lane"),
            enable_kv_events=_flag(settings, "enable_kv_events"),
        )

    def client_options(self) -> dict[str, Any]:
        """``kvpool.Client`` keyword arguments every client of the tier shares."""
        return {
            "ucx_config": dict(self.ucx_config) or None,
            "same_host_mapping": self.same_host_mapping,
            "metadata_lane": self.metadata_lane,
            **self.credentials.client_arguments(),
        }


def _seconds(settings: Mapping[str, Any], name: str) -> float:
    return check.seconds(name, settings.get(name, _FLOATS[name]))


def _flag(settings: Mapping[str, Any], name: str) -> bool:
    return check.flag(name, settings.get(name, _BOOLS[name]))
