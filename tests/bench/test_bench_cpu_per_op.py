"""``kvpool bench --cpu-per-op`` in miniature: every process's CPU time is read around each
phase and divided by the operations served, and the in-process breakdown of the master runs
its layers. No figure is asserted: only that each was measured, and how the table is made."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from bench import core_per_op, cpu_per_op, profile, throughput
from bench.mooncake_runner import mooncake_available

MiB = 1024 * 1024


def test_kvpool_cpu_per_operation_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--cpu-per-op", "--systems", "kvpool", "--runs", "1", "--cpu-seconds", "0.3"]
    argv += ["--store-size", "256MiB", "--out-dir", str(tmp_path)]

    assert throughput.main(argv) == 0

    results = json.loads((tmp_path / "cpu_per_op.json").read_text())
    assert results["systems"] == ["kvpool"] and results["security_of"] == {"kvpool": "secure"}
    assert [(s["workload"], s["metric"]) for s in results["samples"]] == [
        ("32x64KiB", "put"),
        ("32x64KiB", "get"),
        ("32x64KiB", "remove"),
        ("exists", "exists"),
    ]  # the warm-up run is not among them
    for sample in results["samples"]:
        assert sample["ops"] > 0 and sample["seconds"] > 0
        assert set(sample["cpu"]) == {"master", "storage", "client"}
        assert all(seconds >= 0 for seconds in sample["cpu"].values())
        if sample["metric"] != "remove":  # (a removal is two calls of the client's)
            assert sample["cpu"]["client"] > 0  # it ran the whole phase
    rows = {row["op"]: row for row in results["rows"]}
    assert list(rows) == ["put", "get", "exists", "remove"]
    assert rows["remove"]["ops_per_s"] > 0 and rows["remove"]["runs"] == 1
    assert rows["put"]["master_us"] > 0  # every put goes through the master
    assert rows["exists"]["master_us"] > 0 and rows["exists"]["ops_per_s"] > 0
    assert set(results["idle_cores"]["kvpool"]) == {"master", "storage", "client"}
    printed = capsys.readouterr().out
    assert "master µs/op" in printed and "one master core tops out near" in printed
    assert "| put | kvpool |" in cpu_per_op.markdown(results)


@pytest.mark.skipif(
    profile.py_spy() is None or os.geteuid() != 0, reason="py-spy (root) not available"
)
def test_a_profile_of_the_master_during_its_put_phases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--cpu-per-op", "--cpu-profile", "--systems", "kvpool", "--runs", "1"]
    argv += ["--cpu-seconds", "0.3", "--store-size", "256MiB", "--out-dir", str(tmp_path)]

    assert throughput.main(argv) == 0

    results = json.loads((tmp_path / "cpu_per_op.json").read_text())
    [recorded] = map(Path, results["profiles"])  # the measured run's put phase, not the warm-up
    assert recorded.parent == tmp_path / "profile" and recorded.stat().st_size > 0
    assert f"kvpool's master during a put phase ({recorded})" in capsys.readouterr().out


def test_each_figure_is_the_median_over_runs_of_cpu_over_operations() -> None:
    def sample(run: str, ops: int, master: float, system: str = "kvpool") -> dict:
        cpu = {"master": master, "storage": 0.0, "client": 2 * master}
        return {"run": run, "metric": "put", "system": system, "ops": ops, "seconds": 1.0,
                "cpu": cpu}  # fmt: skip

    samples = [sample("0", 1000, 0.02), sample("1", 2000, 0.02), sample("2", 1000, 0.05)]
    samples += [sample("0", 1000, 0.005, "mooncake")]

    rows = cpu_per_op.rows(samples)

    kvpool, mooncake = rows
    assert kvpool["runs"] == 3 and kvpool["ops_per_s"] == 1000
    assert kvpool["master_us"] == pytest.approx(20.0)  # median of 20, 10 and 50 us
    assert kvpool["client_us"] == pytest.approx(40.0)
    assert mooncake["master_us"] == pytest.approx(5.0)
    assert cpu_per_op.master_ratios({"rows": rows}) == {"put": pytest.approx(4.0)}
    assert cpu_per_op.ceilings({"rows": rows})[0].startswith(
        "kvpool: one master core tops out near 50,000 object puts/s"
    )


def test_the_options_are_checked() -> None:
    parser = argparse.ArgumentParser()
    throughput.add_arguments(parser)

    chosen = cpu_per_op.options(parser.parse_args(["--cpu-per-op"]))
    assert chosen["systems"] == ["kvpool", "mooncake"]  # memcpy has no master to measure
    assert chosen["seconds"] == cpu_per_op.PHASE_SECONDS
    for refused in (["--systems", "memcpy"], ["--cpu-seconds", "0"], ["--runs", "0"]):
        with pytest.raises(ValueError):
            cpu_per_op.options(parser.parse_args(["--cpu-per-op", *refused]))
    put, exists = cpu_per_op.workloads(2.0, 4096 * MiB)
    assert (put.size, put.batch, put.count) == (64 * 1024, 32, 26208)  # 0.4 of 4 GiB, in batches
    assert (exists.exists_batch, exists.count) == (256, 1024)


def test_the_master_breaks_down_into_its_core_and_its_handlers() -> None:
    results, profiled = core_per_op.measure(rounds=1, profile=True)

    assert set(results) == {"core", "handlers", "beyond core"}
    for name in ("core", "handlers"):
        layer = results[name]
        assert set(layer) == set(core_per_op.STEPS)
        assert all(value > 0 for value in layer.values())
        assert layer["put (the three)"] == pytest.approx(
            sum(layer[step] for step in core_per_op.PUT_STEPS)
        )
    for step, difference in results["beyond core"].items():  # (one round: no median to take)
        assert difference == pytest.approx(results["handlers"][step] - results["core"][step])
    assert profiled is not None and "put_start" in profiled


@pytest.mark.skipif(mooncake_available() is not None, reason="bench/setup_mooncake.sh not run")
def test_mooncake_beside_kvpool(tmp_path: Path) -> None:
    results = cpu_per_op.measure(
        ["kvpool", "mooncake"], runs=1, seconds=0.3, store_size=256 * MiB,
        log_dir=tmp_path / "logs", warmup=False,
    )  # fmt: skip

    by = {(row["op"], row["system"]): row for row in results["rows"]}
    ops = ("put", "get", "exists", "remove")
    assert set(by) == {(op, s) for op in ops for s in ("kvpool", "mooncake")}
    for op in ops:  # (a phase this short may fall between clock ticks
        # of a process that works little: only the client, busy throughout, must show;
        # removes end when the keys put run out, often within one tick)
        assert by[op, "mooncake"]["ops_per_s"] > 0
        assert by[op, "mooncake"]["client_us"] > 0 or op == "remove"
    assert set(cpu_per_op.master_ratios(results)) <= set(ops)
    assert results["mooncake_version"]
