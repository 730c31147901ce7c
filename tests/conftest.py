"""Fixtures that start real kvpool clusters: a master and storage nodes as child processes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kvpool.local_cluster import DEFAULT_TENANT, LocalCluster
from kvpool.security.dev_pki import make_dev_pki
from kvpool.security.identity import Role
from kvpool.security.tokens import new_token

ClusterFactory = Callable[..., LocalCluster]


@pytest.fixture(scope="session", autouse=True)
def secure_by_default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every cluster of the session runs secure (TLS, tokens) with one throwaway CA, and the
    tests' own process is a client of tenant ``default`` of each: ``Client()`` and the CLI
    find the token and CA in the environment, as a user's would."""
    pki = make_dev_pki(tmp_path_factory.mktemp("pki"))
    token, record = new_token("tests", Role.CLIENT, tenant=DEFAULT_TENANT)
    admin, admin_record = new_token("tests-admin", Role.ADMIN)
    LocalCluster.shared_pki = pki
    LocalCluster.shared_tokens = (record, admin_record)
    saved = {name: os.environ.get(name) for name in SECURE_ENV}
    os.environ.update(KVPOOL_TOKEN=token, KVPOOL_TLS_CA=str(pki.ca), KVPOOL_TEST_ADMIN_TOKEN=admin)
    os.environ.pop("KVPOOL_TOKEN_FILE", None)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


SECURE_ENV = ("KVPOOL_TOKEN", "KVPOOL_TLS_CA", "KVPOOL_TEST_ADMIN_TOKEN", "KVPOOL_TOKEN_FILE")


@pytest.fixture(autouse=True)
def session_credentials_kept() -> Iterator[None]:
    """A test that makes its process a client of a cluster of its own (a benchmark run in
    process calls ``export_client_env``) leaves the session's credentials as it found them:
    else every later test's client presents a token its cluster never issued."""
    saved = {name: os.environ.get(name) for name in SECURE_ENV}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


#: The longest test files (seconds of a serial run on 2 cores), run first: scripts/test.sh
#: shares the files between two pytest-xdist workers (``--dist loadfile``), and starting the
#: long ones first lets both workers finish together instead of one waiting on the last.
LONGEST_FIRST = (
    "tests/vllm/test_e2e_vllm.py",  # ~250 s: six engine and server starts
    "tests/integration/test_drain.py",
    "tests/helm/test_chart.py",
    "tests/integration/test_nvme.py",
    "tests/bench/test_bench_compare.py",
    "tests/integration/test_semantics.py",
    "tests/ha/test_failover.py",
    "tests/integration/test_cli.py",
    "tests/integration/test_cli_arguments.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)
    shared = getattr(item, "funcargs", {}).get("shared_cluster")
    if report.failed and isinstance(shared, LocalCluster):
        # (a shared cluster outlives the test: its logs go with the failing test's report)
        report.sections.append(("logs of the shared cluster", shared.logs()))


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
        **options: Any,
    ) -> LocalCluster:
        cluster = LocalCluster(
            nodes,
            dram,
            master_args=master_args,
            node_args=node_args,
            env=env,
            run_dir=run_root / f"cluster{len(clusters)}",
            **options,
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


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB ext4 file system of its own (a loop device: the suite runs as root)."""
    image, mount = tmp_path / "disk.img", tmp_path / "small"
    with image.open("wb") as out:
        out.truncate(48 << 20)
    try:
        device = _run("losetup", "--find", "--show", str(image)).strip()
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.fail(f"a loop device is needed (run the suite as root): {error}")
    try:
        _run("mkfs.ext4", "-q", "-F", "-m", "0", device)
        mount.mkdir()
        _run("mount", device, str(mount))
        yield mount
    finally:
        # (lazily: this runs before the cluster's node, which holds files there, is stopped;
        # the file system and the loop device go once it has)
        subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, check=False)
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout
