"""How the chaos verdict tells a leak from a high-water mark (bench/chaos/run.py ``leaks``):
a master's memory rises and falls with its terms as leader, so comparing the first sample
with the last flagged whichever master led at the end; the verdict compares the peak of the
last third of the run with the peak of the first, its role's (every master's)."""

from __future__ import annotations

from bench.chaos.monitor import Usage
from bench.chaos.run import RSS_GROWTH_KIB, leaks

MIB = 1024


def series(*rss_mib: int, threads: int = 20) -> list[Usage]:
    return [Usage(rss * MIB, threads) for rss in rss_mib]


def test_memory_that_rises_and_falls_with_leadership_is_no_leak():
    # (the 15-minute run of seed 13: 67-90 MiB as a standby, 173-180 MiB as the leader)
    master = series(70, 175, 80, 178, 72, 90, 176, 85, 180, 170)
    assert leaks({"master2": master}) == []


def test_memory_whose_peaks_keep_rising_is_a_leak():
    growth = RSS_GROWTH_KIB // MIB
    leaking = series(100, 110, 120, 130, 100 + growth, 110 + growth, 150 + growth, 160 + growth)
    (found,) = leaks({"node1": leaking})
    assert found.startswith("node1: resident memory peaked at 110 MiB in the first third")


def test_a_master_that_stood_by_early_and_leads_late_is_measured_against_the_masters():
    # (seed 15, 2026-12-04: master1 peaked at 80 MiB in the first third as a standby, 180 MiB
    # in the last as the leader, while master0 had held 106 MiB early; thirds of 3 samples)
    masters = {
        "master0": series(106, 90, 100, 114, 110, 184),
        "master1": series(80, 70, 94, 90, 180, 150),
        "master2": series(101, 90, 122, 100, 156, 120),
    }
    assert leaks(masters) == []
    alone = {"master1": masters["master1"]}
    assert len(leaks(alone)) == 1  # (measured against itself, it looked like a leak)


def test_with_two_samples_the_last_is_compared_with_the_first():
    growth = RSS_GROWTH_KIB // MIB
    assert leaks({"etcd": series(50, 50 + growth)}) == []
    assert len(leaks({"etcd": series(50, 51 + growth)})) == 1
    assert leaks({"etcd": series(50)}) == []  # (one sample: nothing to compare)


def test_threads_grown_over_the_run_are_a_leak():
    assert leaks({"master0": [Usage(MIB, 20), Usage(MIB, 90), Usage(MIB, 21)]}) == []
    (found,) = leaks({"master0": [Usage(MIB, 20), Usage(MIB, 25), Usage(MIB, 60)]})
    assert found == "master0: threads 20 -> 60"
