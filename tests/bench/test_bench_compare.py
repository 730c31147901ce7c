"""``kvpool bench --compare`` in miniature: the harness runs each side, checks the bytes it
reads back, and reports. No timing is asserted: only that every number was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import compare, report
from bench.compare import Workload
from bench.mooncake_runner import mooncake_available

KiB, MiB = 1024, 1024 * 1024
TINY = [
    Workload("64KiB", "64 KiB objects", 64 * KiB, count=8),
    Workload("2x64KiB", "2 clients x 64 KiB objects", 64 * KiB, count=4, clients=2),
    Workload(
        "exists", "exists", 4 * KiB, count=64, batch=32, seconds=0.05, unit="keys/s",
        exists_batch=32,
    ),
]  # fmt: skip


def _compare(systems: list[str], tmp_path: Path) -> dict:
    return compare.compare(
        placements=["same-host"],
        systems=systems,
        workloads=TINY,
        runs=1,
        store_size=64 * MiB,
        log_dir=tmp_path / "logs",
        warmup=False,
    )


def test_kvpool_and_memcpy_side_by_side(tmp_path: Path) -> None:
    results = _compare(["kvpool", "memcpy"], tmp_path)

    medians = results["placements"]["same-host"]["medians"]
    for workload in ("64KiB", "2x64KiB"):
        for metric in ("put", "get"):
            assert set(medians[workload][metric]) == {"kvpool", "memcpy"}
            assert all(value > 0 for value in medians[workload][metric].values())
    assert set(medians["exists"]["exists"]) == {"kvpool"}  # memcpy has no metadata
    rows = report.rows(results)
    assert len(rows) == 5
    assert all(row["vs_memcpy"] for row in rows if row["metric"] != "exists")

    report.write_all(results, tmp_path / "compare.json", tmp_path / "compare.png")
    written = json.loads((tmp_path / "compare.json").read_text())
    assert written["rows"] and written["placements"]["same-host"]["values"]
    assert "| same-host | 64 KiB objects | put | GB/s |" in report.markdown(results)


@pytest.mark.skipif(mooncake_available() is not None, reason="bench/setup_mooncake.sh not run")
def test_mooncake_side(tmp_path: Path) -> None:
    results = _compare(["mooncake"], tmp_path)

    medians = results["placements"]["same-host"]["medians"]
    assert medians["64KiB"]["get"]["mooncake"] > 0
    assert medians["exists"]["exists"]["mooncake"] > 0
