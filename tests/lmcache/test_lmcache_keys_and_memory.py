"""Key mapping (every ObjectKey field is in the kvpool key), zero copy through the registered
L1 arena, and the adapter's settings as LMCache's plugin loader passes them."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import (
    parse_args_to_l2_adapters_config,
)
from lmcache_support import bits, load, lookup, object_keys, plugin_spec, store

from kvpool import Client
from kvpool.lmcache import KeyCodec, KVPoolL2Adapter, KVPoolL2AdapterConfig
from kvpool.transport import ucp

KIB = 1024
HASH = bytes(range(16))
BASE = {"chunk_hash": HASH, "model_name": "org/model-7b", "kv_rank": 0x01000100}
VARIANTS = [
    {},
    {"model_name": "org/model-8b"},
    {"model_name": "org/model-7b-instruct"},
    {"kv_rank": 0x01000101},
    {"object_group_id": 1},
    {"chunk_hash": HASH[:-1] + b"\x00"},
    {"cache_salt": "tenant-a"},
    {"cache_salt": "tenant-b"},
    {"object_group_id": 1, "cache_salt": "tenant-a"},
]


def variants() -> list[ObjectKey]:
    return [ObjectKey(**{**BASE, **change}) for change in VARIANTS]


def test_every_object_key_field_is_part_of_the_kvpool_key():
    codec = KeyCodec()
    names = [codec.encode(key) for key in variants()]
    assert len(set(names)) == len(names)
    for key, name in zip(variants(), names, strict=True):
        assert name.startswith("lmcache/org/model-7b") or name.startswith("lmcache/org/model-8b")
        assert codec.decode(name) == key
    assert KeyCodec("team1/").encode(variants()[0]) != names[0]
    assert codec.model_prefix("org/model-7b") == "lmcache/org/model-7b@"
    with pytest.raises(ValueError):
        codec.decode("lmcache/org/model@1@2")
    with pytest.raises(ValueError):
        KeyCodec("bad@prefix")


def test_keys_differing_in_one_field_hold_their_own_bytes(make_adapter, arena):
    adapter = make_adapter()
    keys = [
        ObjectKey(**{**key.__dict__, "model_name": key.model_name + "-kv"}) for key in variants()
    ]
    sources = arena.objs(len(keys), 4 * KIB)
    assert store(adapter, keys, sources).is_successful()
    targets = arena.objs(len(keys), 4 * KIB, random=False)
    assert bits(load(adapter, keys, targets), len(keys)) == [True] * len(keys)
    for source, target in zip(sources, targets, strict=True):
        assert torch.equal(source.tensor, target.tensor)
    assert len({bytes(t.tensor.numpy()) for t in targets}) == len(keys)


def test_the_l1_arena_is_registered_once_and_bytes_move_without_copies(
    make_adapter, arena, monkeypatch
):
    registered: list[int] = []
    real_register = Client.register_buffer

    def count_register(self, buffer):
        registered.append(len(memoryview(buffer)))
        return real_register(self, buffer)

    monkeypatch.setattr(Client, "register_buffer", count_register)
    put_addresses: list[int] = []
    real_put_many = Client.put_many

    def record_put(self, items, **options):
        items = list(items)
        put_addresses.extend(ucp.address_of(data, writable=False)[0] for _, data in items)
        return real_put_many(self, items, **options)

    monkeypatch.setattr(Client, "put_many", record_put)
    adapter = make_adapter()
    put_addresses.clear()  # the one-byte puts that opened the connections at start
    assert registered == [arena.size, arena.size]  # one UCX context each: store, load
    assert adapter.report_status()["l1_registered_bytes"] == arena.size

    keys = object_keys(8)
    sources = arena.objs(8, 32 * KIB)
    for _ in range(3):
        assert store(adapter, keys, sources).is_successful()
    assert put_addresses[:8] == [obj.data_ptr for obj in sources]  # L1 itself, not a copy
    targets = arena.objs(8, 32 * KIB, random=False)
    assert bits(load(adapter, keys, targets), 8) == [True] * 8
    assert [torch.equal(s.tensor, t.tensor) for s, t in zip(sources, targets, strict=True)] == [
        True
    ] * 8
    status = adapter.report_status()
    assert status["zero_copy_buffers"] == 3 * 8 + 8
    assert status["unregistered_buffers"] == 0
    assert len(registered) == 2


def test_memory_objects_outside_the_arena_still_move(make_adapter, arena):
    from lmcache_support import Arena

    adapter = make_adapter()
    elsewhere = Arena(1024 * KIB)
    keys = object_keys(2)
    sources = elsewhere.objs(2, 16 * KIB)
    assert store(adapter, keys, sources).is_successful()
    targets = elsewhere.objs(2, 16 * KIB, random=False)
    assert bits(load(adapter, keys, targets), 2) == [True, True]
    assert torch.equal(sources[1].tensor, targets[1].tensor)
    assert adapter.report_status()["unregistered_buffers"] == 4


def test_lmcache_plugin_loader_builds_the_adapter_from_its_json(lm_cluster, arena):
    spec = plugin_spec(lm_cluster.master_address, replicas=2, load_timeout_s=3, lock_ttl_s=20)
    config = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[spec]))
    adapter = create_l2_adapter(config.adapters[0], l1_memory_desc=arena.desc)
    try:
        assert isinstance(adapter, KVPoolL2Adapter)
        assert isinstance(adapter.config, KVPoolL2AdapterConfig)
        assert adapter.config.replicas == 2
        assert adapter.config.load_timeout_s == 3.0
        assert adapter.config.lock_ttl_s == 20.0
        keys = object_keys(2)
        assert store(adapter, keys, arena.objs(2, 4 * KIB)).is_successful()
        assert bits(lookup(adapter, keys), 2) == [True, True]
        adapter.submit_unlock(keys)
    finally:
        adapter.close()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"master": "127.0.0.1:1", "replica": 2}, "unknown kvpool adapter setting"),
        ({"master": "127.0.0.1:1", "replicas": -1}, "replicas"),
        ({"master": "127.0.0.1:1", "load_timeout_s": 0}, "load_timeout_s"),
        ({"master": "127.0.0.1:1", "lock_ttl_s": "long"}, "lock_ttl_s"),
        ({"master": "not-an-address"}, "HOST:PORT"),
        ({"master": "127.0.0.1:1", "key_prefix": "a@b"}, "key_prefix"),
        ({"master": "127.0.0.1:1", "ucx_config": {"TLS": 3}}, "ucx_config"),
        ({"master": "127.0.0.1:1", "metadata_lane": "yes"}, "metadata_lane"),
        # (a lease past the wire's 32-bit milliseconds failed every lookup, silently a miss)
        ({"master": "127.0.0.1:1", "lock_ttl_s": 1e10}, "lock_ttl_s must be at most"),
        ({"master": "127.0.0.1:1", "max_capacity_gb": True}, "max_capacity_gb"),
        ({"master": "127.0.0.1:1", "max_capacity_gb": float("nan")}, "max_capacity_gb"),
        ({"master": "127.0.0.1:1", "key_prefix": "\ud800"}, "not valid UTF-8"),
        ({"master": 50051}, "the master address must be a str"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(params, message, monkeypatch):
    monkeypatch.delenv("KVPOOL_MASTER", raising=False)
    with pytest.raises(ValueError, match=message):
        KVPoolL2AdapterConfig.from_dict(params)


def test_no_settings_at_all_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("KVPOOL_MASTER", raising=False)
    with pytest.raises(ValueError, match="adapter_params must be a mapping"):
        KVPoolL2AdapterConfig.from_dict(["master"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no master address"):
        KVPoolL2AdapterConfig.from_dict(None)  # type: ignore[arg-type]


def test_master_may_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("KVPOOL_MASTER", "10.1.2.3:50051")
    assert KVPoolL2AdapterConfig.from_dict({}).master == "10.1.2.3:50051"
    assert "adapter_params" in KVPoolL2AdapterConfig.help()
    assert json.loads(plugin_spec("h:1"))["class_name"] == "KVPoolL2Adapter"
