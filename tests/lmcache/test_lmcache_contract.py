"""The L2AdapterInterface contract, rule by rule, against a real kvpool cluster."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.request

import pytest
import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.internal_api import L2AdapterListener
from lmcache_support import (
    StoreWaiter,
    bits,
    load,
    lookup,
    model_name,
    object_keys,
    poll_result,
    store,
)

from kvpool import Client
from kvpool.client.master_link import MasterLink
from kvpool.errors import ObjectHasLease
from kvpool.lmcache import KeyCodec

KIB = 1024
#: Master calls that carry keys (health probes and pings are not per-batch round trips).
KEYED_CALLS = {"PutStart", "PutEnd", "PutRevoke", "GetReplicas", "Exists", "Remove"}


@pytest.fixture
def master_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the method of every keyed master call made in this process (the calls
    themselves still go to the real master)."""
    calls: list[str] = []
    real_call = MasterLink.call

    def spy(self, method, request, deadline):
        if method in KEYED_CALLS:
            calls.append(method)
        return real_call(self, method, request, deadline)

    monkeypatch.setattr(MasterLink, "call", spy)
    return calls


class Recorder(L2AdapterListener):
    def __init__(self) -> None:
        self.stored: list[tuple[list[ObjectKey], list[int]]] = []
        self.accessed: list[list[ObjectKey]] = []
        self.deleted: list[list[ObjectKey]] = []

    def on_l2_keys_stored(self, keys, sizes):
        self.stored.append((list(keys), list(sizes)))

    def on_l2_keys_accessed(self, keys):
        self.accessed.append(list(keys))

    def on_l2_keys_deleted(self, keys):
        self.deleted.append(list(keys))


def test_three_distinct_event_fds_per_adapter_and_across_adapters(make_adapter):
    first, second = make_adapter(), make_adapter()
    fds = [
        fd
        for adapter in (first, second)
        for fd in (
            adapter.get_store_event_fd(),
            adapter.get_lookup_and_lock_event_fd(),
            adapter.get_load_event_fd(),
        )
    ]
    assert len(set(fds)) == 6


def test_store_lookup_load_each_one_master_round_trip_per_batch(make_adapter, arena, master_calls):
    adapter = make_adapter()
    keys = object_keys(16)
    sources = arena.objs(16, 64 * KIB)
    targets = arena.objs(16, 64 * KIB, random=False)

    master_calls.clear()
    result = store(adapter, keys, sources)
    assert result.is_successful()
    assert result.bytes_transferred() == 16 * 64 * KIB
    assert master_calls == ["PutStart", "PutEnd"]

    master_calls.clear()
    assert bits(lookup(adapter, keys), 16) == [True] * 16
    assert master_calls == ["GetReplicas"]

    master_calls.clear()
    assert bits(load(adapter, keys, targets), 16) == [True] * 16
    assert master_calls == ["GetReplicas"]
    for source, target in zip(sources, targets, strict=True):
        assert torch.equal(source.tensor, target.tensor)
    adapter.submit_unlock(keys)


def test_results_are_handed_out_once(make_adapter, arena):
    adapter = make_adapter()
    keys = object_keys(2)
    assert store(adapter, keys, arena.objs(2, 4 * KIB)).is_successful()
    assert adapter.pop_completed_store_tasks() == {}

    task_id = adapter.submit_lookup_and_lock_task(keys, {})
    assert bits(poll_result(adapter.query_lookup_and_lock_result, task_id), 2) == [True, True]
    assert adapter.query_lookup_and_lock_result(task_id) is None

    task_id = adapter.submit_load_task(keys, arena.objs(2, 4 * KIB))
    assert bits(poll_result(adapter.query_load_result, task_id), 2) == [True, True]
    assert adapter.query_load_result(task_id) is None
    assert adapter.query_load_result(10**9) is None
    adapter.submit_unlock(keys)


def test_lookup_and_lock_holds_objects_until_the_last_unlock(make_adapter, arena, lm_cluster):
    ttl = 1.5
    adapter = make_adapter(lock_ttl_s=ttl)
    keys = object_keys(3)
    names = KeyCodec().encode_all(keys)
    assert store(adapter, keys, arena.objs(3, 4 * KIB)).is_successful()
    locked = keys[:2]
    assert bits(lookup(adapter, locked), 2) == [True, True]
    assert bits(lookup(adapter, locked[:1]), 1) == [True]  # keys[0] now locked twice

    with Client(lm_cluster.master_address, timeout=5) as other:
        other.remove(names[2])  # never looked up: nothing holds it
        time.sleep(2 * ttl)  # past the first lease: only renewal keeps the objects
        for name in names[:2]:
            with pytest.raises(ObjectHasLease):
                other.remove(name)

        adapter.submit_unlock(locked)  # keys[0] keeps one lock, keys[1] none
        time.sleep(ttl + 0.3)  # keys[1]'s last lease runs out
        other.remove(names[1])
        with pytest.raises(ObjectHasLease):
            other.remove(names[0])

        adapter.submit_unlock(locked[:1])
        time.sleep(ttl + 0.3)
        other.remove(names[0])
    assert adapter.report_status()["locked_keys"] == 0


def test_unlock_of_keys_never_locked_is_harmless(make_adapter):
    adapter = make_adapter()
    absent = object_keys(3)
    assert bits(lookup(adapter, absent), 3) == [False] * 3
    adapter.submit_unlock(absent)
    adapter.submit_unlock(object_keys(2))
    assert adapter.report_status()["locked_keys"] == 0


def test_lookup_and_load_report_a_bit_per_key(make_adapter, arena):
    adapter = make_adapter()
    keys = object_keys(8)
    present = [i % 2 == 0 for i in range(8)]
    sources = {i: arena.obj(8 * KIB) for i in range(8) if present[i]}
    assert store(adapter, [keys[i] for i in sources], list(sources.values())).is_successful()

    assert bits(lookup(adapter, keys), 8) == present
    targets = arena.objs(8, 8 * KIB, random=False, fill=0xAB)
    assert bits(load(adapter, keys, targets), 8) == present
    for i, target in enumerate(targets):
        if present[i]:
            assert torch.equal(target.tensor, sources[i].tensor)
        else:
            assert bool((target.tensor == 0xAB).all()), "a miss must leave its buffer alone"
    adapter.submit_unlock([keys[i] for i in sources])


def test_a_load_into_a_buffer_of_another_size_is_a_miss(make_adapter, arena):
    adapter = make_adapter()
    keys = object_keys(2)
    assert store(adapter, keys, arena.objs(2, 8 * KIB)).is_successful()
    targets = [arena.obj(4 * KIB, random=False), arena.obj(16 * KIB, random=False)]
    assert bits(load(adapter, keys, targets), 2) == [False, False]


def test_notify_calls_keep_usage_and_listeners_in_step(make_adapter, arena):
    adapter = make_adapter()
    recorder = Recorder()
    adapter.register_listener(recorder)
    model = model_name()
    salted = object_keys(2, model, cache_salt="alice")
    plain = object_keys(1, model)
    keys = salted + plain
    assert store(adapter, keys, arena.objs(3, 8 * KIB)).is_successful()
    assert recorder.stored == [(keys, [8 * KIB] * 3)]
    usage = adapter.get_usage()
    assert usage.total_bytes_used == 24 * KIB
    assert dict(usage.bytes_by_cache_salt) == {"alice": 16 * KIB, "": 8 * KIB}

    again = store(adapter, keys, arena.objs(3, 8 * KIB))  # already there: same content
    assert again.is_successful()
    assert again.bytes_transferred() == 0
    assert len(recorder.stored) == 1
    assert adapter.get_usage().total_bytes_used == 24 * KIB

    assert bits(load(adapter, keys, arena.objs(3, 8 * KIB, random=False)), 3) == [True] * 3
    assert recorder.accessed == [keys]

    adapter.delete(salted[:1])
    assert recorder.deleted == [salted[:1]]
    usage = adapter.get_usage()
    assert usage.total_bytes_used == 16 * KIB
    assert dict(usage.bytes_by_cache_salt) == {"alice": 8 * KIB, "": 8 * KIB}


def test_objects_lost_behind_the_adapters_back_are_reported_deleted(
    make_adapter, arena, lm_cluster
):
    adapter = make_adapter()
    recorder = Recorder()
    adapter.register_listener(recorder)
    keys = object_keys(2)
    assert store(adapter, keys, arena.objs(2, 4 * KIB)).is_successful()
    with Client(lm_cluster.master_address, timeout=5) as other:
        other.remove(KeyCodec().encode(keys[0]), force=True)
    assert bits(lookup(adapter, keys), 2) == [False, True]
    assert recorder.deleted == [keys[:1]]
    assert adapter.get_usage().total_bytes_used == 4 * KIB
    adapter.submit_unlock(keys[1:])


def test_delete_removes_objects_but_spares_locked_ones(make_adapter, arena):
    adapter = make_adapter()
    keys = object_keys(3)
    assert store(adapter, keys, arena.objs(3, 4 * KIB)).is_successful()
    assert bits(lookup(adapter, keys[:1]), 1) == [True]
    adapter.delete(keys)
    adapter.delete(keys)  # again: nothing left but the locked one, no error
    assert bits(lookup(adapter, keys), 3) == [True, False, False]
    adapter.submit_unlock(keys[:1])
    adapter.submit_unlock(keys[:1])
    adapter.delete(keys[:1])
    assert bits(lookup(adapter, keys[:1]), 1) == [False]


def test_delete_tells_listeners_only_of_keys_it_removed(make_adapter, arena, lm_cluster):
    adapter = make_adapter()
    recorder = Recorder()
    adapter.register_listener(recorder)
    stored, never = object_keys(2), object_keys(2)
    assert store(adapter, stored, arena.objs(2, 4 * KIB)).is_successful()

    adapter.delete(stored[:1] + never)
    assert recorder.deleted == [stored[:1]]  # not the keys that were never stored
    adapter.delete(never)
    adapter.delete(stored[:1])  # removed already: heard of once
    assert recorder.deleted == [stored[:1]]
    assert adapter.get_usage().total_bytes_used == 4 * KIB

    # a key it stored that went behind its back (evicted, removed by another client): the
    # listeners heard of it as stored, so they hear of it as deleted, once
    with Client(lm_cluster.master_address, timeout=5) as other:
        other.remove(KeyCodec().encode(stored[1]), force=True)
    adapter.delete(stored[1:])
    adapter.delete(stored[1:])
    assert recorder.deleted == [stored[:1], stored[1:]]
    assert adapter.get_usage().total_bytes_used == 0


def test_get_usage_reports_the_configured_capacity_else_the_clusters(make_adapter, lm_cluster):
    unbounded = make_adapter()
    with Client(lm_cluster.master_address, timeout=5) as client:
        cluster_capacity = sum(s.capacity for s in client.cluster_status().segments)
    assert cluster_capacity > 0
    usage = unbounded.get_usage()
    assert usage.total_capacity_bytes == cluster_capacity
    assert 0.0 <= usage.usage_fraction < 1.0
    # LMCache's own L2 eviction stays off unless a capacity is declared
    assert not unbounded.supports_global_eviction
    bounded = make_adapter(max_capacity_gb=1)
    assert bounded.supports_global_eviction
    assert bounded.get_usage().total_capacity_bytes == 1024**3
    assert bounded.get_usage().usage_fraction == 0.0


def _master_counter(port: int, name: str, method: str) -> float:
    """A per-method counter of the master's /metrics (0 before its first call)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f'{name}{{method="{method}"}} '):
                return float(line.split()[1])
    return 0.0


def test_connections_are_open_before_the_first_load(make_adapter, arena, lm_cluster):
    port = lm_cluster.master_http_port
    lanes = "kvpool_master_requests_total", "Lane"  # a client link asks once, on connecting
    adapter = make_adapter()
    # every node (on this host: its memory mapped, as the first transfer would map it)
    segments = set(adapter._load_client.mapped_segments)
    assert len(segments) == len(lm_cluster.nodes)
    assert set(adapter._store_client.mapped_segments) == segments
    asked_for_lanes = _master_counter(port, *lanes)
    over_lane = _master_counter(port, "kvpool_master_lane_requests_total", "GetReplicas")

    keys = object_keys(4)
    sources = arena.objs(4, 64 * KIB)
    assert store(adapter, keys, sources).is_successful()
    targets = arena.objs(4, 64 * KIB, random=False)
    assert bits(load(adapter, keys, targets), 4) == [True] * 4  # the first load
    assert all(torch.equal(s.tensor, t.tensor) for s, t in zip(sources, targets, strict=True))

    # no client of the adapter connected to the master or to a node for it
    assert _master_counter(port, *lanes) == asked_for_lanes
    assert _master_counter(port, "kvpool_master_lane_requests_total", "GetReplicas") > over_lane
    assert set(adapter._load_client.mapped_segments) == segments
    # and nothing of the connecting is left behind in the pool
    with Client(lm_cluster.master_address, timeout=5) as client:
        assert client.list_keys("kvpool-warmup/").keys == []


def test_report_status_says_healthy_only_while_kvpool_is_usable(make_adapter, arena):
    adapter = make_adapter()
    status = adapter.report_status()
    assert status["is_healthy"] is True
    assert status["type"] == "KVPoolL2Adapter"
    assert status["storage_nodes"] == 2

    with socket.socket() as sock:  # a port where no master listens
        sock.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{sock.getsockname()[1]}"
    started = time.monotonic()
    orphan = make_adapter(master=nowhere, health_timeout_s=0.3, lookup_timeout_s=0.3)
    status = orphan.report_status()
    assert time.monotonic() - started < 3
    assert status["is_healthy"] is False
    assert status["master_reachable"] is False
    assert bits(lookup(orphan, object_keys(2)), 2) == [False, False]  # a miss, not a hang

    adapter.close()
    assert adapter.report_status()["is_healthy"] is False


def test_list_l2_keys_pages_through_one_model_or_all(make_adapter, arena):
    adapter = make_adapter()
    model_a, model_b = model_name(), model_name()
    keys_a = object_keys(5, model_a) + object_keys(2, model_a, cache_salt="s1", kv_rank=7)
    keys_b = object_keys(3, model_b, object_group_id=2)
    assert store(adapter, keys_a + keys_b, arena.objs(10, 4 * KIB)).is_successful()

    seen: list[ObjectKey] = []
    cursor = None
    pages = 0
    while True:
        page = adapter.list_l2_keys(model_name=model_a, page_size=3, cursor=cursor)
        pages += 1
        assert len(page.entries) <= 3
        for entry in page.entries:
            assert entry.size_bytes == 4 * KIB
            seen.append(entry.key.to_object_key())
        cursor = page.next_page_token
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen, key=repr) == sorted(keys_a, key=repr)

    everything = set()
    cursor = None
    while True:
        page = adapter.list_l2_keys(page_size=1000, cursor=cursor)
        everything.update(entry.key.to_object_key() for entry in page.entries)
        if (cursor := page.next_page_token) is None:
            break
    assert set(keys_a + keys_b) <= everything

    with pytest.raises(ValueError):
        adapter.list_l2_keys(page_size=0)
    with pytest.raises(ValueError):
        adapter.list_l2_keys(model_name=model_a, cursor="not-a-cursor")


def test_concurrent_callers_each_get_their_own_results(make_adapter, arena):
    adapter = make_adapter()
    waiter = StoreWaiter(adapter)
    task_ids: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    per_thread = [
        (object_keys(4), arena.objs(4, 16 * KIB), arena.objs(4, 16 * KIB)) for _ in range(4)
    ]

    def work(keys, sources, targets):
        try:
            for _ in range(5):
                task_id = adapter.submit_store_task(keys, sources)
                found = adapter.submit_lookup_and_lock_task(keys, {})
                assert waiter.wait(task_id).is_successful()
                poll_result(adapter.query_lookup_and_lock_result, found)
                loaded = adapter.submit_load_task(keys, targets)
                assert bits(poll_result(adapter.query_load_result, loaded), 4) == [True] * 4
                adapter.submit_unlock(keys)
                for source, target in zip(sources, targets, strict=True):
                    assert torch.equal(source.tensor, target.tensor)
                with lock:
                    task_ids.extend([task_id, found, loaded])
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=work, args=args) for args in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert len(task_ids) == len(set(task_ids)) == 4 * 5 * 3


def test_close_is_idempotent_and_final(make_adapter, arena):
    adapter = make_adapter()
    keys = object_keys(2)
    assert store(adapter, keys, arena.objs(2, 4 * KIB)).is_successful()
    fds = [
        adapter.get_store_event_fd(),
        adapter.get_lookup_and_lock_event_fd(),
        adapter.get_load_event_fd(),
    ]
    adapter.close()
    adapter.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    targets = arena.objs(2, 4 * KIB, random=False, fill=7)
    adapter.submit_load_task(keys, targets)  # refused quietly: no result, no write
    time.sleep(0.2)
    assert bool((targets[0].tensor == 7).all())
    assert adapter.report_status()["is_healthy"] is False


def test_a_task_that_fails_unexpectedly_is_still_answered(make_adapter, arena):
    class Broken(Recorder):
        def on_l2_keys_stored(self, keys, sizes):
            raise RuntimeError("listener bug")

    adapter = make_adapter()
    adapter.register_listener(Broken())
    keys = object_keys(2)
    assert not store(adapter, keys, arena.objs(2, 4 * KIB)).is_successful()
    assert bits(lookup(adapter, keys), 2) == [True, True]  # the worker lives on
    adapter.submit_unlock(keys)


def test_the_sizes_the_adapter_remembers_are_bounded(make_adapter, arena, monkeypatch):
    """kvpool evicts without telling the adapter: the size of every chunk ever stored would
    otherwise stay with it (about 200 bytes each, gigabytes a day at LMCache's rates). The
    oldest go; deleting one of those reports it deleted, of unknown size."""
    from kvpool.lmcache import adapter as adapter_module

    monkeypatch.setattr(adapter_module, "MAX_SIZES_KEPT", 2)
    adapter = make_adapter()
    recorder = Recorder()
    adapter.register_listener(recorder)
    keys = object_keys(3)
    for key in keys:
        assert store(adapter, [key], arena.objs(1, 4 * KIB)).is_successful()
    assert len(adapter._sizes) == 2

    adapter.delete(keys)
    assert recorder.deleted == [keys]
    assert adapter.get_usage().total_bytes_used == 4 * KIB, "the forgotten one's bytes stay"
