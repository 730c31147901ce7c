"""vLLM loads the kvpool tier by its module path, through its own factory and spec, and the
tier's entry configures it: bad entries fail while the engine starts, with what to fix.

(The same checks vLLM's tests make of its factory and file-system tier: the class is found by
module path, extra entry keys reach the constructor, locality is forwarded and validated.)
"""

from __future__ import annotations

import pytest
from tier_driver import TIER, HostError

from kvpool import Client
from kvpool.security.dev_pki import make_dev_pki

#: A well-formed client token that no cluster knows (as a revoked one).
UNKNOWN_TOKEN = "kvp1.0123456789ab.SECRETsecretSECRETsecretSECRETsecret42"


def test_vllm_finds_the_tier_class_by_its_module_path(host):
    found = host.call("tier_class", tier=TIER)
    assert found["class"] == "kvpool.vllm.manager.KVPoolTierManager"


def test_the_tiering_spec_builds_the_tier_over_its_primary_memory(make_tier):
    tier = make_tier(slots=6, slot_bytes=128 * 1024)
    assert tier.info["class"] == "kvpool.vllm.manager.KVPoolTierManager"
    assert tier.info["tier_type"] == "KVPoolTierManager"
    # one slot per primary chunk: the tier moves whole slots of the primary's memory
    assert (tier.info["slots"], tier.info["slot_bytes"]) == (6, 128 * 1024)
    # remote CPU memory, reported as a remote store's hits (not the engine's own memory)
    assert tier.info["medium"] == "CPU"
    assert tier.info["cache_hit_source"] == "external_unspecified"
    assert tier.info["locality"] is None


def test_the_factory_forwards_locality(make_tier):
    assert make_tier(locality="REMOTE").info["locality"] == "REMOTE"
    assert make_tier(locality="LOCAL").info["locality"] == "LOCAL"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"mastr": "127.0.0.1:1"}, "unknown kvpool tier setting(s) ['mastr']"),
        ({"replicas": -1}, "replicas must be an integer from 0"),
        ({"replicas": 9}, "replicas must be an integer from 0 (the master's default) to 8"),
        ({"load_timeout_s": 0}, "load_timeout_s must be a positive number of seconds"),
        ({"locality": "remote"}, "locality must be one of ('LOCAL', 'REMOTE')"),
        ({"ucx_config": {"TLS": 1}}, "ucx_config must map strings to strings"),
        ({"register_primary": "yes"}, "register_primary must be true or false"),
        ({"token": ""}, "token must be a non-empty string"),
    ],
)
def test_a_bad_entry_fails_the_engine_start_with_what_to_fix(make_tier, setting, message):
    with pytest.raises(HostError) as failure:
        make_tier(**setting)
    assert failure.value.kind == "ValueError"
    assert message in failure.value.message


def test_without_a_master_it_says_how_to_give_one(make_tier):
    with pytest.raises(HostError) as failure:
        make_tier(master=None, unset_env=["KVPOOL_MASTER"])
    assert "KVPOOL_MASTER" in failure.value.message


def test_credentials_come_from_the_entry_when_the_environment_has_none(make_tier, tier_cluster):
    credentials = tier_cluster.client_credentials()
    unset = ["KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE", "KVPOOL_TLS_CA"]
    tier = make_tier(token=credentials["token"], tls_ca=credentials["tls_ca"], unset_env=unset)
    tier.fill(slots=[0], seed=1)
    assert tier.run("store", 1, keys=[1], slots=[0])["success"]
    (name,) = tier.names(keys=[1])["names"]
    with Client(tier_cluster.master_address) as client:  # the session's own credentials
        assert client.stat(name).size == tier.info["slot_bytes"]


def test_without_credentials_a_secure_cluster_stores_nothing_and_loads_nothing(make_tier):
    unset = ["KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE", "KVPOOL_TLS_CA"]
    # (without the CA no connection to the master is made: each call retries to its deadline)
    tier = make_tier(unset_env=unset, store_timeout_s=2, lookup_timeout_s=1)
    tier.fill(slots=[0], seed=1)
    assert not tier.run("store", 1, keys=[1], slots=[0])["success"]
    assert tier.lookup(keys=[1])["final"] == ["MISS"]


def test_a_token_the_master_refuses_fails_the_engine_start_with_what_to_fix(
    make_tier, tier_cluster
):
    # (else the engine would start, and every lookup, store and load fail with a warning)
    tls_ca = tier_cluster.client_credentials()["tls_ca"]
    with pytest.raises(HostError) as failure:
        make_tier(token=UNKNOWN_TOKEN, tls_ca=tls_ca)
    assert failure.value.kind == "ValueError"
    message = failure.value.message
    assert "refuses this engine's credentials" in message
    assert "not one this cluster knows" in message  # (the master's reason)
    assert '"token"' in message and "$KVPOOL_TOKEN" in message


def test_with_the_master_down_the_engine_starts_and_misses(make_tier):
    # (nothing listens there: engines must start while the cluster is down)
    tier = make_tier(master="127.0.0.1:1", lookup_timeout_s=1)
    assert tier.lookup(keys=[1])["final"] == ["MISS"]


def test_a_master_the_tiers_ca_does_not_vouch_for_fails_the_engine_start(
    make_tier, tier_cluster, tmp_path
):
    # (else the engine would start, and every lookup miss and every job fail)
    other = make_dev_pki(tmp_path / "other-pki")
    token = tier_cluster.client_credentials()["token"]
    with pytest.raises(HostError) as failure:
        make_tier(token=token, tls_ca=str(other.ca))
    assert failure.value.kind == "ValueError"
    message = failure.value.message
    assert "is not trusted" in message
    assert '"tls_ca"' in message and "$KVPOOL_TLS_CA" in message


def test_a_model_name_too_long_for_kvpool_keys_fails_the_engine_start(make_tier):
    # (else every lookup would miss and every store fail: the key is over kvpool's limit)
    model = "/mnt/models/" + "m" * 1000
    with pytest.raises(HostError) as failure:
        make_tier(model=model)
    assert failure.value.kind == "ValueError"
    message = failure.value.message
    assert "1024 bytes" in message and "key_prefix 'vllm'" in message
    assert "/mnt/models/mmm" in message
    # a name that leaves room for the longest key starts
    assert make_tier(model="/mnt/models/" + "m" * 800).info["class"].endswith("KVPoolTierManager")
