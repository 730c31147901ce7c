"""Fixtures of the vLLM tier tests: a vLLM scheduler process (``tier_host.py`` in
.venv-vllm), a real kvpool cluster, and tiers built by vLLM in that process.

vLLM lives in its own virtualenv (scripts/install_vllm.sh says why), so the tests drive it
by subprocess. A missing install fails these tests with the fix; it never skips them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
from tier_driver import TIER, Tier, TierHost

from kvpool.local_cluster import LocalCluster


@pytest.fixture(scope="session")
def host() -> Iterator[TierHost]:
    """One vLLM scheduler-side process for the session (importing vLLM takes a while)."""
    process = TierHost()
    yield process
    process.close()


@pytest.fixture(scope="session")
def tier_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A master and two storage nodes for the tests that do not break them."""
    cluster = LocalCluster(2, "256MiB", run_dir=tmp_path_factory.mktemp("vllm-cluster"))
    cluster.start()
    yield cluster
    for node in cluster.nodes:
        node.kill()  # test data only: skip the graceful drain of read leases
    cluster.stop()


_models = itertools.count()


@pytest.fixture
def make_tier(host: TierHost, tier_cluster: LocalCluster) -> Iterator[Callable[..., Tier]]:
    """Builds kvpool tiers in ``host`` (vLLM's spec and tier factory) on ``tier_cluster``
    (or ``master=``); each test's tiers get a model name of their own, so their keys never
    meet another test's; shut down after the test."""
    made: list[Tier] = []
    model = f"kvpool-test/model-{next(_models)}"

    def make(*, slots: int = 8, slot_bytes: int = 64 * 1024, **settings: object) -> Tier:
        settings.setdefault("master", tier_cluster.master_address)
        options = ("model", "kv_events", "unset_env", "blocks_per_chunk", "kv_cache_layout")
        create = {k: settings.pop(k) for k in options if k in settings}
        create.setdefault("model", model)
        tier = Tier(host, tier={**TIER, **settings}, slots=slots, slot_bytes=slot_bytes, **create)
        made.append(tier)
        return tier

    yield make
    for tier in made:
        if not tier.closed:
            tier.shutdown()
