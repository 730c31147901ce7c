"""Which objects a chaos round checks for re-replication (bench/chaos/run.py, with
``KVPOOL_CHAOS_REREPLICATION=1``), and how the verdict says when that check proved nothing.

Until 2026-12 the sample was taken after the round's faults had healed: the newest 50 keys
acknowledged, mostly put after the fault or while its node was away, so on two live nodes from
the start; the check passed whether or not the master ever copied a replica. Now the round
samples before its first fault the objects then on two nodes, one of them a node its faults
target, and counts at convergence how many of those were still there and how many lay on
fewer than two nodes; a round that targeted a node and counted none says so."""

from __future__ import annotations

from bench.chaos.faults import Fault
from bench.chaos.run import (
    RoundReport,
    Verdict,
    newest_first,
    nodes_targeted,
    replication_never_checked,
    replication_note,
    replication_sample,
    replication_shortfall,
)

NODES = ["node0", "node1", "node2"]  # node2: the persistent node, with the disk


def key(client: int, thread: int, n: int) -> str:
    return f"client{client}-t{thread}-{n:07d}"


def stat_of(placement: dict[str, list[str]]):
    """A stat that finds the objects of ``placement`` (their nodes), and counts its calls."""
    calls: list[str] = []

    def nodes_of(k: str) -> list[str] | None:
        calls.append(k)
        return placement.get(k)

    return nodes_of, calls


# ---- the nodes a round targets


def test_a_node_named_by_a_fault_is_targeted():
    faults = [
        Fault("partition-node", 0.0, 8.0, "node0"),
        Fault("stall-node", 1.0, 7.0, "node1"),
    ]
    assert nodes_targeted(faults, NODES) == ["node0", "node1"]
    assert nodes_targeted([Fault("delay", 0.0, 5.0, "node2", {"delay_ms": 5})], NODES) == ["node2"]
    assert nodes_targeted([Fault("partition-client-node", 0.0, 5.0, "client1:node1")], NODES) == [
        "node1"
    ]


def test_faults_on_every_node_target_them_all():
    all_links = Fault("loss", 0.0, 6.0, "all", {"loss": 0.1})
    leader_from_nodes = Fault("partition-leader-nodes", 0.0, 4.0, "leader")
    assert nodes_targeted([all_links], NODES) == NODES
    assert nodes_targeted([leader_from_nodes], NODES) == NODES


def test_a_disk_fault_targets_the_persistent_node():
    for kind in ("disk-full", "disk-slow", "index-readonly"):
        assert nodes_targeted([Fault(kind, 0.0, 5.0)], NODES) == ["node2"]


def test_faults_on_masters_etcd_and_clients_alone_target_no_node():
    faults = [
        Fault("partition-leader-etcd", 0.0, 5.0, "leader"),
        Fault("stall-master", 0.0, 5.0, "standby"),
        Fault("stall-etcd", 1.0, 4.0, "etcd"),
        Fault("stall-client", 0.0, 12.0, "client0"),
        Fault("rate", 0.0, 5.0, "leader", {"mbit": 10}),
    ]
    assert nodes_targeted(faults, NODES) == []


# ---- which keys are likeliest to be left at convergence


def test_the_newest_keys_of_every_thread_come_first_in_turn():
    # (each worker thread removes its oldest live key as it adds one: its newest go last;
    # the histories are read client by client, so their order is not the order of puts)
    keys = [key(0, 0, n) for n in (1, 2, 3)] + [key(1, 2, n) for n in (7, 8)] + ["probe-1"]
    assert newest_first(keys) == [
        key(0, 0, 3),
        key(1, 2, 8),
        key(0, 0, 2),
        key(1, 2, 7),
        key(0, 0, 1),
        "probe-1",
    ]


def test_a_threads_keys_are_ordered_by_their_count_not_as_text():
    assert newest_first([key(0, 1, 9), "client0-t1-10"]) == ["client0-t1-10", key(0, 1, 9)]


# ---- the sample


def test_the_sample_keeps_the_objects_on_two_nodes_one_of_them_targeted():
    placement = {
        key(0, 0, 4): ["node0", "node1"],
        key(0, 0, 3): ["node1", "node2"],  # not on the targeted node
        key(0, 0, 2): ["node0"],  # already short: not "dropped below two" by this round
        key(0, 0, 1): ["node2", "node0"],
    }
    nodes_of, _ = stat_of(placement)
    assert replication_sample(placement, nodes_of, ["node0"]) == [key(0, 0, 4), key(0, 0, 1)]


def test_objects_removed_before_the_sample_are_skipped():
    nodes_of, _ = stat_of({key(0, 0, 1): ["node0", "node1"]})
    assert replication_sample([key(0, 0, 2), key(0, 0, 1)], nodes_of, ["node1"]) == [key(0, 0, 1)]


def test_a_round_that_targets_no_node_samples_every_object_on_two_nodes():
    placement = {
        key(0, 0, 3): ["node1", "node2"],
        key(0, 0, 2): ["node1"],
        key(0, 0, 1): ["node0", "node2"],
    }
    nodes_of, _ = stat_of(placement)
    assert replication_sample(placement, nodes_of, []) == [key(0, 0, 3), key(0, 0, 1)]


def test_the_sample_stats_the_newest_keys_only_and_keeps_a_bounded_number():
    keys = [key(0, t, n) for t in range(3) for n in range(100)]
    placement = {k: ["node0", "node1"] for k in keys}
    nodes_of, calls = stat_of(placement)
    sample = replication_sample(keys, nodes_of, ["node1"], stats=30, kept=10)
    assert sample == newest_first(keys)[:10]  # each thread's newest, in turn
    assert calls == sample  # (stops stat-ing once it has enough)
    nodes_of, calls = stat_of({})  # nothing left to find: still one pass of `stats` at most
    assert replication_sample(keys, nodes_of, ["node1"], stats=30, kept=10) == []
    assert len(calls) == 30


# ---- the count at convergence


def test_convergence_counts_the_sampled_objects_found_and_those_short():
    nodes_of, _ = stat_of(
        {
            "a": ["node0", "node1"],
            "b": ["node1"],  # below two: the master has not copied it back
            "c": ["node2", "node2"],  # two replicas on one node are one node
        }
    )
    assert replication_shortfall(["a", "b", "c", "removed"], nodes_of) == (3, 2)
    assert replication_shortfall([], nodes_of) == (0, 0)


# ---- saying when the check proved nothing


def test_a_round_that_targeted_a_node_and_counted_nothing_says_so():
    assert replication_note(["node0"], 40, 0) == (
        "replication check vacuous: all 40 objects sampled on node0 were removed by their "
        "clients before convergence"
    )
    assert replication_note(["node0", "node1"], 0, 0).startswith(
        "replication check vacuous: no object sampled"
    )
    assert replication_note(["node0"], 40, None).startswith("replication not checked")


def test_a_round_that_counted_objects_or_targeted_no_node_has_nothing_to_say():
    assert replication_note(["node0"], 40, 3) == ""
    assert replication_note([], 40, 0) == ""


def round_of(targeted: list[str], sampled: int | None, checked: int | None) -> RoundReport:
    return RoundReport("r", [], [], 1.0, "", 0.0, 0.0, targeted, sampled, checked, 0)


def test_the_verdict_fails_a_run_whose_node_rounds_all_counted_nothing():
    rounds = [round_of(["node0"], 30, 0), round_of(["node2"], 0, 0), round_of([], 50, 0)]
    assert replication_never_checked(rounds) == (
        "re-replication checked in vain: none of the 2 rounds that targeted a storage node "
        "counted a sampled object at convergence"
    )
    verdict = Verdict(
        findings={"wrong_bytes": 0, "untyped_errors": 0, "past_deadline": 0},
        rounds=rounds,
        split_brain=[],
    )
    assert verdict.problems() == [replication_never_checked(rounds)]


def test_one_node_round_that_counted_objects_is_enough_for_the_verdict():
    rounds = [round_of(["node0"], 30, 0), round_of(["node1"], 30, 12)]
    assert replication_never_checked(rounds) == ""


def test_without_re_replication_checks_or_node_rounds_there_is_nothing_to_fail():
    assert replication_never_checked([round_of(["node0"], None, None)]) == ""
    assert replication_never_checked([round_of([], 50, 0)]) == ""
    assert replication_never_checked([]) == ""
