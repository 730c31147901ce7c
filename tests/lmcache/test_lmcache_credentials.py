"""The adapter takes credentials the way LMCache users set things: in ``adapter_params``.

- A token (or ``@file``) and the CA in the params are enough: nothing from the environment.
- The tenant of that token is the adapter's namespace: another tenant's adapter, storing
  the same LMCache keys, neither sees nor serves its chunks.
- A missing, malformed or unknown token is a clear error, at construction or on first use.
"""

from __future__ import annotations

import pytest
import torch
from lmcache_support import bits, load, lookup, object_keys, store

from kvpool.errors import NotAuthenticated
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


def test_an_unknown_token_is_reported_unhealthy_with_the_masters_reason(
    bare_environment, tenant_cluster, arena
):
    from kvpool.security.identity import Role
    from kvpool.security.tokens import new_token

    stranger, _ = new_token("stranger", Role.CLIENT, tenant="team-a")  # never registered
    params = {
        "master": tenant_cluster.master_address,
        "token": stranger,
        "tls_ca": str(tenant_cluster.pki.ca),
    }
    adapter = KVPoolL2Adapter(params, l1_memory_desc=arena.desc)
    try:
        status = adapter.report_status()
        assert not status["is_healthy"]
        assert "not one this cluster knows" in str(status), status
        with pytest.raises(NotAuthenticated):
            adapter._control.lease(["k"], 1.0, 5.0)
    finally:
        adapter.close()
