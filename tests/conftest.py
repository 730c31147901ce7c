"""Fixtures that start real kvpool clusters: a master and storage nodes as child processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from kvpool.local_cluster import LocalCluster

ClusterFactory = Callable[..., LocalCluster]


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "report_call", None)
    return report is None or report.failed


def _make_factory(run_root: Path, clusters: list[LocalCluster]) -> ClusterFactory:
    def make(
        nodes: int = 2,
        dram: str = "256MiB",
        *,
        master_args: Sequence[str] = (),
        node_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> LocalCluster:
        cluster = LocalCluster(
            nodes,
            dram,
            master_args=master_args,
            node_args=node_args,
            env=env,
            run_dir=run_root / f"cluster{len(clusters)}",
        )
        clusters.append(cluster)
        cluster.start()
        return cluster

    return make


def _stop_all(clusters: list[LocalCluster], show_logs: bool) -> None:
    for cluster in clusters:
        if show_logs:
            print(f"\n===== logs of {cluster.run_dir} =====\n{cluster.logs()}")
        cluster.stop()


@pytest.fixture
def cluster_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ClusterFactory]:
    """Starts clusters for one test; stops them after it (printing their logs on failure)."""
    clusters: list[LocalCluster] = []
    yield _make_factory(tmp_path, clusters)
    _stop_all(clusters, _failed(request))


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One two-node cluster shared by a module's tests that do not break it."""
    clusters: list[LocalCluster] = []
    cluster = _make_factory(tmp_path_factory.mktemp("shared"), clusters)(2, "640MiB")
    yield cluster
    _stop_all(clusters, show_logs=False)
