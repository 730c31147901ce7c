"""The adapter takes credentials the way LMCache users set things: in ``adapter_params``.

- A token (or ``@file``) and the CA in the params are enough: nothing from the environment.
- The tenant of that token is the adapter's namespace: another tenant's adapter, storing
  the same LMCache keys, neither sees nor serves its chunks.
- A missing, malformed or unknown token, or a master of another CA, fails the adapter's
  construction with what to give; a master not answering yet does not.
"""

from __future__ import annotations

import pytest
import torch
from lmcache_support import bits, load, lookup, object_keys, store

from kvpool.lmcache import KVPoolL2Adapter

KIB = 1024
SECURE_ENV = ("KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE", "KVPOOL_TLS_CA")


@pytest.fixture
def bare_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine whose environment holds no kvpool credentials."""
    for name in SECURE_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def tenant_cluster(cluster_factory):
    return cluster_factory(1, "128MiB", tenants=("team-a", "team-b"))


def adapter_of(cluster, tenant: str, arena, tmp_path, *, as_file: bool = False):
    token = cluster.tenant_tokens[tenant]
    if as_file:
        path = tmp_path / f"{tenant}.token"
        path.write_text(token + "\n")
        token = f"@{path}"
    params = {"master": cluster.master_address, "token": token, "tls_ca": str(cluster.pki.ca)}
    return KVPoolL2Adapter(params, l1_memory_desc=arena.desc)


def test_a_token_and_ca_in_the_params_store_and_load_without_the_environment(
    bare_environment, tenant_cluster, arena, tmp_path
):
    adapter = adapter_of(tenant_cluster, "team-a", arena, tmp_path, as_file=True)
    try:
        keys = object_keys(4)
        sources = arena.objs(4, 64 * KIB)
        targets = arena.objs(4, 64 * KIB, random=False)
        assert store(adapter, keys, sources).is_successful()
        assert bits(lookup(adapter, keys), 4) == [True] * 4
        assert bits(load(adapter, keys, targets), 4) == [True] * 4
        for source, target in zip(sources, targets, strict=True):
            assert torch.equal(source.tensor, target.tensor)
        adapter.submit_unlock(keys)
        assert adapter.report_status()["is_healthy"], adapter.report_status()
    finally:
        adapter.close()


def test_another_tenants_adapter_neither_sees_nor_serves_the_chunks(
    bare_environment, tenant_cluster, arena, tmp_path
):
    mine = adapter_of(tenant_cluster, "team-a", arena, tmp_path)
    theirs = adapter_of(tenant_cluster, "team-b", arena, tmp_path)
    try:
        keys = object_keys(3)
        assert store(mine, keys, arena.objs(3, 16 * KIB)).is_successful()
        assert bits(lookup(theirs, keys), 3) == [False] * 3
        assert bits(load(theirs, keys, arena.objs(3, 16 * KIB, random=False)), 3) == [False] * 3
        assert bits(lookup(mine, keys), 3) == [True] * 3
        mine.submit_unlock(keys)
    finally:
        mine.close()
        theirs.close()


def test_a_malformed_token_in_the_params_is_refused_at_construction(
    bare_environment, tenant_cluster, arena
):
    params = {"master": tenant_cluster.master_address, "token": "not-a-token"}
    with pytest.raises(ValueError, match="token"):
        KVPoolL2Adapter(params, l1_memory_desc=arena.desc)


def test_a_token_the_master_does_not_know_fails_the_start_with_what_to_give(
    bare_environment, tenant_cluster, arena
):
    """Like the vLLM and SGLang tiers: credentials the master refuses would fail every
    lookup, store and load, so the engine is not started with them."""
    from kvpool.security.identity import Role
    from kvpool.security.tokens import new_token

    stranger, _ = new_token("stranger", Role.CLIENT, tenant="team-a")  # never registered
    params = {
        "master": tenant_cluster.master_address,
        "token": stranger,
        "tls_ca": str(tenant_cluster.pki.ca),
    }
    with pytest.raises(ValueError) as refused:
        KVPoolL2Adapter(params, l1_memory_desc=arena.desc)
    message = str(refused.value)
    assert "refuses this engine's credentials" in message, message
    assert "not one this cluster knows" in message, message  # (the master's reason)
    assert '"token" in adapter_params' in message, message


def test_a_master_certified_by_another_ca_fails_the_start(
    bare_environment, tenant_cluster, arena, tmp_path
):
    from kvpool.security.dev_pki import make_dev_pki

    other = make_dev_pki(tmp_path / "other-ca")
    params = {
        "master": tenant_cluster.master_address,
        "token": tenant_cluster.tenant_tokens["team-a"],
        "tls_ca": str(other.ca),
    }
    with pytest.raises(ValueError, match=r"is not trusted.*tls_ca"):
        KVPoolL2Adapter(params, l1_memory_desc=arena.desc)


def test_a_master_not_answering_yet_does_not_fail_the_start(
    bare_environment, tenant_cluster, arena
):
    """Engines start while the cluster is down: the adapter reports it unhealthy, and
    finds the master once it is up."""
    from kvpool.etcd_process import free_ports

    [port] = free_ports(1)  # (nothing listens there)
    params = {
        "master": f"127.0.0.1:{port}",
        "token": tenant_cluster.tenant_tokens["team-a"],
        "tls_ca": str(tenant_cluster.pki.ca),
        "health_timeout_s": 0.5,
    }
    adapter = KVPoolL2Adapter(params, l1_memory_desc=arena.desc)
    try:
        status = adapter.report_status()
        assert not status["is_healthy"] and not status["master_reachable"], status
    finally:
        adapter.close()
