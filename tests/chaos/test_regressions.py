"""What the chaos suite found, each pinned down so that it stays fixed.

1. ``Client.exists`` raised grpc's own ``ValueError: Cannot invoke RPC on closed channel!``
   (not a ``KVPoolError``) during ``scripts/chaos.sh --minutes 2 --seed 3``, round 2 (all
   links delayed 5 ms, etcd stopped for 6.7 s, node0's links duplicating and reordering): the
   client's threads share one ``MasterLink``, and when one of them opens a fresh channel (a
   new leader, or ``_new_channel`` after repeated failures) it closes the old one while
   another thread is about to call on it. The race is timing: here it is provoked directly,
   threads calling while another keeps asking for a fresh channel. Fixed: a call whose
   channel was replaced and closed under it goes again on the new one.

2. A get returned another object's bytes during ``scripts/chaos.sh --minutes 15 --seed 7``,
   round 42: a put cut off from its node (partition client0-node2) while the leader was cut
   off from etcd ended ``PutAborted``, yet its bytes, queued in the client's TCP connection,
   landed after the partition healed, over an object the new leader had placed in the same
   space. Replayed here with that round's faults on a cluster of seed 7 (timing decides
   whether the queued bytes hit a reused range: it may take several runs). Opt-in
   (``KVPOOL_CHAOS_REGRESSIONS=1``): it starts a cluster of its own, past the slice's budget.
   Over UCX (still the default) it stays open: resetting the client's connections
   (SO_LINGER 0) stopped it, but a storage node's UCX aborts ("Endpoint timeout", no peer
   error handling) on a reset under a reply it is sending. Over the checked stream (nodes
   with ``--data-port``, issue 17) it is closed: the node refuses a write whose capability
   ended, was sealed by its reservation's Forget, or comes from an older master term (the
   replay's node logs show the late writes refused with STALE_TERM), and the replay passes.

3. Removed objects came back during ``scripts/chaos.sh --minutes 30 --seed 7`` (30 keys):
   round 18 (node0 stalled 8.5 s, the leader cut off from etcd 3.2 s in), round 112 (node2
   cut off 9.4 s, the leader stalled 3.2 s in), round 167 (node0 stalled, etcd stalled). A
   removal answered while a node was away left only the leader knowing that the node must
   forget it; the leader then lost its term, and the next one adopted the object from the
   node's report. Fixed: the leader writes what its successor must refuse to etcd before it
   answers (master/tombstone_store.py). Replayed here with those rounds (opt-in, as 2).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from bench.chaos.cluster import Layout
from bench.chaos.faults import Fault
from bench.chaos.run import ChaosRun
from bench.chaos.topology import missing_prerequisite
from kvpool import Client
from kvpool.errors import KVPoolError


def test_a_call_racing_a_fresh_channel_is_retried_not_raised_untyped(cluster_factory):
    cluster = cluster_factory(1, "64MiB")
    untyped: list[BaseException] = []
    stop = threading.Event()
    with Client(cluster.master_address, timeout=10, metadata_lane=False) as client:
        client.put("racing", b"r")
        link = client._session.link

        def renew_channels() -> None:
            while not stop.is_set():
                link._new_channel()
                time.sleep(0.001)

        def call_exists() -> None:
            while not stop.is_set() and not untyped:
                try:
                    client.exists("racing")
                except KVPoolError:
                    pass  # a typed failure is allowed; an untyped one is the bug
                except Exception as error:
                    untyped.append(error)

        threads = [threading.Thread(target=renew_channels)]
        threads += [threading.Thread(target=call_exists) for _ in range(3)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not untyped:
            time.sleep(0.05)
        stop.set()
        for thread in threads:
            thread.join()
    assert untyped == []


REPLAY_OPT_IN = pytest.mark.skipif(
    os.environ.get("KVPOOL_CHAOS_REGRESSIONS", "0") in ("", "0"),
    reason="starts a chaos cluster of its own: set KVPOOL_CHAOS_REGRESSIONS=1",
)
#: Seed 7's round 42: etcd lossy, the leader cut off from etcd, client0 from node2.
ROUND_42 = [
    Fault("loss", 0.0, 4.2, "etcd", {"loss": 0.1}),
    Fault("partition-leader-etcd", 2.6, 6.4, "leader"),
    Fault("partition-client-node", 3.2, 6.5, "client0:node2"),
]


def replay_round_42(run_dir: Path, layout: Layout) -> list:
    with ChaosRun(7, layout=layout, run_dir=run_dir) as run:
        for _ in range(6):
            run.play(ROUND_42)
            time.sleep(5)  # the space of aborted puts is reused by later ones
        return run.findings().wrong_bytes


@REPLAY_OPT_IN
@pytest.mark.xfail(
    reason="a put's bytes queued in TCP land after its reservation ended (chaos seed 7): "
    "UCX one-sided writes are not checked by the node (issue 17)",
    strict=False,
)
def test_bytes_of_an_aborted_put_never_reach_an_object_placed_later(tmp_path: Path):
    if missing_prerequisite():
        pytest.skip(missing_prerequisite())
    wrong = replay_round_42(tmp_path, Layout())
    assert wrong == [], wrong[:3]


@REPLAY_OPT_IN
def test_over_the_checked_stream_an_aborted_put_s_bytes_never_land(tmp_path: Path):
    """The same round with nodes serving the checked stream (``--data-port``): the node
    refuses a write whose grant ended or was sealed by the Forget of its reservation, so the
    queued bytes reach nothing."""
    if missing_prerequisite():
        pytest.skip(missing_prerequisite())
    wrong = replay_round_42(tmp_path, Layout(node_args=("--data-port", "0")))
    assert wrong == [], wrong[:3]


#: Seed 7's rounds that brought removed objects back at the next leader.
ROUNDS_OF_RESURRECTIONS = [
    [
        Fault("stall-node", 0.0, 8.5, "node0"),
        Fault("partition-leader-etcd", 3.2, 5.4, "leader"),
    ],
    [
        Fault("partition-node", 0.0, 9.4, "node2"),
        Fault("stall-master", 3.2, 3.1, "leader"),
    ],
    [
        Fault("stall-node", 0.0, 9.7, "node0"),
        Fault("stall-etcd", 3.6, 3.2, "etcd"),
    ],
]


@REPLAY_OPT_IN
def test_a_removal_answered_while_a_node_was_away_sticks_at_the_next_leader(tmp_path: Path):
    if missing_prerequisite():
        pytest.skip(missing_prerequisite())
    with ChaosRun(7, layout=Layout(), run_dir=tmp_path) as run:
        for _ in range(3):
            for faults in ROUNDS_OF_RESURRECTIONS:
                run.play(faults)
                time.sleep(3)
        converged, why = run.converge(within=60)
        assert converged is not None, why
        assert run.resurrected() == []
        assert run.findings().wrong_bytes == []
