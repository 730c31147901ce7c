"""Fixtures for the Helm chart tests: the chart, its value sets and their cached renders.

Rendering and linting go through helm-python-sdk, which embeds Helm's own Go SDK (v4), so what
is tested is what `helm template` / `helm lint` would do; no helm binary or cluster is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "kvpool"
VALUES_DIR = CHART_DIR / "ci"
RELEASE = "kv"
NAMESPACE = "cache"

#: An old and a recent Kubernetes release; kubernetes-validate ships schemas for both.
KUBE_VERSIONS = ("1.27", "1.33")

#: Value sets every test runs against: the chart's defaults plus each file in helm/kvpool/ci/.
VALUE_FILES: dict[str, Path | None] = {"default": None} | {
    path.name.removesuffix("-values.yaml"): path
    for path in sorted(VALUES_DIR.glob("*-values.yaml"))
}


def load_values(name: str) -> dict[str, Any]:
    import yaml

    path = VALUE_FILES[name]
    return (yaml.safe_load(path.read_text()) or {}) if path else {}


@dataclass
class Render:
    """One rendered release: the raw template outputs and the Kubernetes objects in them."""

    name: str
    values: dict[str, Any]
    files: dict[str, str]
    release: str = RELEASE
    namespace: str = NAMESPACE

    @property
    def fullname(self) -> str:
        return f"{self.release}-kvpool"

    @property
    def master_address(self) -> str:
        return f"{self.fullname}-master.{self.namespace}.svc:50051"

    @property
    def objects(self) -> list[dict[str, Any]]:
        import yaml

        return [
            doc
            for path, text in sorted(self.files.items())
            if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text)
            if doc
        ]

    @property
    def notes(self) -> str:
        return self.files["kvpool/templates/NOTES.txt"]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def workloads(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]

    def container(self, component: str) -> dict[str, Any]:
        """The main container of the master ("master") or the storage nodes ("node")."""
        for workload in self.workloads():
            labels = workload["spec"]["template"]["metadata"]["labels"]
            if labels.get("app.kubernetes.io/component") == component:
                (container,) = workload["spec"]["template"]["spec"]["containers"]
                return container
        raise AssertionError(f"no {component} workload rendered")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`value_set` runs a test once per value set; `kube_version` once per Kubernetes version."""
    if "value_set" in metafunc.fixturenames:
        metafunc.parametrize("value_set", list(VALUE_FILES))
    if "kube_version" in metafunc.fixturenames:
        metafunc.parametrize("kube_version", KUBE_VERSIONS)


def full_values(chart: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The chart's defaults coalesced with ``values``, as an install would use them."""
    return chart.merge_values(values)


@pytest.fixture(scope="session")
def chart_dir() -> Path:
    return CHART_DIR


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def value_sets() -> dict[str, dict[str, Any]]:
    return {name: load_values(name) for name in VALUE_FILES}


@pytest.fixture(scope="session")
def kube_versions() -> tuple[str, ...]:
    return KUBE_VERSIONS


@pytest.fixture(scope="session")
def chart() -> Iterator[Any]:
    import helm_python as helm  # the `test` extra installs it: missing, the chart tests fail

    with helm.Chart.load(str(CHART_DIR)) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: Any) -> Callable[[dict[str, Any]], dict[str, str]]:
    """Renders the chart with some values (raising Helm's error when the values are rejected)."""

    def run(values: dict[str, Any]) -> dict[str, str]:
        return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)

    return run


@pytest.fixture(scope="session")
def render_release(
    chart: Any, render: Callable[[dict[str, Any]], dict[str, str]]
) -> Callable[[dict[str, Any]], Render]:
    """Renders the chart with some values, as ``renders`` does a value set."""
    return lambda values: Render("custom", full_values(chart, values), render(values))


@pytest.fixture(scope="session")
def render_as(chart: Any) -> Callable[[dict[str, Any], str, str], Render]:
    """Renders the chart with some values as release ``name`` in ``namespace``."""

    def run(values: dict[str, Any], name: str, namespace: str) -> Render:
        files = chart.render(values, name=name, namespace=namespace, is_install=True)
        return Render("custom", full_values(chart, values), files, name, namespace)

    return run


@pytest.fixture(scope="module")
def renders(
    chart: Any,
    render: Callable[[dict[str, Any]], dict[str, str]],
    value_sets: dict[str, dict[str, Any]],
) -> dict[str, Render]:
    """Every value set rendered once per test module."""
    return {
        name: Render(name, full_values(chart, values), render(values))
        for name, values in value_sets.items()
    }
