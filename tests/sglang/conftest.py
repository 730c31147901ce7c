"""Fixtures of the SGLang HiCache backend tests: one real kvpool cluster for the module's
tests that do not break it, and backends built the way SGLang builds them.

SGLang is optional for kvpool but not for its test suite: ``scripts/install_sglang.sh``
installs its interface (``scripts/test.sh`` runs it, so CI has it). A missing or broken
install must fail the run, never skip these tests, so it is checked here first.
"""

from __future__ import annotations

import importlib

try:
    for needed in (
        "torch",
        "sglang.srt.mem_cache.hicache_storage",
        "sglang.srt.mem_cache.storage.backend_factory",
    ):
        importlib.import_module(needed)
except ImportError as error:
    raise ImportError(
        f"the SGLang tests need SGLang 0.5.23's HiCache interface and cannot import it "
        f"({error}): run scripts/install_sglang.sh"
    ) from error

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
from sglang_support import attach, storage_config

from bench.sglang_host_pool import MHAHostPool
from kvpool.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def sg_cluster(shared_cluster: LocalCluster) -> LocalCluster:
    return shared_cluster


@pytest.fixture
def make_backend(sg_cluster: LocalCluster) -> Iterator[Callable[..., HiCacheStorage]]:
    """Builds backends on ``sg_cluster`` (or ``master=``) through SGLang's factory; each is
    closed after its test."""
    made: list[HiCacheStorage] = []

    def make(host_pool: Any = None, master: str | None = None, **fields: Any) -> HiCacheStorage:
        pool = host_pool if host_pool is not None else MHAHostPool(16, 4, 2, 2, 64)
        backend = attach(storage_config(master or sg_cluster.master_address, **fields), pool)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()
