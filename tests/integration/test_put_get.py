"""Bytes go in and come back identical, over real UCX between real processes."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
from helpers import cluster_status

from kvpool import Client, PrefixRemoval
from kvpool.common import lane_protocol as lp
from kvpool.errors import KVPoolError, ObjectHasLease
from kvpool.master.state import MAX_REMOVAL_PAGE

SIZES = [1, 4096, 1 << 20, 32 << 20, 200 << 20]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def client(shared_cluster):
    with Client(shared_cluster.master_address, timeout=30) as client:
        yield client


@pytest.mark.parametrize("size", SIZES, ids=lambda n: f"{n}B")
def test_get_returns_exactly_the_bytes_put(client, size):
    key = unique(f"roundtrip-{size}")
    data = os.urandom(size)
    client.put(key, data)
    assert client.get(key) == data
    client.remove(key, force=True)


@pytest.mark.parametrize("size", SIZES, ids=lambda n: f"{n}B")
def test_get_into_fills_the_callers_buffer(client, size):
    key = unique(f"into-{size}")
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    client.put(key, data)
    target = np.zeros(size + 7, dtype=np.uint8)  # a larger buffer is fine
    assert client.get_into(key, target) == size
    assert np.array_equal(target[:size], data)
    assert not target[size:].any()
    client.remove(key, force=True)


def test_an_empty_object_round_trips(client):
    key = unique("empty")
    client.put(key, b"")
    assert client.get(key) == b""
    assert client.get_into(key, bytearray(4)) == 0


def test_registered_buffers_are_used_in_place(client):
    pool = np.zeros(8 << 20, dtype=np.uint8)
    region = client.register_buffer(pool)
    try:
        pool[: 1 << 20] = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8)
        key = unique("registered")
        client.put(key, pool[: 1 << 20])
        assert client.get_into(key, pool[4 << 20 : 5 << 20]) == 1 << 20
        assert np.array_equal(pool[: 1 << 20], pool[4 << 20 : 5 << 20])
    finally:
        client.unregister_buffer(region)


def test_objects_spread_over_both_nodes(client):
    keys = [unique("spread") for _ in range(16)]
    assert client.put_many([(k, os.urandom(64 << 10)) for k in keys]) == [1] * 16
    status = cluster_status(client.master)
    holding = {s.node_id for s in status.segments if s.objects > 0}
    assert len(holding) == 2
    client.remove_many(keys, force=True)


def test_two_replicas_land_on_two_nodes(client):
    key = unique("replicated")
    before = {s.node_id: s.objects for s in cluster_status(client.master).segments}
    assert client.put(key, os.urandom(1 << 20), replicas=2) == 2
    after = {s.node_id: s.objects for s in cluster_status(client.master).segments}
    assert all(after[node] == before[node] + 1 for node in after)
    client.remove(key, force=True)


def test_batches_answer_per_key_in_order(client):
    keys = [unique("batch") for _ in range(5)]
    values = [os.urandom(n) for n in (10, 1000, 100_000, 1, 4096)]
    assert client.put_many(list(zip(keys, values, strict=True))) == [1] * 5
    missing = unique("missing")
    results = client.get_many([keys[0], missing, keys[4]])
    assert results[0] == values[0]
    assert isinstance(results[1], KVPoolError) and results[1].key == missing
    assert results[2] == values[4]
    assert client.exists_many([keys[1], missing]) == [True, False]
    buffers = [bytearray(len(v)) for v in values]
    assert client.get_into_many(keys, buffers) == [len(v) for v in values]
    assert [bytes(b) for b in buffers] == values
    assert client.remove_many([*keys, missing], force=True)[:5] == [None] * 5


def test_a_batch_larger_than_the_master_takes_in_one_call_works_as_one(client):
    """The master takes at most ``MAX_BATCH_KEYS`` keys per call (it runs each call between
    every other); a larger batch is the client's to split, and answers per key in order."""
    prefix = unique("big") + "/"
    count = lp.MAX_BATCH_KEYS + 5
    keys = [f"{prefix}{i:06d}" for i in range(count)]
    values = [i.to_bytes(4, "little") * 4 for i in range(count)]
    missing = unique("missing")

    assert client.put_many(list(zip(keys, values, strict=True))) == [1] * count
    assert client.get_many([*keys, missing])[:count] == values
    assert client.exists_many([missing, *keys]) == [False] + [True] * count
    halves = [keys[: count // 2], keys[count // 2 :]]
    assert client.remove_many(halves[0], force=True) == [None] * len(halves[0])
    removal = client.remove_prefix(prefix, force=True)  # over pages of the master's
    assert removal == PrefixRemoval(removed=len(halves[1]), leased=0, not_ready=0)
    assert client.list_keys(prefix).keys == []


def test_a_prefix_removal_of_more_than_a_page_removes_them_all(client):
    prefix = unique("pages") + "/"
    keys = [f"{prefix}{i:06d}" for i in range(MAX_REMOVAL_PAGE + 3)]
    assert client.put_many([(k, b"v") for k in keys]) == [1] * len(keys)
    client.exists(keys[7])  # leased: kept, and the removal goes on past it

    assert client.remove_prefix(prefix) == PrefixRemoval(len(keys) - 1, leased=1, not_ready=0)
    assert client.list_keys(prefix).keys == [keys[7]]
    client.remove(keys[7], force=True)


def test_exists_and_remove(client):
    key = unique("exists")
    assert not client.exists(key)
    client.put(key, b"x")
    assert client.exists(key)  # like a get, this leases the object...
    with pytest.raises(ObjectHasLease):
        client.remove(key)  # ...so a plain remove must wait for the lease to end
    client.remove(key, force=True)
    assert not client.exists(key)


def test_exists_without_a_lease_only_looks(client):
    key = unique("look")
    client.put(key, b"x")
    assert client.exists(key, lease=False)
    assert client.exists_many([key, unique("absent")], lease=False) == [True, False]
    client.remove(key)  # nothing leased it: a plain remove goes through
    assert not client.exists(key, lease=False)


def test_listing_pages_through_every_key(client):
    prefix = unique("list") + "/"
    keys = sorted(f"{prefix}{i:03d}" for i in range(25))
    client.put_many([(k, b"v") for k in keys])
    seen, start_after = [], ""
    while True:
        page = client.list_keys(prefix, limit=10, start_after=start_after)
        seen.extend(page.keys)
        if not page.next_start_after:
            break
        start_after = page.next_start_after
    assert seen == keys
    client.remove_many(keys, force=True)


def test_a_client_is_usable_from_many_threads(client):
    from concurrent.futures import ThreadPoolExecutor

    def work(i: int) -> bool:
        key = unique(f"thread{i}")
        data = os.urandom(1000 + i)
        client.put(key, data)
        ok = client.get(key) == data
        client.remove(key, force=True)
        return ok

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(32)))
