"""Loads against storage nodes that stall or die: misses within the deadline, never a hang,
never wrong bytes, and never a write into L1 after the load returned (or the adapter closed).
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

pytest.importorskip("lmcache.v1.distributed.l2_adapters.base")

import torch
from lmcache_support import bits, load, object_keys, store

from kvpool.client.master_link import MasterLink
from kvpool.lmcache import KeyCodec
from kvpool.proto import master_pb2 as pb

MIB = 1024 * 1024
SENTINEL = 0x5A
#: TCP: the storage node must progress its UCX worker for a get to complete, so a stopped
#: node stalls transfers (shared-memory transports, and mapping the node's memory, would
#: read it regardless).
TCP_ONLY = {"TLS": "tcp"}


def untouched(objs) -> bool:
    return all(bool((obj.tensor == SENTINEL).all()) for obj in objs)


def test_a_stalled_node_gives_misses_at_the_deadline_and_no_late_writes(
    cluster_factory, make_adapter, arena
):
    cluster = cluster_factory(1, "64MiB")
    timeout = 1.0
    adapter = make_adapter(
        master=cluster.master_address,
        load_timeout_s=timeout,
        ucx_config=TCP_ONLY,
        same_host_mapping=False,
    )
    keys = object_keys(4)
    sources = arena.objs(4, MIB)
    assert store(adapter, keys, sources).is_successful()
    assert bits(load(adapter, keys, arena.objs(4, MIB, random=False)), 4) == [True] * 4

    node = cluster.nodes[0]
    node.signal(signal.SIGSTOP)
    try:
        targets = arena.objs(4, MIB, random=False, fill=SENTINEL)
        started = time.monotonic()
        result = load(adapter, keys, targets)
        elapsed = time.monotonic() - started
        assert bits(result, 4) == [False] * 4
        assert timeout * 0.8 < elapsed < timeout + 1.0
        assert adapter.report_status()["load_deadlines_missed"] >= 1

        # close() during a stalled load: returns by the load's deadline, writes nothing later
        late_targets = arena.objs(4, MIB, random=False, fill=SENTINEL)
        started = time.monotonic()
        adapter.submit_load_task(keys, late_targets)
        assert time.monotonic() - started < 0.1  # asynchronous: submitting never waits
        time.sleep(0.1)
        started = time.monotonic()
        adapter.close()
        assert time.monotonic() - started < timeout + 1.0
    finally:
        node.signal(signal.SIGCONT)
    time.sleep(0.5)  # the node answers the abandoned gets now: nothing may land in L1
    assert untouched(targets)
    assert untouched(late_targets)


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
    time.sleep(0.5)
    killed_at = time.monotonic()
    cluster.nodes[1].kill()
    # Transfers to the dead node fail at once (then, after the master's node TTL, its
    # replicas are dropped): either way its keys miss while the other node's keys still hit.
    time.sleep(3.0)
    stop.set()
    thread.join(timeout + 10)
    assert not thread.is_alive(), "a load hung"
    assert not failures, failures

    before = [r for r in rounds if r[0] + r[1] < killed_at]
    after = [r for r in rounds if r[0] > killed_at + 0.5]
    assert before and after, f"{len(rounds)} rounds"
    assert all(hits == [True] * count for _, _, hits, _ in before)
    assert all(good for *_, good in rounds), "a hit returned other bytes than were stored"
    assert all(duration < timeout + 1.0 for _, duration, _, _ in rounds)
    for _, _, hits, _ in after:
        assert hits == [not victim for victim in on_victim]
