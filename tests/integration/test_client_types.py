"""What ``Client`` calls return besides bytes are kvpool's own frozen dataclasses: the field
names of the master's answers, IntEnums for enums, no protobuf or UCX object anywhere."""

from __future__ import annotations

import dataclasses
import os
import uuid

import numpy as np
import pytest

import kvpool
import kvpool.client
from kvpool import (
    Client,
    ClusterStatus,
    KeyPage,
    ObjectInfo,
    PrefixRemoval,
    RegisteredRegion,
    ReplicaInfo,
    SegmentStatus,
    StoryEvent,
)
from kvpool.common.status import KeyStatus, Pin, Tier
from kvpool.errors import InvalidArgument

TYPES = [
    ClusterStatus,
    KeyPage,
    ObjectInfo,
    PrefixRemoval,
    RegisteredRegion,
    ReplicaInfo,
    SegmentStatus,
    StoryEvent,
]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def client(shared_cluster):
    with Client(shared_cluster.master_address, timeout=30) as client:
        yield client


def kvpool_all_the_way_down(value: object) -> None:
    """``value`` and everything it holds are kvpool's dataclasses or plain Python values."""
    if dataclasses.is_dataclass(value):
        assert type(value).__module__.startswith("kvpool"), type(value)
        for item in dataclasses.fields(value):
            if not item.name.startswith("_"):
                kvpool_all_the_way_down(getattr(value, item.name))
    elif isinstance(value, list | tuple):
        for item in value:
            kvpool_all_the_way_down(item)
    elif isinstance(value, dict):
        for k, v in value.items():
            kvpool_all_the_way_down(k)
            kvpool_all_the_way_down(v)
    else:
        assert type(value) in (str, int, float, bool, type(None)) or type(value).__module__ in (
            "kvpool.common.status",
        ), type(value)


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.__name__)
def test_the_types_are_frozen_dataclasses_exported_from_kvpool_and_kvpool_client(kind):
    assert dataclasses.is_dataclass(kind)
    assert kind.__dataclass_params__.frozen
    assert kind.__module__ == "kvpool.client.types"
    assert getattr(kvpool, kind.__name__) is kind
    assert getattr(kvpool.client, kind.__name__) is kind
    assert kind.__name__ in kvpool.__all__ and kind.__name__ in kvpool.client.__all__


def test_stat_says_everything_of_one_object(client):
    key = unique("stat")
    data = os.urandom(5000)
    assert client.put(key, data, replicas=2, checksum=True, pin="soft", pin_ttl=60) == 2
    client.get(key)  # leases it
    info = client.stat(key)
    assert type(info) is ObjectInfo
    kvpool_all_the_way_down(info)
    assert info.status is KeyStatus.OK
    assert (info.size, info.state) == (5000, "published")
    assert info.pin is Pin.SOFT and 0 < info.pin_remaining_ms <= 60_000
    assert info.lease_remaining_ms > 0
    assert isinstance(info.crc32c, int)
    assert info.age_ms >= info.idle_ms >= 0
    assert len(info.replicas) == 2
    for replica in info.replicas:
        assert type(replica) is ReplicaInfo
        assert replica.tier is Tier.DRAM
        assert replica.segment_id and replica.node_id and replica.host
        assert isinstance(replica.address, int)
    assert len({r.node_id for r in info.replicas}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.size = 1  # type: ignore[misc]

    plain = unique("plain")
    client.put(plain, b"x")
    assert client.stat(plain).crc32c is None, "no checksum sent: None, not 0"
    assert client.stat(plain).pin is Pin.NONE
    client.remove_many([key, plain], force=True)


def test_list_keys_pages_are_key_pages(client):
    prefix = unique("page") + "/"
    keys = [f"{prefix}{i}" for i in range(3)]
    client.put_many([(k, b"v" * (i + 1)) for i, k in enumerate(keys)])
    first = client.list_keys(prefix, limit=2)
    assert type(first) is KeyPage
    kvpool_all_the_way_down(first)
    assert first.keys == keys[:2] and first.sizes == [1, 2]
    assert first.next_start_after == keys[1]
    last = client.list_keys(prefix, limit=2, start_after=first.next_start_after)
    assert (last.keys, last.sizes, last.next_start_after) == ([keys[2]], [3], "")
    assert client.list_keys(unique("none")) == KeyPage([], [], "")
    client.remove_many(keys, force=True)


def test_removals_by_prefix_say_what_they_kept(client):
    prefix = unique("gone") + "/"
    client.put_many([(f"{prefix}{i}", b"x") for i in range(3)])
    client.get(f"{prefix}0")  # leased: kept without force
    removal = client.remove_prefix(prefix)
    assert removal == PrefixRemoval(removed=2, leased=1, not_ready=0)
    kvpool_all_the_way_down(removal)
    forced = client.remove_prefix(prefix, force=True)
    assert (forced.removed, forced.leased, forced.not_ready) == (1, 0, 0)


def test_remove_all_answers_a_prefix_removal(cluster_factory):
    cluster = cluster_factory(1, "16MiB")
    with Client(cluster.master_address) as client:
        client.put_many([("a", b"1"), ("b", b"2")])
        removal = client.remove_all(force=True)
        assert type(removal) is PrefixRemoval
        assert removal.removed == 2
        assert client.list_keys().keys == []


def test_cluster_status_lists_segments_and_counts(client):
    key = unique("counted")
    client.put(key, os.urandom(4096))
    status = client.cluster_status()
    assert type(status) is ClusterStatus
    kvpool_all_the_way_down(status)
    assert status.nodes == 2 and status.objects >= 1 and status.reservations >= 0
    assert status.uptime_s > 0
    assert status.segments  # a client token sees one total per tier, not each node's
    for segment in status.segments:
        assert type(segment) is SegmentStatus
        assert segment.tier is Tier.DRAM and segment.persistent is False
        assert 0 < segment.used <= segment.capacity
        assert 0 < segment.largest_free <= segment.capacity - segment.used
        assert segment.segment_id
    assert sum(s.capacity for s in status.segments) == 2 * 640 << 20
    client.remove(key, force=True)


def test_story_events_are_story_events(client):
    key = unique("told")
    client.put(key, b"x")
    story = client.story(key)
    assert story and all(type(e) is StoryEvent for e in story)
    kvpool_all_the_way_down(story)
    assert story[0].event == "reserved" and "put_id" in story[0].details
    assert type(story[0].details) is dict
    client.remove(key, force=True)


def test_registered_regions_hide_their_ucx_handle(client):
    pool = np.zeros(1 << 20, dtype=np.uint8)
    region = client.register_buffer(pool)
    try:
        assert type(region) is RegisteredRegion
        assert (region.address, region.length) == (pool.ctypes.data, pool.nbytes)
        assert region.contains(pool.ctypes.data + 4096, 4096)
        assert not region.contains(pool.ctypes.data + pool.nbytes - 1, 2)
        assert "_region" not in repr(region)
        assert not any(not f.name.startswith("_") and "ucp" in repr(type(getattr(region, f.name)))
                       for f in dataclasses.fields(region))  # fmt: skip
        key = unique("registered")
        pool[:4096] = 7
        client.put(key, pool[:4096])
        assert client.get_into(key, pool[8192:12288]) == 4096 and (pool[8192:12288] == 7).all()
        assert client.get_range_into(key, pool[16384:16385], 4095) == 1 and pool[16384] == 7
    finally:
        client.unregister_buffer(region)
    with pytest.raises(InvalidArgument, match="not registered"):
        client.unregister_buffer(region)
    with pytest.raises(InvalidArgument, match="register_buffer"):
        client.unregister_buffer(object())  # type: ignore[arg-type]
