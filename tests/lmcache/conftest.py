"""Fixtures of the LMCache adapter tests: one real kvpool cluster for the session, an L1
arena per test, and adapters that are closed after their test.

LMCache is optional for kvpool but not for its test suite: ``scripts/install_lmcache.sh``
installs it (``scripts/test.sh`` runs it, so CI has it). A missing or broken install must fail
the run, never skip these tests, so it is checked here, before pytest imports any test module
of this directory, with advice more useful than a bare ImportError.
"""

from __future__ import annotations

import importlib

try:
    for needed in (
        "torch",
        "lmcache.v1.distributed.l2_adapters.base",
        "lmcache.v1.distributed.storage_manager",
    ):
        importlib.import_module(needed)
except ImportError as error:
    raise ImportError(
        f"the LMCache tests need LMCache 0.5.6 and the `lmcache` extra, and cannot import them "
        f"({error}): run scripts/install_lmcache.sh"
    ) from error

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lmcache_support import Arena

from kvpool.lmcache import KVPoolL2Adapter
from kvpool.local_cluster import LocalCluster

ARENA_BYTES = 64 * 1024 * 1024


def pytest_configure(config: pytest.Config) -> None:
    # LMCache's logging setup uses a deprecated OpenTelemetry handler: not ours to fix.
    config.addinivalue_line(
        "filterwarnings", "ignore:.*LoggingHandler.*opentelemetry:DeprecationWarning"
    )


@pytest.fixture(scope="session")
def lm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A master and two storage nodes shared by the tests that do not break them."""
    cluster = LocalCluster(2, "256MiB", run_dir=tmp_path_factory.mktemp("lmcache-cluster"))
    cluster.start()
    yield cluster
    for node in cluster.nodes:
        node.kill()  # test data only: skip the graceful drain of outstanding read leases
    cluster.stop()


@pytest.fixture
def arena() -> Arena:
    return Arena(ARENA_BYTES)


@pytest.fixture
def make_adapter(lm_cluster: LocalCluster, arena) -> Iterator[Callable[..., object]]:
    """Builds ``KVPoolL2Adapter`` s on ``lm_cluster`` (or ``master=``) over the test's arena."""
    made: list[KVPoolL2Adapter] = []

    def make(l1_memory_desc=None, **params) -> KVPoolL2Adapter:
        params.setdefault("master", lm_cluster.master_address)
        adapter = KVPoolL2Adapter(params, l1_memory_desc=l1_memory_desc or arena.desc)
        made.append(adapter)
        return adapter

    yield make
    for adapter in made:
        adapter.close()


@pytest.fixture
def lmcache_env(tmp_path: Path) -> dict[str, str]:
    """Environment for lmcache subprocesses: quiet banner, private temp dir."""
    return {**os.environ, "LMCACHE_DISABLE_BANNER": "1", "TMPDIR": str(tmp_path)}
