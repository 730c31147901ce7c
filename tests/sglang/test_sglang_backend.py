"""kvpool as SGLang's HiCache storage tier, loaded by SGLang's own backend factory from the
"dynamic" configuration and driven the way SGLang's cache controller drives it (v1 page
interface), against a real cluster: pages move between the host pool and kvpool byte for
byte, lookups count the hits SGLang may prefetch, misses never touch the pool."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from helpers import being_written, wait_until
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang_support import attach, hashes, storage_config

from bench.sglang_host_pool import PAGE_LAYOUTS, MHAHostPool, MLAHostPool, page_indices
from kvpool import Client
from kvpool.errors import ObjectHasLease
from kvpool.security.dev_pki import make_dev_pki

SENTINEL = -7.0
#: lookup_lease_s of the lease tests: lookups and loads take milliseconds, the waits seconds.
LOOKUP_LEASE_S = 3.0
#: How much later than due a lease may be seen ended on a loaded machine.
SLACK = 5.0
#: A well-formed client token that no cluster knows (as a revoked one).
UNKNOWN_TOKEN = "kvp1.0123456789ab.SECRETsecretSECRETsecretSECRETsecret42"


def mha_pool(
    layout: str = "page_first",
    dtype: torch.dtype = torch.bfloat16,
    head_num: int = 2,
    head_dim: int = 64,
) -> MHAHostPool:
    pool = MHAHostPool(16, 4, 3, head_num, head_dim, layout=layout, dtype=dtype)
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape).to(dtype))
    return pool


def same_pages(pool, sources: list[int], targets: list[int]) -> bool:
    return all(
        torch.equal(pool.page(s * pool.page_size), pool.page(t * pool.page_size))
        for s, t in zip(sources, targets, strict=True)
    )


def test_sglang_factory_loads_kvpool_from_the_dynamic_configuration(make_backend):
    backend = make_backend()
    assert isinstance(backend, HiCacheStorage)
    assert type(backend).__module__ == "kvpool.sglang.storage"
    assert type(backend).__name__ == "KVPoolHiCacheStorage"


def test_without_interface_v1_the_factory_refuses_and_says_what_to_add(sg_cluster):
    config = storage_config(sg_cluster.master_address)
    del config.extra_config["interface_v1"]
    with pytest.raises(ValueError, match='"interface_v1": 1'):
        StorageBackendFactory.create_backend("dynamic", config, mha_pool())


def test_an_unknown_setting_is_refused_with_the_known_ones(sg_cluster):
    config = storage_config(sg_cluster.master_address, params={"load_timeout": 3})
    with pytest.raises(ValueError, match=r"unknown kvpool HiCache setting.*load_timeout_s"):
        StorageBackendFactory.create_backend("dynamic", config, mha_pool())


def test_the_lookup_lease_follows_load_timeout_s_unless_given(make_backend, sg_cluster):
    # (a load may wait behind others in SGLang's io thread, each up to load_timeout_s)
    assert make_backend(params={"load_timeout_s": 7}).settings.lookup_lease_s == 7.0
    given = {"load_timeout_s": 7, "lookup_lease_s": 2}
    assert make_backend(params=given).settings.lookup_lease_s == 2.0
    config = storage_config(sg_cluster.master_address, params={"lookup_lease_s": 0})
    with pytest.raises(ValueError, match="lookup_lease_s must be a positive number"):
        StorageBackendFactory.create_backend("dynamic", config, mha_pool())


def test_a_token_the_master_refuses_fails_the_start_with_what_to_fix(sg_cluster):
    # (else the engine would start, and every lookup, store and load fail with a warning)
    params = {"token": UNKNOWN_TOKEN, "tls_ca": sg_cluster.client_credentials()["tls_ca"]}
    config = storage_config(sg_cluster.master_address, params=params)
    with pytest.raises(ValueError, match="refuses this engine's credentials") as failure:
        StorageBackendFactory.create_backend("dynamic", config, mha_pool())
    message = str(failure.value)
    assert "not one this cluster knows" in message  # (the master's reason)
    assert '"token"' in message and "$KVPOOL_TOKEN" in message


def test_a_master_certificate_of_another_ca_fails_the_start_with_what_to_fix(sg_cluster, tmp_path):
    # (else the engine would start, and every call fail the TLS check)
    other = make_dev_pki(tmp_path / "other-ca")
    config = storage_config(sg_cluster.master_address, params={"tls_ca": str(other.ca)})
    with pytest.raises(ValueError, match="certificate fails the TLS check") as failure:
        StorageBackendFactory.create_backend("dynamic", config, mha_pool())
    assert '"tls_ca"' in str(failure.value) and "$KVPOOL_TLS_CA" in str(failure.value)


def test_a_model_name_too_long_for_kvpool_keys_fails_the_start(sg_cluster):
    # (else every page key would be over kvpool's limit: every lookup a miss, every store
    # refused)
    config = storage_config(sg_cluster.master_address, model_name="/mnt/models/" + "m" * 1000)
    with pytest.raises(ValueError, match=r"limit is 1024.*/mnt/models/mmm") as failure:
        StorageBackendFactory.create_backend("dynamic", config, mha_pool())
    assert "shorter key_prefix" in str(failure.value)


def test_with_the_master_down_the_backend_starts_and_misses(make_backend):
    # (nothing listens there: engines must start while the cluster is down)
    backend = make_backend(master="127.0.0.1:1")
    assert backend.batch_exists(hashes(2)) == 0


@pytest.mark.parametrize("layout", PAGE_LAYOUTS)
def test_mha_pages_stored_from_the_host_pool_load_back_byte_for_byte(make_backend, layout):
    pool = mha_pool(layout)
    backend = make_backend(pool)
    keys = hashes(4)
    assert backend.batch_set_v1(keys, page_indices([0, 1, 2, 3], pool.page_size)) == [True] * 4
    assert backend.batch_exists(keys) == 4
    assert backend.batch_get_v1(keys, page_indices([9, 8, 11, 10], pool.page_size)) == [True] * 4
    assert same_pages(pool, [0, 1, 2, 3], [9, 8, 11, 10])


def test_mla_pages_stored_from_the_host_pool_load_back_byte_for_byte(make_backend):
    pool = MLAHostPool(16, 4, 3, 576)
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape).to(pool.dtype))
    backend = make_backend(pool, is_mla_model=True)
    keys = hashes(3)
    assert backend.batch_set_v1(keys, page_indices([4, 5, 6], pool.page_size)) == [True] * 3
    assert backend.batch_get_v1(keys, page_indices([12, 13, 14], pool.page_size)) == [True] * 3
    assert same_pages(pool, [4, 5, 6], [12, 13, 14])


def test_batch_exists_counts_the_consecutive_hits_from_the_first_key(make_backend):
    pool = mha_pool()
    backend = make_backend(pool)
    keys = hashes(6)
    stored = [0, 1, 2, 4]
    assert all(backend.batch_set_v1([keys[i] for i in stored], page_indices(stored, 4)))
    assert backend.batch_exists(keys) == 3  # key 3 is missing: 4 does not count
    assert backend.batch_exists(keys[3:]) == 0
    assert backend.batch_exists(keys[4:5]) == 1
    assert backend.batch_exists([]) == 0
    assert backend.exists(keys[0]) and not backend.exists(keys[5])


def test_missing_pages_are_misses_that_leave_their_host_pages_untouched(make_backend):
    pool = mha_pool()
    backend = make_backend(pool)
    keys = hashes(3)
    assert backend.batch_set_v1(keys[:1], page_indices([0], 4)) == [True]
    assert backend.batch_set_v1(keys[2:], page_indices([2], 4)) == [True]
    for page in (8, 9, 10):
        pool.page(page * 4).fill_(SENTINEL)
    # SGLang stops at the first False itself; the backend reports every page as it is
    assert backend.batch_get_v1(keys, page_indices([8, 9, 10], 4)) == [True, False, True]
    assert bool((pool.page(9 * 4) == SENTINEL).all())
    assert same_pages(pool, [0, 2], [8, 10])


def test_misses_log_a_bounded_number_of_lines(make_backend, caplog):
    # SGLang's prefetch threads load again and again; pages evicted are normal misses
    backend = make_backend(mha_pool())
    with caplog.at_level(logging.INFO, logger="kvpool.sglang"):
        for _ in range(20):
            assert backend.batch_get_v1(hashes(2), page_indices([0, 1], 4)) == [False, False]
    lines = [r for r in caplog.records if r.name.startswith("kvpool.sglang")]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.INFO and "2 of 2 page(s) missed" in lines[0].getMessage()


def lease_left(client: Client, names: list[str]) -> bool:
    """Whether any of ``names`` is still under a read lease (``stat`` takes none)."""
    return any(client.stat(name).lease_remaining_ms > 0 for name in names)


def test_a_load_gives_its_leases_back_and_its_lookups_run_out(make_backend):
    # A read lease pins its page against removal and eviction and counts against the
    # tenant's leases quota. A load gives its own leases back when it ends; its lookup's
    # (another client's: see the next test) run out after lookup_lease_s. The hits after a
    # lookup's first miss, which SGLang never loads, have theirs given back at once.
    pool = mha_pool()
    # (a load lease kept would pin the pages for load_timeout_s: longer than the wait below)
    params = {"load_timeout_s": 60, "lookup_lease_s": LOOKUP_LEASE_S}
    backend = make_backend(pool, params=params)
    keys = hashes(4)
    names = backend.kvpool_keys(keys)
    assert all(backend.batch_set_v1(keys, page_indices([0, 1, 2, 3], 4)))
    assert backend.batch_exists(keys) == 4
    assert backend.batch_get_v1(keys, page_indices([8, 9, 10, 11], 4)) == [True] * 4
    gap = hashes(3)
    assert all(backend.batch_set_v1([gap[0], gap[2]], page_indices([4, 5], 4)))
    assert backend.batch_exists(gap) == 1
    with Client(backend.settings.master) as other:  # (the same tenant; no force)
        assert other.remove_many(backend.kvpool_keys(gap[2:])) == [None]
        assert wait_until(lambda: not lease_left(other, names), timeout=LOOKUP_LEASE_S + SLACK)
        assert other.remove_many(names) == [None] * len(names)


def test_a_load_ending_leaves_another_requests_lookup_of_its_pages_leased(make_backend):
    # SGLang looks up request B's pages on its prefetch thread while its io thread loads
    # request A's, the same pages (a shared prefix). A's load giving its leases back must not
    # end B's lookup leases: the pages could else be evicted (or removed) before B's load.
    pool = mha_pool()
    params = {"load_timeout_s": 60, "lookup_lease_s": LOOKUP_LEASE_S}
    backend = make_backend(pool, params=params)
    keys = hashes(4)
    names = backend.kvpool_keys(keys)
    assert all(backend.batch_set_v1(keys, page_indices([0, 1, 2, 3], 4)))
    assert backend.batch_exists(keys) == 4  # A's lookup
    looked_up = time.monotonic()  # (B's lookup leases run from after this)
    assert backend.batch_exists(keys) == 4  # B's lookup
    assert backend.batch_get_v1(keys, page_indices([4, 5, 6, 7], 4)) == [True] * 4  # A's load
    with Client(backend.settings.master) as other:  # (the same tenant; no force)
        refused = other.remove_many(names)
        assert time.monotonic() - looked_up < LOOKUP_LEASE_S, "too slow to tell"
        assert all(isinstance(r, ObjectHasLease) for r in refused), refused
        assert backend.batch_get_v1(keys, page_indices([8, 9, 10, 11], 4)) == [True] * 4
        assert same_pages(pool, [0, 1, 2, 3], [8, 9, 10, 11])
        # B's lookup leases run out by themselves (B's load gave back only its own)
        assert wait_until(lambda: not lease_left(other, names), timeout=LOOKUP_LEASE_S + SLACK)
        assert time.monotonic() - looked_up > LOOKUP_LEASE_S - 0.5
        assert other.remove_many(names) == [None] * len(names)


def test_a_lookup_giving_back_hits_past_a_miss_never_ends_a_loads_lease(make_backend):
    # The io thread may still be reading a page when the prefetch thread's lookup of another
    # request finds it after a miss and gives its lease back: the load's lease must stand
    # (on a same-host mapped read, nothing would stop the copy if the page's space were
    # reused). The load's lease is taken here as its get takes it, by the load client.
    pool = mha_pool()
    backend = make_backend(pool, params={"load_timeout_s": 30})
    keys = hashes(3)
    assert all(backend.batch_set_v1([keys[0], keys[2]], page_indices([0, 2], 4)))
    [page] = backend.kvpool_keys(keys[2:])
    assert backend._load_client.exists_many([page]) == [True]  # the load, under way
    assert backend.batch_exists(keys) == 1  # the lookup: keys[2] is past its first miss
    with Client(backend.settings.master) as other:
        [refused] = other.remove_many([page])
        assert isinstance(refused, ObjectHasLease), refused
        assert other.remove_many([page], force=True) == [None]


def test_storing_a_stored_page_again_succeeds_and_keeps_the_first_bytes(make_backend):
    pool = mha_pool()
    backend = make_backend(pool)
    [key] = hashes(1)
    first = pool.page(0).clone()
    assert backend.batch_set_v1([key], page_indices([0], 4)) == [True]
    pool.page(0).fill_(1.0)
    assert backend.batch_set_v1([key], page_indices([0], 4)) == [True]  # pages are immutable
    assert backend.batch_get_v1([key], page_indices([5], 4)) == [True]
    assert torch.equal(pool.page(5 * 4), first)


def test_another_engine_of_the_same_model_and_layout_loads_the_pages(make_backend):
    writer_pool, reader_pool = mha_pool(), mha_pool()
    keys = hashes(2)
    assert all(make_backend(writer_pool).batch_set_v1(keys, page_indices([0, 1], 4)))
    reader = make_backend(reader_pool)
    assert reader.batch_exists(keys) == 2
    assert reader.batch_get_v1(keys, page_indices([3, 4], 4)) == [True, True]
    assert torch.equal(reader_pool.page(3 * 4), writer_pool.page(0))
    assert torch.equal(reader_pool.page(4 * 4), writer_pool.page(4))


@pytest.mark.parametrize(
    ("reader", "fields"),
    [
        ("another TP rank", {"tp_rank": 1, "tp_size": 2}),
        ("another model", {"model_name": "test/other-model"}),
        ("another pipeline stage", {"pp_rank": 1, "pp_size": 2}),
        ("another host layout", {"layout": "page_first_direct"}),
        ("another KV dtype", {"dtype": torch.float16}),
        # (pages of the same size in bytes: without the shape in the key, a hit whose heads
        # are cut in the wrong places)
        ("another head shape", {"head_num": 4, "head_dim": 32}),
    ],
)
def test_pages_laid_out_for_another_engine_are_misses(make_backend, reader, fields):
    keys = hashes(2)
    writer_fields = {"tp_rank": 0, "tp_size": 2} if "tp_rank" in fields else {}
    writer = make_backend(mha_pool(), **writer_fields)
    assert all(writer.batch_set_v1(keys, page_indices([0, 1], 4)))
    pool_fields = {
        k: fields.pop(k) for k in ("layout", "dtype", "head_num", "head_dim") if k in fields
    }
    other = make_backend(mha_pool(**pool_fields), **fields)
    assert other.batch_exists(keys) == 0, reader
    assert other.batch_get_v1(keys, page_indices([2, 3], 4)) == [False, False], reader


def test_a_page_of_another_size_is_a_miss_not_a_partial_copy(make_backend):
    pool = mha_pool()
    backend = make_backend(pool)
    [key] = hashes(1)
    # a writer whose page differs in size but not in name (say, another head count)
    with Client(backend.settings.master) as client:
        client.put(backend.kvpool_keys([key])[0], b"x" * (pool.page_bytes() // 2))
    pool.page(6 * 4).fill_(SENTINEL)
    assert backend.batch_get_v1([key], page_indices([6], 4)) == [False]
    assert bool((pool.page(6 * 4) == SENTINEL).all())


def test_host_indices_that_do_not_cover_whole_pages_are_refused(make_backend):
    backend = make_backend(mha_pool())
    with pytest.raises(ValueError, match="page_size"):
        backend.batch_set_v1(hashes(2), page_indices([0], 4))


def test_clear_removes_this_engines_pages_even_those_looked_up_lately(make_backend):
    pool = mha_pool()
    backend = make_backend(pool)
    keys = hashes(2)
    assert all(backend.batch_set_v1(keys, page_indices([0, 1], 4)))
    assert backend.batch_exists(keys) == 2  # (a lookup leases them, and keeps the leases)
    assert backend.clear() is True
    assert backend.batch_exists(keys) == 0


def test_a_page_another_engine_is_still_writing_is_not_reported_stored(make_backend):
    """(its put may yet fail: SGLang would count on a page kvpool never holds)"""
    pool = mha_pool()
    backend = make_backend(pool)
    [key] = hashes(1)
    [name] = backend.kvpool_keys([key])
    with being_written(backend.settings.master, name, pool.page_bytes()):
        assert backend.batch_set_v1([key], page_indices([0], 4)) == [False]
    assert backend.batch_set_v1([key], page_indices([0], 4)) == [True]
    assert backend.batch_get_v1([key], page_indices([3], 4)) == [True]
    assert torch.equal(pool.page(3 * 4), pool.page(0))


def test_close_is_idempotent_and_calls_after_it_miss_without_raising(sg_cluster):
    pool = mha_pool()
    backend = attach(storage_config(sg_cluster.master_address), pool)
    keys = hashes(2)
    assert all(backend.batch_set_v1(keys, page_indices([0, 1], 4)))
    backend.close()
    backend.close()
    assert backend.closed
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, page_indices([2, 3], 4)) == [False, False]
    assert backend.batch_set_v1(keys, page_indices([0, 1], 4)) == [False, False]
