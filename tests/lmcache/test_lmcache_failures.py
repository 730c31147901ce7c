"""Loads against storage nodes that stall or die: misses within the deadline, never a hang,
never wrong bytes, and never a write into L1 after the load returned (or the adapter closed).
A master that stalls: stores fail by their deadline counted from submission, however many
are queued, and batches failing as a whole never crash the process that runs the adapter.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import survives_a_stopped_master, wait_until
from lmcache_support import bits, load, object_keys, store, wait_fd

from kvpool.client.master_link import MasterLink
from kvpool.lmcache import KeyCodec
from kvpool.proto import master_pb2 as pb

MIB = 1024 * 1024
SENTINEL = 0x5A
#: TCP: the storage node must progress its UCX worker for a get to complete, so a stopped
#: node stalls transfers (shared-memory transports, and mapping the node's memory, would
#: read it regardless).
TCP_ONLY = {"TLS": "tcp"}
HERE = Path(__file__).resolve().parent
#: Runs an adapter in a process of its own (see its docstring).
CHILD = HERE / "failing_batches_child.py"
#: How much later than its deadline a load or close may end on a loaded machine: the tests
#: tell "at the deadline" from "never" (a hang), not fast from slow.
SLACK = 5.0


def untouched(objs) -> bool:
    return all(bool((obj.tensor == SENTINEL).all()) for obj in objs)


def _stalled_setup(cluster_factory, make_adapter, arena, timeout: float):
    """A one-node cluster, a TCP-only adapter on it, and 4 objects of 1 MiB stored."""
    cluster = cluster_factory(1, "64MiB")
    adapter = _tcp_adapter(make_adapter, cluster, timeout)
    keys = object_keys(4)
    sources = arena.objs(4, MIB)
    assert store(adapter, keys, sources).is_successful()
    assert bits(load(adapter, keys, arena.objs(4, MIB, random=False)), 4) == [True] * 4
    return cluster, adapter, keys, sources


def _tcp_adapter(make_adapter, cluster, timeout: float):
    return make_adapter(
        master=cluster.master_address,
        load_timeout_s=timeout,
        ucx_config=TCP_ONLY,
        same_host_mapping=False,
    )


def _serves_again(adapter, keys, sources, arena, node) -> bool:
    """Waits until ``node`` serves a load of ``keys`` (their exact bytes) once more; False if
    it exited instead. A node that serves a new load has worked through the gets it was sent
    while stopped: any late byte of theirs has landed by then."""
    fresh = arena.objs(len(keys), MIB, random=False)

    def served() -> bool:
        return bits(load(adapter, keys, fresh), len(keys)) == [True] * len(keys)

    assert wait_until(lambda: not node.alive() or served(), timeout=30.0), "no load served"
    if not node.alive():
        return False
    assert all(torch.equal(f.tensor, s.tensor) for f, s in zip(fresh, sources, strict=True))
    return True


def test_a_stalled_node_gives_misses_at_the_deadline_and_no_late_writes(
    cluster_factory, make_adapter, arena
):
    timeout = 1.0
    cluster, adapter, keys, sources = _stalled_setup(cluster_factory, make_adapter, arena, timeout)
    node = cluster.nodes[0]
    node.signal(signal.SIGSTOP)
    try:
        targets = arena.objs(4, MIB, random=False, fill=SENTINEL)
        started = time.monotonic()
        result = load(adapter, keys, targets)
        elapsed = time.monotonic() - started
        assert bits(result, 4) == [False] * 4
        assert timeout * 0.8 < elapsed < timeout + SLACK, "the load ends at its deadline"
        assert adapter.report_status()["load_deadlines_missed"] >= 1
    finally:
        node.signal(signal.SIGCONT)
    # the node answers the abandoned gets once it runs again: nothing may land in L1
    assert _serves_again(adapter, keys, sources, arena, node), node.log_tail(5)
    assert untouched(targets)


class NodeDied(AssertionError):
    """The storage node exited (the known UCX crash below), not another assertion."""


@pytest.mark.xfail(
    raises=NodeDied,
    reason="known bug: a storage node that resumes after a client closed its worker during a "
    "transfer the stopped node owed it often aborts (UCX 'Fatal: unexpected error: Endpoint "
    "timeout', ucp_request.inl:356); not always, so the mark is not strict",
)
def test_closing_the_adapter_during_a_stalled_load_writes_nothing_later(
    cluster_factory, make_adapter, arena
):
    timeout = 1.0
    cluster, adapter, keys, sources = _stalled_setup(cluster_factory, make_adapter, arena, timeout)
    node = cluster.nodes[0]
    node.signal(signal.SIGSTOP)
    try:
        # close() during a stalled load: returns by the load's deadline, writes nothing later
        late_targets = arena.objs(4, MIB, random=False, fill=SENTINEL)
        task_id = adapter.submit_load_task(keys, late_targets)
        # asynchronous: submitting never waits (the stalled load cannot be done yet)
        assert adapter.query_load_result(task_id) is None
        # the load worker has taken the task up (private: nothing public tells queued from
        # running), so close() meets a load in flight, not one it can cancel unstarted
        assert wait_until(adapter._load_worker._queue.empty, timeout=30.0)
        started = time.monotonic()
        adapter.close()
        assert time.monotonic() - started < timeout + SLACK
    finally:
        node.signal(signal.SIGCONT)
    served = _serves_again(_tcp_adapter(make_adapter, cluster, timeout), keys, sources, arena, node)
    assert untouched(late_targets)
    if not served:
        raise NodeDied(f"the storage node exited:\n{node.log_tail(5)}")


def _node_of_each_key(master: str, names: list[str]) -> list[str]:
    link = MasterLink(master)
    try:
        response = link.call(
            "GetReplicas",
            pb.GetReplicasRequest(client_id="test", keys=names, lease_ms=1),
            time.monotonic() + 5,
        )
    finally:
        link.close()
    node_of_segment = {s.segment_id: s.node_id for s in response.segments}
    return [node_of_segment[o.replicas[0].segment_id] for o in response.objects]


def test_a_node_dying_during_loads_gives_misses_not_hangs_or_wrong_bytes(
    cluster_factory, make_adapter, arena
):
    cluster = cluster_factory(2, "64MiB")
    timeout = 2.0
    adapter = make_adapter(master=cluster.master_address, load_timeout_s=timeout, replicas=1)
    count = 16
    keys = object_keys(count)
    sources = arena.objs(count, MIB)
    assert store(adapter, keys, sources).is_successful()
    nodes = _node_of_each_key(cluster.master_address, KeyCodec().encode_all(keys))
    on_victim = [node == "node1" for node in nodes]
    assert any(on_victim) and not all(on_victim), "random placement put every key on one node"

    rounds: list[tuple[float, float, list[bool], bool]] = []  # start, duration, hits, bytes ok
    stop = threading.Event()
    failures: list[BaseException] = []
    targets = arena.objs(count, MIB, random=False)

    def loads() -> None:
        try:
            while not stop.is_set():
                for target in targets:
                    target.tensor.fill_(SENTINEL)
                started = time.monotonic()
                hits = bits(load(adapter, keys, targets, timeout=timeout + 5), count)
                duration = time.monotonic() - started
                good = all(
                    torch.equal(targets[i].tensor, sources[i].tensor)
                    for i, hit in enumerate(hits)
                    if hit
                )
                rounds.append((started, duration, hits, good))
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=loads)
    thread.start()
    assert wait_until(lambda: len(rounds) >= 2 or bool(failures), timeout=60.0), "no loads"
    killed_at = time.monotonic()
    cluster.nodes[1].kill()
    # Transfers to the dead node fail at once (then, after the master's node TTL, its
    # replicas are dropped): either way its keys miss while the other node's keys still hit.
    assert wait_until(
        lambda: sum(r[0] > killed_at + 0.5 for r in rounds) >= 3 or bool(failures),
        timeout=60.0,
    ), "no loads after the kill"
    stop.set()
    thread.join(timeout + 10)
    assert not thread.is_alive(), "a load hung"
    assert not failures, failures

    before = [r for r in rounds if r[0] + r[1] < killed_at]
    after = [r for r in rounds if r[0] > killed_at + 0.5]
    assert before and after, f"{len(rounds)} rounds"
    assert all(hits == [True] * count for _, _, hits, _ in before)
    assert all(good for *_, good in rounds), "a hit returned other bytes than were stored"
    assert all(duration < timeout + SLACK for _, duration, _, _ in rounds), "a load hung"
    for _, _, hits, _ in after:
        assert hits == [not victim for victim in on_victim]


def test_batches_failing_as_a_whole_leave_nothing_that_crashes_the_garbage_collector(
    cluster_factory, lmcache_env
):
    # A whole batch's error, kept once per key with its traceback, would hold the frames of
    # the failed call: their L1 views and the cffi buffers exported from them, in a cycle
    # that CPython's collector cannot clear ("memoryview has 1 exported buffer", then a
    # segfault). The adapter runs in a child process, so a crash fails this test only.
    cluster = cluster_factory(1, "64MiB")
    env = {**lmcache_env, "PYTHONPATH": f"{HERE}:{HERE.parent}"}
    survives_a_stopped_master(cluster, CHILD, env)


def test_queued_stores_fail_by_their_deadline_from_submission_under_a_stalled_master(
    cluster_factory, make_adapter, arena
):
    # One worker runs stores in order. Each store's deadline counts from its submission, so
    # N stores queued behind a stalled master all fail within store_timeout_s, not the last
    # one after N of them (LMCache read-locks their L1 objects until they are answered).
    timeout = 1.0
    count = 8
    cluster = cluster_factory(1, "64MiB")
    adapter = make_adapter(master=cluster.master_address, store_timeout_s=timeout)
    assert store(adapter, object_keys(1), arena.objs(1, MIB)).is_successful()
    cluster.master.signal(signal.SIGSTOP)
    try:
        submitted = time.monotonic()
        ids = [adapter.submit_store_task(object_keys(1), arena.objs(1, MIB)) for _ in range(count)]
        answered: dict[int, tuple[float, bool]] = {}
        while len(answered) < count and time.monotonic() - submitted < count * timeout + SLACK:
            wait_fd(adapter.get_store_event_fd(), 0.2)
            for task_id, result in adapter.pop_completed_store_tasks().items():
                answered[task_id] = (time.monotonic() - submitted, result.is_successful())
    finally:
        cluster.master.signal(signal.SIGCONT)
    assert sorted(answered) == sorted(ids), "a store went unanswered"
    assert not any(ok for _, ok in answered.values()), "a store reached a stopped master"
    slowest = max(seconds for seconds, _ in answered.values())
    assert slowest < timeout + SLACK, f"answered after {sorted(answered.values())}"
    assert adapter.report_status()["store_failures"] == count
    # the master back, a store has its whole timeout again
    arena.reset()  # (every store above was answered: their objects are free)
    again = arena.objs(1, MIB)
    assert wait_until(lambda: store(adapter, object_keys(1), again).is_successful(), 30.0)
