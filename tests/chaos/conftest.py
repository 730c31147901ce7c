"""The chaos suite's slice: one cluster in network namespaces for the module, rounds of faults
played on it one test at a time, the whole slice judged at the end (``bench/chaos``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos.cluster import Layout
from bench.chaos.run import ChaosRun
from bench.chaos.topology import missing_prerequisite

#: The slice's seed: the clients' choices (keys, sizes, operations) and the switch's draws.
SEED = 24


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosRun]:
    reason = missing_prerequisite()
    if reason:
        pytest.skip(reason)
    run_dir: Path = tmp_path_factory.mktemp("chaos")
    with ChaosRun(SEED, Layout(), run_dir) as run:
        yield run
