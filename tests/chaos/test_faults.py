"""Under partitions, bad links, stalls past every TTL and broken disks, with clients putting,
getting and removing all along: no wrong byte, no untyped error, every call within its
deadline, never two leaders, the cluster whole again soon after each fault heals, and at the
end every acknowledged object read back exact, with no process grown.

The tests share one cluster (``conftest.chaos``) and run in order; the last one judges the
whole slice. ``scripts/chaos.sh`` is the long run of the same engine on random schedules.
"""

from __future__ import annotations

import time

from bench.chaos.faults import Fault
from bench.chaos.run import CONVERGE_WITHIN, ChaosRun, RoundReport


def assert_whole_again(run: ChaosRun, report: RoundReport) -> None:
    assert report.converged_s is not None, (
        f"{report.name}: not converged {CONVERGE_WITHIN:.0f}s after healing: {report.waiting_for}"
    )
    findings = run.findings()
    assert findings.wrong_bytes == [], findings.wrong_bytes[:3]
    assert findings.untyped == [], findings.untyped[:3]
    assert findings.late == [], findings.late[:3]
    assert run.watch is not None and run.watch.overlaps() == []
    assert findings.by_result["put:ok"] > 0 and findings.by_result["get:ok"] > 0


def led(run: ChaosRun, name: str, start: float, end: float) -> bool:
    assert run.watch is not None
    return any(start <= t <= end and yes for t, yes in run.watch.samples[name])


def test_a_leader_cut_off_from_etcd_steps_down_before_another_is_elected(chaos: ChaosRun):
    leader = chaos.stage.leader() if chaos.stage else ""
    report = chaos.play([Fault("partition-leader-etcd", 0.0, 7.0, "leader")], "leader-etcd")
    assert report.targets == [leader]
    others = [m for m in chaos.stage.masters() if m != leader] if chaos.stage else []
    assert any(led(chaos, m, report.started, report.healed) for m in others), (
        "another master took over while the leader was cut off from etcd"
    )
    assert_whole_again(chaos, report)


def test_a_node_cut_off_from_everyone_and_a_client_from_its_node(chaos: ChaosRun):
    report = chaos.play(
        [
            Fault("partition-node", 0.0, 8.0, "node0"),  # past the node TTL (5 s)
            Fault("partition-client-node", 1.0, 5.0, "client1:node1"),
            Fault("partition-leader-nodes", 9.0, 4.0, "leader"),
        ],
        "partitions",
    )
    assert_whole_again(chaos, report)


def test_lossy_slow_duplicating_reordering_links(chaos: ChaosRun):
    report = chaos.play(
        [
            Fault("loss", 0.0, 6.0, "all", {"loss": 0.10}),
            Fault("delay", 0.0, 8.0, "node1", {"delay_ms": 50, "jitter_ms": 20}),
            Fault("duplicate-reorder", 1.0, 6.0, "all", {"duplicate": 0.05, "reorder": 0.2}),
            Fault("rate", 2.0, 6.0, "client0", {"mbit": 10}),
            Fault("loss", 2.0, 6.0, "etcd", {"loss": 0.01}),
        ],
        "links",
    )
    assert_whole_again(chaos, report)


def test_stalls_of_a_master_a_node_etcd_and_a_client_past_their_ttls(chaos: ChaosRun):
    report = chaos.play(
        [
            Fault("stall-master", 0.0, 5.0, "leader"),  # etcd lease: 2 s
            Fault("stall-node", 0.0, 7.0, "node1"),  # node TTL: 5 s
            Fault("stall-client", 0.5, 11.5, "client0"),  # client TTL: 10 s
            Fault("stall-etcd", 6.0, 4.0, "etcd"),
        ],
        "stalls",
    )
    stalled = {stall.process for stall in chaos.stalls}
    assert {"node1", "client0", "etcd"} <= stalled
    assert_whole_again(chaos, report)


def test_a_full_a_slow_and_a_read_only_disk_under_the_persistent_segment(chaos: ChaosRun):
    report = chaos.play(
        [
            Fault("disk-full", 0.0, 5.0),
            Fault("disk-slow", 5.5, 5.0),
            Fault("index-readonly", 11.0, 5.0),
        ],
        "disks",
    )
    assert_whole_again(chaos, report)


def test_the_slice_lost_no_acknowledged_object_and_no_process_grew(chaos: ChaosRun):
    began = time.monotonic()
    verdict = chaos.finish()
    print(
        f"\nchaos slice: {verdict.findings['operations']} operations, "
        f"{verdict.faults_injected} faults, {verdict.read_back} acknowledged objects read back, "
        f"longest call {verdict.findings['longest_call_s']}s, converged "
        f"{[r.converged_s for r in verdict.rounds]}s after each round "
        f"(judged in {time.monotonic() - began:.1f}s)"
    )
    assert verdict.read_back > 100
    assert verdict.lost == [], verdict.lost[:10]
    assert verdict.evicted == [], verdict.evicted[:10]
    assert verdict.resurrected == [], verdict.resurrected[:10]
    assert verdict.unreadable == {}, list(verdict.unreadable.items())[:10]
    assert verdict.leaks == []
    assert verdict.problems() == []
