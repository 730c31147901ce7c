"""``kvpool bench --compare`` in miniature: the harness runs each side, checks the bytes it
reads back, and reports. No timing is asserted: only that every number was measured."""

from __future__ import annotations

import argparse
import json
import os
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


def _compare(
    systems: list[str], tmp_path: Path, security: str = "secure", workloads=TINY, runs: int = 1
) -> dict:
    return compare.compare(
        placements=["same-host"],
        systems=systems,
        workloads=workloads,
        runs=runs,
        store_size=64 * MiB,
        log_dir=tmp_path / "logs",
        warmup=False,
        security=security,
    )


def test_kvpool_and_memcpy_side_by_side(tmp_path: Path) -> None:
    results = _compare(["kvpool", "memcpy"], tmp_path)

    assert results["security_of"] == {"kvpool": "secure"}
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
    assert "(secure (TLS, tokens))" in report.markdown(results)
    assert all(row["kvpool_security"] == "secure" for row in written["rows"])
    assert "security_rows" not in written  # one kvpool: nothing to set beside it


def test_security_both_measures_kvpool_secure_and_insecure_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _compare(["kvpool"], tmp_path, "both", [TINY[0], TINY[2]], runs=2)

    assert results["systems"] == ["kvpool", "kvpool-insecure"]
    assert results["security_of"] == {"kvpool": "secure", "kvpool-insecure": "insecure"}
    values = results["placements"]["same-host"]["values"]
    for workload, metric in (("64KiB", "put"), ("64KiB", "get"), ("exists", "exists")):
        for system in ("kvpool", "kvpool-insecure"):
            runs = values[workload][metric][system]
            assert len(runs) == 2 and all(value > 0 for value in runs)
    compared = report.security_rows(results)
    assert [(r["workload"], r["metric"]) for r in compared] == [
        ("64KiB", "put"),
        ("64KiB", "get"),
        ("exists", "exists"),
    ]
    for row in compared:
        assert row["secure"] > 0 and row["insecure"] > 0
        assert row["change"] == pytest.approx(row["secure"] / row["insecure"] - 1)
        assert row["within"] == (row["change"] >= -report.SECURITY_TOLERANCE)

    report.write_all(results, tmp_path / "compare.json", tmp_path / "compare.png")
    written = json.loads((tmp_path / "compare.json").read_text())
    assert len(written["security_rows"]) == 3
    report.print_table(results)
    printed = capsys.readouterr().out
    assert "secure (TLS, tokens) vs --insecure" in printed
    assert "| same-host | 64 KiB objects | get | GB/s |" in report.security_markdown(results)


def test_the_secure_servers_refuse_a_caller_without_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.kvpool_runner import CALLER_ENV, KvpoolServers
    from bench.netns import same_host
    from kvpool import Client
    from kvpool.errors import NotAuthenticated

    for name in CALLER_ENV:
        monkeypatch.delenv(name, raising=False)
    with KvpoolServers(same_host(), tmp_path, "16MiB", {**os.environ}) as servers:
        assert "--credentials" in servers.master.argv and "--insecure" not in servers.node.argv
        env = servers.client_env({**os.environ, "KVPOOL_TOKEN_FILE": "/elsewhere"})
        assert env["KVPOOL_TOKEN"] == servers.client_token and "KVPOOL_TOKEN_FILE" not in env
        config = json.loads(servers.client_argv()[-1])
        with Client(servers.address, token=servers.client_token, tls_ca=config["tls_ca"]) as c:
            assert c.exists_many(["bench/nothing"], lease=False) == [False]
        with (
            pytest.raises(NotAuthenticated),
            Client(servers.address, tls_ca=config["tls_ca"], timeout=3) as anonymous,
        ):
            anonymous.exists_many(["bench/nothing"], lease=False)
    with KvpoolServers(same_host(), tmp_path, "16MiB", {**os.environ}, secure=False) as servers:
        assert "--insecure" in servers.master.argv and "--insecure" in servers.node.argv
        assert json.loads(servers.client_argv()[-1])["tls_ca"] is None
        with Client(servers.address, timeout=10) as anonymous:
            assert anonymous.exists_many(["bench/nothing"], lease=False) == [False]


def test_the_security_option_is_checked() -> None:
    from bench import throughput

    parser = argparse.ArgumentParser()
    throughput.add_arguments(parser)
    args = parser.parse_args(["--compare", "--security", "both", "--systems", "kvpool"])
    assert compare._options(args)["security"] == "both"
    assert parser.parse_args(["--compare"]).security == "secure"
    for refused in (["insecure", "--update-docs"], ["both", "--profile", "4MiB"]):
        with pytest.raises(ValueError, match="--security"):
            compare._options(parser.parse_args(["--compare", "--security", *refused]))
    assert compare.kvpool_systems(["kvpool", "memcpy"], "both") == (
        ["kvpool", "kvpool-insecure", "memcpy"],
        {"kvpool": "secure", "kvpool-insecure": "insecure"},
    )
    assert compare.kvpool_systems(["memcpy"], "both") == (["memcpy"], {})


@pytest.mark.skipif(mooncake_available() is not None, reason="bench/setup_mooncake.sh not run")
def test_mooncake_side(tmp_path: Path) -> None:
    results = _compare(["mooncake"], tmp_path)

    medians = results["placements"]["same-host"]["medians"]
    assert medians["64KiB"]["get"]["mooncake"] > 0
    assert medians["exists"]["exists"]["mooncake"] > 0


#: (counts kept well inside the 64 MiB store: a timed phase that stored more than its ways'
#: removals had freed yet made the master evict some, and their gets then missed)
INFLIGHT = [
    Workload(
        "32x4KiB", "batches of 32 x 4 KiB", 4 * KiB, count=1024, batch=32, seconds=0.1,
        unit="ops/s",
    ),
    Workload(
        "32x4KiB-inflight", "batches of 32 x 4 KiB, calls in flight", 4 * KiB, count=1024,
        batch=32, seconds=0.2, unit="ops/s", inflight=(1, 4),
    ),
]  # fmt: skip


def test_calls_in_flight_are_measured_each_way_and_the_best_way_is_kvpools_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _compare(["kvpool", "memcpy"], tmp_path, workloads=INFLIGHT)

    measured = results["placements"]["same-host"]
    ways = {"threads x1", "threads x4", "asyncio x1", "asyncio x4"}
    for metric in ("put", "get"):  # every get was compared byte for byte with what was put
        found = measured["inflight"]["32x4KiB-inflight"][metric]
        assert set(found) == {"kvpool"}  # memcpy makes no calls to have in flight
        assert set(found["kvpool"]["medians"]) == ways
        assert all(value > 0 for value in found["kvpool"]["medians"].values())
        best = found["kvpool"]["best"]
        assert found["kvpool"]["medians"][best] == max(found["kvpool"]["medians"].values())
        assert measured["medians"]["32x4KiB-inflight"][metric] == {
            "kvpool": found["kvpool"]["medians"][best]
        }
    [put, get] = report.inflight_rows(results)
    assert (put["metric"], get["metric"]) == ("put", "get")
    assert put["single"]["kvpool"] > 0 and put["single_us"]["kvpool"] > 0  # beside: one batch
    assert put["vs_mooncake"] is None  # Mooncake did not run here
    assert "| same-host | put |" in report.inflight_markdown(results)
    report.print_table(results)
    assert "Calls in flight from one client process" in capsys.readouterr().out
    report.write_all(results, tmp_path / "compare.json", tmp_path / "compare.png")
    assert len(json.loads((tmp_path / "compare.json").read_text())["inflight_rows"]) == 2


@pytest.mark.skipif(mooncake_available() is not None, reason="bench/setup_mooncake.sh not run")
def test_mooncake_calls_in_flight(tmp_path: Path) -> None:
    results = _compare(["mooncake"], tmp_path, workloads=INFLIGHT[1:])

    found = results["placements"]["same-host"]["inflight"]["32x4KiB-inflight"]
    assert set(found["get"]["mooncake"]["medians"]) == {"threads x1", "threads x4"}
    assert results["placements"]["same-host"]["medians"]["32x4KiB-inflight"]["get"]["mooncake"] > 0
