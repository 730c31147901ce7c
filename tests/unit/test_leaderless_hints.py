"""While no master leads: a standby cut off from etcd names no leader (master/election.py
``leader``, which its /readyz and its refusals' hint say), and a storage node looking for the
leader says so at a bounded rate (storage_node/node.py ``LeaderSearch``). With real etcd,
masters and a node: tests/ha/test_leaderless.py."""

from __future__ import annotations

import time

import grpc
from state_helpers import FakeClock

from kvpool.master.election import Election
from kvpool.master.leader_gate import LeaderGate
from kvpool.storage_node.node import SEARCH_LOG_INTERVAL, LeaderSearch


def test_a_standby_names_the_leader_it_read_only_while_etcd_answers_it():
    election = Election(["127.0.0.1:1"], "c", "127.0.0.1:2", ttl=2)
    election.leader = "127.0.0.1:3"
    assert election.leader == "", "etcd never answered: nobody is known to lead"
    election._answered()
    assert election.leader == "127.0.0.1:3"
    gate = LeaderGate(election)
    assert gate.refusal("/Heartbeat") == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "not the leader: the leader is 127.0.0.1:3",
        "127.0.0.1:3",
    )
    # etcd has not answered for longer than the lease TTL: that leader's lease has ended
    # (or it leads out of sight): named no more, to nodes and clients either
    election._answered_at = time.monotonic() - election.contact_window - 0.1
    assert election.contact_window == election.ttl
    assert election.leader == ""
    assert gate.refusal("/Heartbeat") == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "not the leader: the leader is (none yet)",
        "",
    )
    # etcd answers again: named again (until the next read of the leader key says otherwise)
    election._answered()
    assert election.leader == "127.0.0.1:3"


def test_a_leader_names_itself_only_while_it_serves():
    election = Election(["127.0.0.1:1"], "c", "127.0.0.1:2", ttl=2)
    election.is_leader = True
    election.leader = election.address
    election._answered()
    election._valid_until = time.monotonic() + election.ttl
    assert election.serving()
    assert election.leader == "127.0.0.1:2"
    # its renewals fail: it refuses calls as it steps down, and must not send them back to
    # itself
    election._valid_until = time.monotonic() + election.margin / 2
    assert not election.serving()
    assert election.leader == ""
    assert LeaderGate(election).refusal("/Get") == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "not the leader: the leader is (none yet)",
        "",
    )


def test_a_node_says_it_looks_for_the_leader_at_once_then_once_a_minute_with_a_count():
    clock = FakeClock()
    search = LeaderSearch(clock=clock)
    assert search.look("") == 0, "the search begins: said"
    # an etcd outage: looked for twice a second, said once a minute
    said = []
    for _ in range(int(2 * SEARCH_LOG_INTERVAL) - 1):
        clock.advance(0.5)
        said.append(search.look(""))
    assert said == [None] * len(said)
    clock.advance(0.5)
    assert search.look("") == len(said), "a minute on: said, with the looks not said"
    assert search.look("") is None
    assert search.looks == len(said) + 3
    assert search.found() == len(said) + 3
    assert search.found() == 0, "no search under way"


def test_a_leader_newly_named_is_said_at_once_and_one_named_again_is_not():
    clock = FakeClock()
    search = LeaderSearch(clock=clock)
    assert search.look("") == 0
    assert search.look("m1") == 0, "a standby names a leader: said"
    # the node bounces between a master that names m1 and m1, which refuses it
    assert [search.look(hint) for hint in ("", "m1", "", "m1")] == [None] * 4
    assert search.look("m2") == 4, "another leader named: said, with what was not"
    search.found()
    assert search.look("m2") == 0, "a new search: said again"


def test_a_leader_turning_clients_away_still_answers_what_an_operator_asks():
    """(rebuilding its index, or hearing from no node: the status call says why)"""
    election = Election(["127.0.0.1:1"], "c", "127.0.0.1:2", ttl=2)
    election.is_leader = True
    election.leader = election.address
    election._answered()
    election._valid_until = time.monotonic() + 60
    assert election.serving()
    gate = LeaderGate(election, lambda: "rebuilding")
    for method in (
        "/kvpool.v1.Master/PutStart",
        "/kvpool.v1.Master/GetReplicas",
        "/kvpool.v1.Master/Drain",
    ):
        assert gate.refusal(method) == (grpc.StatusCode.UNAVAILABLE, "rebuilding", "")
    for method in (
        "/kvpool.v1.Master/ClusterStatus",
        "/kvpool.v1.Master/Story",
        "/kvpool.v1.Master/Heartbeat",
    ):
        assert gate.refusal(method) is None
    # a standby refuses them all, naming the leader
    election.is_leader = False
    assert gate.refusal("/kvpool.v1.Master/ClusterStatus") is not None
