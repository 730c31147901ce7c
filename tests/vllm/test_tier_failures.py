"""Storage nodes that stall or die under the tier: loads become misses by their deadline,
never a wrong byte in a slot reported loaded, never a write into the primary after the job
was answered, and never a scheduler call that waits on the network.
"""

from __future__ import annotations

import signal
import time

from helpers import wait_until

from kvpool import Client

MIB = 1024 * 1024
SENTINEL = 0x5A
#: A scheduler call that takes longer than this waited on something: they must not.
PROMPT = 0.05
#: How much later than its deadline a job may end on a loaded machine: the tests tell "at
#: the deadline" from "never", not fast from slow.
SLACK = 5.0
#: TCP, no mapping of the nodes' memory: a stopped node stalls its transfers (shared-memory
#: transports, and mapping, would read its memory regardless).
TCP_ONLY = {"ucx_config": {"TLS": "tcp"}, "same_host_mapping": False}


def _stored(make_tier, cluster, count: int, timeout: float, **settings):
    """A TCP-only tier on ``cluster`` with ``count`` chunks of 1 MiB stored from slots
    0..count-1 (keys 0..count-1); their digests."""
    tier = make_tier(
        master=cluster.master_address,
        slots=2 * count,
        slot_bytes=MIB,
        load_timeout_s=timeout,
        **TCP_ONLY,
        **settings,
    )
    keys = list(range(count))
    digests = tier.fill(slots=keys, seed=count)["digests"]
    assert tier.run("store", 1, keys=keys, slots=keys)["success"]
    return tier, keys, digests


def test_a_stalled_node_gives_a_failed_load_at_the_deadline_and_no_late_writes(
    cluster_factory, make_tier
):
    timeout = 1.0
    cluster = cluster_factory(1, "64MiB")
    tier, keys, digests = _stored(make_tier, cluster, 4, timeout)
    targets = [4, 5, 6, 7]
    tier.set(slots=targets, byte=SENTINEL)
    node = cluster.nodes[0]
    node.signal(signal.SIGSTOP)
    try:
        submitted = tier.load(job_id=2, keys=keys, slots=targets)
        assert submitted["submit_s"] < PROMPT  # the scheduler does not wait for the node
        waited = tier.wait(job_ids=[2])
        (result,) = waited["results"]
        assert not result["success"] and result["successful_keys"] is None
        assert timeout * 0.8 < waited["elapsed_s"] < timeout + SLACK
        assert waited["longest_poll_s"] < PROMPT  # nor does polling for it
        assert tier.stats()["stats"]["load_deadlines_missed"] >= 1
    finally:
        node.signal(signal.SIGCONT)
    # the node answers the abandoned gets once it runs again: none may land in the slots
    fresh = [0, 1, 2, 3]
    tier.set(slots=fresh, byte=0)
    assert wait_until(lambda: tier.run("load", 3, keys=keys, slots=fresh)["success"], 30.0)
    assert tier.digest(slots=fresh)["digests"] == digests
    assert tier.uniform(slots=targets)["bytes"] == [SENTINEL] * 4


def test_a_node_killed_mid_load_gives_misses_for_its_chunks_and_the_rest_whole(
    cluster_factory, make_tier
):
    timeout = 3.0
    cluster = cluster_factory(2, "64MiB")
    count = 16
    tier, keys, digests = _stored(make_tier, cluster, count, timeout, replicas=1)
    names = tier.names(keys=keys)["names"]
    with Client(cluster.master_address) as client:
        on_victim = [client.stat(name).replicas[0].node_id == "node1" for name in names]
    assert any(on_victim) and not all(on_victim), "placement put every chunk on one node"
    targets = list(range(count, 2 * count))
    tier.set(slots=targets, byte=SENTINEL)
    victim = cluster.nodes[1]
    victim.signal(signal.SIGSTOP)  # its transfers stall: the load is in flight when it dies
    submitted = tier.load(job_id=2, keys=keys, slots=targets)
    time.sleep(0.3)
    victim.kill()
    waited = tier.wait(job_ids=[2])
    (result,) = waited["results"]
    assert submitted["submit_s"] < PROMPT and waited["longest_poll_s"] < PROMPT
    assert waited["elapsed_s"] < timeout + SLACK
    assert not result["success"]
    survivors = [k for k, lost in zip(keys, on_victim, strict=True) if not lost]
    assert result["successful_keys"] == survivors
    # every slot reported loaded holds exactly the chunk that was stored
    loaded = [targets[k] for k in survivors]
    assert tier.digest(slots=loaded)["digests"] == [digests[k] for k in survivors]


def test_drain_waits_for_jobs_in_flight_and_their_answers_follow(cluster_factory, make_tier):
    timeout = 1.0
    cluster = cluster_factory(1, "64MiB")
    tier, keys, _ = _stored(make_tier, cluster, 2, timeout)
    node = cluster.nodes[0]
    node.signal(signal.SIGSTOP)
    try:
        tier.load(job_id=2, keys=keys, slots=[2, 3])
        assert tier.stats()["pending_work"]  # vLLM keeps stepping while a job is out
        drained = tier.drain()
        assert drained["seconds"] < timeout + SLACK
        assert [r["job_id"] for r in tier.finished()["results"]] == [2]
        assert not tier.stats()["pending_work"]
    finally:
        node.signal(signal.SIGCONT)


def test_shutdown_during_a_stalled_load_returns_by_its_deadline(cluster_factory, make_tier):
    timeout = 1.0
    cluster = cluster_factory(1, "64MiB")
    tier, keys, _ = _stored(make_tier, cluster, 2, timeout)
    node = cluster.nodes[0]
    node.signal(signal.SIGSTOP)
    try:
        tier.load(job_id=2, keys=keys, slots=[2, 3])
        tier.load(job_id=3, keys=keys, slots=[2, 3])  # queued behind it: never started
        closed = tier.shutdown()
        assert closed["closed"] and closed["seconds"] < timeout + SLACK
    finally:
        node.kill()  # (a node resuming after its client went may abort: not under test)
