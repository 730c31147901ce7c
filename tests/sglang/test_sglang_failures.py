"""A storage node that dies while SGLang loads pages from kvpool: its pages are misses, the
others still hit, every hit holds the bytes stored, and no call blocks its caller. A master
that stalls: calls failing as a whole never crash the engine's process, and a run of calls
waits one timeout, not one each. A tenant's leases quota: loads give their leases back and
lookups' run out, so lookups keep hitting; a lookup the quota refuses is logged."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import torch
from helpers import survives_a_stopped_master, wait_until
from sglang_support import attach, hashes, storage_config

from bench.sglang_host_pool import MHAHostPool, page_indices
from kvpool import Client

SENTINEL = -7.0
#: How much later than its deadline a load may end on a loaded machine: the test tells "at
#: the deadline" from "never" (a hang), not fast from slow.
SLACK = 5.0
HERE = Path(__file__).resolve().parent
#: Runs a backend in a process of its own (see its docstring).
CHILD = HERE / "failing_batches_child.py"


def test_a_node_dying_during_loads_gives_misses_not_hangs_or_wrong_bytes(cluster_factory):
    cluster = cluster_factory(2, "64MiB")
    timeout = 2.0
    count = 16
    # pages of 512 KiB: 16 tokens x 8 layers x 8 heads x 128 dims, K and V, bf16
    pool = MHAHostPool(2 * count, 16, 8, 8, 128)
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape).to(pool.dtype))
    params = {"load_timeout_s": timeout, "replicas": 1}
    backend = attach(storage_config(cluster.master_address, params=params), pool)
    try:
        keys = hashes(count)
        sources = list(range(count))
        targets = list(range(count, 2 * count))
        assert backend.batch_set_v1(keys, page_indices(sources, 16)) == [True] * count
        with Client(cluster.master_address) as client:
            nodes = [client.stat(k).replicas[0].node_id for k in backend.kvpool_keys(keys)]
        on_victim = [node == "node1" for node in nodes]
        assert any(on_victim) and not all(on_victim), "placement put every page on one node"

        rounds: list[tuple[float, float, list[bool], bool]] = []  # start, took, hits, bytes ok
        stop = threading.Event()
        failures: list[BaseException] = []

        def loads() -> None:
            try:
                while not stop.is_set():
                    for page in targets:
                        pool.page(page * 16).fill_(SENTINEL)
                    started = time.monotonic()
                    hits = backend.batch_get_v1(keys, page_indices(targets, 16))
                    took = time.monotonic() - started
                    # (a page whose transfer broke off may hold part of its bytes: it is a
                    # miss, and SGLang frees a missed page without reading it)
                    good = all(
                        torch.equal(pool.page(t * 16), pool.page(s * 16))
                        for s, t, hit in zip(sources, targets, hits, strict=True)
                        if hit
                    )
                    rounds.append((started, took, hits, good))
            except BaseException as error:
                failures.append(error)

        thread = threading.Thread(target=loads)
        thread.start()
        assert wait_until(lambda: len(rounds) >= 2 or bool(failures), timeout=60.0), "no loads"
        killed_at = time.monotonic()
        cluster.nodes[1].kill()
        assert wait_until(
            lambda: sum(r[0] > killed_at + 0.5 for r in rounds) >= 3 or bool(failures),
            timeout=60.0,
        ), "no loads after the kill"
        stop.set()
        thread.join(timeout + 10)
        assert not thread.is_alive(), "a load blocked its caller"
        assert not failures, failures

        before = [r for r in rounds if r[0] + r[1] < killed_at]
        after = [r for r in rounds if r[0] > killed_at + 0.5]
        assert before and after, f"{len(rounds)} rounds"
        assert all(hits == [True] * count for _, _, hits, _ in before)
        assert all(good for *_, good in rounds), "a hit held other bytes than were stored"
        assert all(took < timeout + SLACK for _, took, _, _ in rounds), "a load hung"
        for _, _, hits, _ in after:
            assert hits == [not victim for victim in on_victim]
        # once the master declares the node dead (its node TTL), the lookup SGLang makes
        # before a prefetch stops at the first page that was on it
        first_lost = on_victim.index(True)
        assert wait_until(lambda: backend.batch_exists(keys) == first_lost, timeout=20.0)
    finally:
        backend.close()


def test_calls_failing_as_a_whole_leave_nothing_that_crashes_the_garbage_collector(
    cluster_factory, tmp_path
):
    # A whole batch's error, kept once per key with its traceback, would hold the frames of
    # the failed call: their views of the host pool (or of the caller's tensors) and the
    # cffi buffers exported from them, in a cycle that CPython's collector cannot clear
    # ("memoryview has 1 exported buffer", then a segfault). The backend runs in a child
    # process, so a crash fails this test only.
    cluster = cluster_factory(1, "64MiB")
    root = HERE.parents[1]
    env = {**os.environ, "PYTHONPATH": f"{HERE}:{root}", "TMPDIR": str(tmp_path)}
    survives_a_stopped_master(cluster, CHILD, env, cwd=root)


def test_calls_under_a_stopped_master_wait_one_timeout_not_one_each(cluster_factory, caplog):
    # SGLang's prefetch and backup threads call again and again: each call asking a silent
    # master would wait its whole timeout and log a warning. After one fails for that reason
    # the backend answers the calls of the next timeout without asking, then asks again.
    cluster = cluster_factory(1, "64MiB")
    timeout = 1.0
    calls = 12
    pool = MHAHostPool(16, 4, 2, 2, 64)
    params = {"load_timeout_s": timeout, "store_timeout_s": timeout}
    backend = attach(storage_config(cluster.master_address, params=params), pool)
    try:
        keys = hashes(4)
        assert backend.batch_set_v1(keys, page_indices([0, 1, 2, 3], 4)) == [True] * 4
        targets = page_indices([4, 5, 6, 7], 4)
        cluster.master.signal(signal.SIGSTOP)
        try:
            with caplog.at_level(logging.WARNING, logger="kvpool"):
                started = time.monotonic()
                for _ in range(calls):
                    assert backend.batch_exists(keys) == 0
                    assert backend.batch_get_v1(keys, targets) == [False] * 4
                loads_s = time.monotonic() - started
                started = time.monotonic()
                for _ in range(calls):
                    assert backend.batch_set_v1(hashes(4), targets) == [False] * 4
                stores_s = time.monotonic() - started
        finally:
            cluster.master.signal(signal.SIGCONT)
        assert loads_s < timeout + SLACK < calls * timeout, loads_s
        assert stores_s < timeout + SLACK < calls * timeout, stores_s
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("kvpool.sglang")]
        assert 2 <= len(lines) <= 4, lines  # (one per kind, and maybe one more on a slow box)
        assert any("lookups and loads miss for the next 1 s without asking" in m for m in lines)
        assert any("stores are skipped for the next 1 s without asking" in m for m in lines)
        # the master back, the calls ask kvpool again; a lookup it answered ends the stores'
        # quiet period too
        assert wait_until(lambda: backend.batch_exists(keys) == 4, timeout=30.0)
        assert backend.batch_set_v1(hashes(1), page_indices([8], 4)) == [True]
        assert backend.batch_get_v1(keys, targets) == [True] * 4
    finally:
        backend.close()


def test_loads_give_their_leases_back_so_a_leases_quota_never_fills(
    cluster_factory, tmp_path, caplog
):
    # Each lookup leases its hits for lookup_lease_s; each load leases them again (for
    # load_timeout_s, here 30 s) and gives those leases back when it ends. Load leases kept
    # would fill the quota of 4 after one request's pages: the next request's lookups
    # refused, misses of pages that are stored. The lookup's leases run out by themselves.
    lookup_lease_s = 1.5
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"version": 1, "tenants": {"sg": {"leases": 4}}}))
    cluster = cluster_factory(
        1, "64MiB", tenants=("default", "sg"), master_args=["--quotas", str(path)]
    )
    pool = MHAHostPool(16, 4, 2, 2, 64)
    credentials = cluster.client_credentials("sg")
    params = {**credentials, "load_timeout_s": 30, "lookup_lease_s": lookup_lease_s}
    backend = attach(storage_config(cluster.master_address, params=params), pool)
    try:
        with Client(cluster.master_address, **credentials) as client:
            for _ in range(3):  # requests, each for pages of its own
                keys = hashes(4)
                names = backend.kvpool_keys(keys)
                assert backend.batch_set_v1(keys, page_indices([0, 1, 2, 3], 4)) == [True] * 4
                assert backend.batch_exists(keys) == 4
                assert backend.batch_get_v1(keys, page_indices([4, 5, 6, 7], 4)) == [True] * 4
                # (stat takes no lease)
                assert wait_until(
                    lambda names=names: all(client.stat(n).lease_remaining_ms == 0 for n in names),
                    timeout=lookup_lease_s + SLACK,
                ), "a load kept its leases"
        # a lookup not followed by a load (SGLang dropped the prefetch) keeps its leases
        # until they run out; a lookup refused meanwhile is a miss, and says why
        held, refused = hashes(4), hashes(2)
        assert all(backend.batch_set_v1([*held, *refused], page_indices(range(6), 4)))
        assert backend.batch_exists(held) == 4
        with caplog.at_level(logging.WARNING, logger="kvpool.sglang"):
            assert backend.batch_exists(refused) == 0
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("kvpool.sglang")]
        assert len(lines) == 1 and "2 refused" in lines[0], lines
        assert "quota" in lines[0].lower(), lines
    finally:
        backend.close()
