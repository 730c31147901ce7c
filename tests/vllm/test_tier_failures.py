"""Storage nodes that stall or die under the tier: loads become misses by their deadline,
never a wrong byte in a slot reported loaded, never a write into the primary after the job
was answered, and never a scheduler call that waits on the network. A master that stalls:
lookups and stores are answered within their timeouts however many are queued, shutdown
does not wait out the queue, and failed jobs leave nothing that crashes the engine.
"""

from __future__ import annotations

import itertools
import signal
import time

from helpers import wait_until
from tier_driver import TIER, Tier, TierHost

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


_requests = itertools.count()
_jobs = itertools.count(100)


def _verdict(tier, k: int) -> list[str]:
    """A new request's lookup of chunk ``k``, then the request finished (its verdict is not
    kept for the next one)."""
    req_id = f"again-{next(_requests)}"
    final = tier.lookup(keys=[k], req_id=req_id)["final"]
    tier.request_finished(req_id=req_id)
    return final


def _steps(count: int, per_step: int) -> list[dict[str, list[int]]]:
    """``count`` scheduler steps of ``per_step`` new requests, each with a chunk of its own."""
    return [
        {f"step{s}-req{r}": [1000 * (s + 1) + r] for r in range(per_step)} for s in range(count)
    ]


def test_lookups_of_many_requests_under_an_unreachable_master_wait_one_timeout_not_one_each(
    cluster_factory, make_tier
):
    # vLLM's lookup thread asks for one request after the other and posts a step's answers
    # when all are done: 12 requests asking a silent master in turn would wait 12 timeouts.
    # After a lookup fails as a whole the tier answers misses without asking, for one
    # timeout; then it asks again.
    timeout = 1.0
    cluster = cluster_factory(1, "64MiB")
    tier = make_tier(master=cluster.master_address, lookup_timeout_s=timeout)
    assert tier.run("store", 1, keys=[1], slots=[0])["success"]
    assert _verdict(tier, 1) == ["HIT"]
    cluster.master.signal(signal.SIGSTOP)
    try:
        answered = tier.lookup_steps(steps=_steps(3, 4))
    finally:
        cluster.master.signal(signal.SIGCONT)
    assert list(answered["final"].values()) == [["MISS"]] * 12, answered
    assert max(answered["seconds"].values()) < timeout + SLACK, answered["seconds"]
    assert tier.stats()["stats"]["lookup_failures"] >= 1
    # the master back, lookups ask kvpool again and find the chunk
    assert wait_until(lambda: _verdict(tier, 1) == ["HIT"], timeout=30.0)


def test_shutdown_with_lookups_queued_under_an_unreachable_master_does_not_wait_them_out(
    cluster_factory, make_tier
):
    # Shutdown joins vLLM's lookup thread, which works through every queued request first:
    # at most the lookup in flight may cost its timeout, the queued ones nothing.
    timeout = 1.0
    cluster = cluster_factory(1, "64MiB")
    tier = make_tier(master=cluster.master_address, lookup_timeout_s=timeout)
    cluster.master.signal(signal.SIGSTOP)
    try:
        tier.lookup_steps(steps=_steps(3, 4), wait=False)  # 12 requests queued, unanswered
        closed = tier.shutdown()
    finally:
        cluster.master.signal(signal.SIGCONT)
    assert closed["closed"] and closed["seconds"] < timeout + SLACK, closed


def test_queued_store_jobs_fail_by_their_deadline_from_submission_under_a_stalled_master(
    cluster_factory, make_tier
):
    # One thread runs store jobs in order. Each job's deadline counts from its submission, so
    # jobs queued behind a stalled master all fail within store_timeout_s, and drain_jobs
    # waits that long, not one timeout per queued job.
    timeout = 1.0
    count = 8
    cluster = cluster_factory(1, "64MiB")
    tier = make_tier(master=cluster.master_address, slots=count, store_timeout_s=timeout)
    assert tier.run("store", 1, keys=[1], slots=[0])["success"]
    cluster.master.signal(signal.SIGSTOP)
    try:
        jobs = list(range(10, 10 + count))
        for job, slot in zip(jobs, range(count), strict=True):
            assert tier.store(job_id=job, keys=[job], slots=[slot])["submit_s"] < PROMPT
        drained = tier.drain()
        results = tier.finished()["results"]
    finally:
        cluster.master.signal(signal.SIGCONT)
    assert drained["seconds"] < timeout + SLACK, drained
    assert sorted(r["job_id"] for r in results) == jobs
    assert not any(r["success"] for r in results)
    assert tier.stats()["stats"]["chunks_not_stored"] == count
    # the master back, a store job has its whole timeout again
    assert wait_until(lambda: tier.run("store", next(_jobs), keys=[2], slots=[0])["success"], 30.0)


def test_jobs_failing_as_a_whole_leave_nothing_that_crashes_the_garbage_collector(
    cluster_factory,
):
    # A whole batch's error, kept with its traceback, would hold the frames of the failed
    # call: views of the primary tier and the cffi buffers exported from them, in a cycle
    # that CPython's collector cannot clear ("memoryview has 1 exported buffer", then a
    # segfault). A vLLM process of its own, so that a crash fails this test only.
    cluster = cluster_factory(1, "64MiB")
    host = TierHost()
    try:
        entry = {**TIER, "master": cluster.master_address, "store_timeout_s": 0.3}
        tier = Tier(host, tier={**entry, "load_timeout_s": 0.3}, model="kvpool-test/collected")
        cluster.master.signal(signal.SIGSTOP)  # every store and load now fails as a whole
        try:
            for job in range(5):
                assert not tier.run("store", 2 * job, keys=[job], slots=[job])["success"]
                assert not tier.run("load", 2 * job + 1, keys=[job], slots=[job])["success"]
                assert host.call("collect")["collected"] >= 0
        finally:
            cluster.master.signal(signal.SIGCONT)
        tier.shutdown()
    finally:
        host.close()
    assert host.process.returncode == 0, f"the vLLM process ended with {host.process.returncode}"


def test_a_master_outage_costs_a_call_per_second_not_one_per_job_and_few_log_lines(
    cluster_factory, make_tier
):
    # vLLM stores and loads all the time: with the master stopped, every job would make its
    # own call (waiting out what is left of its deadline) and log its own failure. After a
    # call gets no answer, jobs starting within the next second fail without calling, and a
    # failure is logged once per kind and error every 10 s.
    timeout = 1.0
    cluster = cluster_factory(1, "64MiB")
    tier = make_tier(
        master=cluster.master_address,
        slots=16,
        store_timeout_s=timeout,
        load_timeout_s=timeout,
    )
    tier.fill(slots=list(range(16)), seed=3)
    assert tier.run("store", 1, keys=[1], slots=[0])["success"]
    before = tier.stats()["stats"]
    tier.logs()  # (only the lines of the outage count)
    jobs: list[int] = []
    outage = 3.0
    cluster.master.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        job = 1000
        while time.monotonic() - started < outage:  # a job of each kind every ~50 ms
            tier.store(job_id=job, keys=[job], slots=[job % 8])
            tier.load(job_id=job + 1, keys=[1], slots=[8 + job % 8])
            jobs += [job, job + 1]
            job += 2
            time.sleep(0.05)
        stopped_for = time.monotonic() - started
        waited = tier.wait(job_ids=jobs, timeout=60.0)
    finally:
        cluster.master.signal(signal.SIGCONT)
    assert not waited["unanswered"], waited["unanswered"]
    assert not any(r["success"] for r in waited["results"])
    after = tier.stats()["stats"]
    ran = (after["store_jobs"] - before["store_jobs"]) + (after["load_jobs"] - before["load_jobs"])
    assert ran == len(jobs)
    unasked = after["jobs_unasked"] - before["jobs_unasked"]
    expired = after["jobs_expired"] - before["jobs_expired"]
    calls = ran - unasked - expired
    # Each kind calls at most once per (timeout + 1 s hold) and once more at the end; twice
    # that, for a loaded machine's late jobs, is still far below a call per job.
    bound = 2 * 2 * (stopped_for / (timeout + 1.0) + 2)
    assert 2 <= calls <= bound, (calls, bound, len(jobs), after)
    assert unasked >= 1, after
    lines = tier.logs()["lines"]
    # a line per kind (store, load) and reason (failed, not run: stalled, expired), at most
    # one each per 10 s; the outage and the wait lasted less than that
    assert len(lines) <= 8, lines
    assert any("not stored" in line for line in lines), lines
    # the master back, stores and loads work again (the hold is at most a second)
    assert wait_until(
        lambda: tier.run("store", next(_jobs), keys=[2], slots=[1])["success"], timeout=30.0
    )
    assert tier.run("load", next(_jobs), keys=[1, 2], slots=[8, 9])["success"]
