"""The checks SGLang 0.5.23 ships for a zero-copy HiCache backend
(``sglang/srt/mem_cache/storage/mooncake_store/test_mooncake_store.py``), run against kvpool's
backend: the same mock host pool, the same calls, the same assertions. (That file imports
Mooncake's own store, so its functions cannot be run as they are.)"""

from __future__ import annotations

import uuid

import pytest
import torch
from sglang_support import storage_config


def create_mock_host_kv_cache(
    buffer_size, entries_per_page=2, page_elements=1, dtype=torch.float32
):
    """SGLang's ``create_mock_host_kv_cache``, as shipped."""
    buffer = torch.randn(buffer_size, dtype=dtype)

    class MockHostKVCache:
        def __init__(self, buffer, entries_per_page, page_elements):
            self.kv_buffer = buffer
            self.layout = "page_first"
            self.page_size = 1
            self.entries_per_page = entries_per_page
            self.page_elements = page_elements

        def get_page_buffer_meta(self, indices):
            ptr_list = []
            element_size_list = []
            for idx in indices:
                page_idx = int(idx)
                page_offset = page_idx * self.entries_per_page * self.page_elements
                for entry_idx in range(self.entries_per_page):
                    offset = page_offset + entry_idx * self.page_elements
                    ptr_list.append(self.kv_buffer[offset:].data_ptr())
                    element_size_list.append(self.page_elements * self.kv_buffer.element_size())
            return ptr_list, element_size_list

        def get_ksize_per_token(self):
            return self.entries_per_page * self.page_elements * self.kv_buffer.element_size()

    return MockHostKVCache(buffer, entries_per_page, page_elements), buffer


def make_store(sg_cluster, **fields):
    """``MooncakeStore(config)`` in SGLang's test; here the class SGLang's factory loads."""
    from kvpool.sglang import KVPoolHiCacheStorage

    return KVPoolHiCacheStorage(storage_config(sg_cluster.master_address, **fields))


def test_single_operation(sg_cluster):
    buffer_size = 1024 * 1024 * 16
    value_elements = 1024
    store = make_store(sg_cluster, is_mla_model=False, tp_rank=0, tp_size=1)
    try:
        mock_host_kv_cache, buffer = create_mock_host_kv_cache(
            buffer_size, entries_per_page=2, page_elements=value_elements
        )
        store.register_mem_pool_host(mock_host_kv_cache)
        value_size = value_elements * buffer.element_size()
        key = str(uuid.uuid4())
        set_slice = buffer[:value_elements]
        get_slice = buffer[value_elements : 2 * value_elements]
        result = store.set(key, target_location=set_slice.data_ptr(), target_sizes=value_size)
        assert result is True, f"set operation failed for key: {key}"
        assert store.exists(key), f"key {key} should exist after set operation"
        result = store.get(key, target_location=get_slice.data_ptr(), target_sizes=value_size)
        assert result is True, f"get operation failed for key: {key}"
        assert torch.allclose(set_slice, get_slice, atol=1e-6), f"get operation failed: {key}"
    finally:
        store.close()


@pytest.mark.parametrize(
    ("is_mla_model", "tp_rank", "tp_size"),
    [(False, 0, 1), (True, 0, 1), (False, 1, 4), (True, 3, 8)],
)
def test_batch_operation(sg_cluster, is_mla_model, tp_rank, tp_size):
    buffer_size = 1024 * 1024 * 16
    value_elements = 256
    kv_num = 13
    entries_per_page = 1 if is_mla_model else 2
    store = make_store(sg_cluster, is_mla_model=is_mla_model, tp_rank=tp_rank, tp_size=tp_size)
    try:
        mock_host_kv_cache, buffer = create_mock_host_kv_cache(
            buffer_size, entries_per_page=entries_per_page, page_elements=value_elements
        )
        store.register_mem_pool_host(mock_host_kv_cache)
        keys = ["test_" + str(uuid.uuid4()) for _ in range(kv_num)]
        set_slices = [
            buffer[i * value_elements : (i + 1) * value_elements]
            for i in range(kv_num * entries_per_page)
        ]
        result = store.batch_set_v1(keys, torch.arange(kv_num))
        assert all(result), "batch set operation failed"
        assert store.batch_exists(keys) == kv_num, "keys should exist after batch set"
        get_slices = [
            buffer[
                (kv_num * entries_per_page + i) * value_elements : (
                    kv_num * entries_per_page + i + 1
                )
                * value_elements
            ]
            for i in range(kv_num * entries_per_page)
        ]
        result = store.batch_get_v1(keys, torch.arange(kv_num, 2 * kv_num))
        assert all(result), "batch get operation failed"
        for i in range(kv_num * entries_per_page):
            assert torch.allclose(set_slices[i], get_slices[i], atol=1e-6), (
                f"batch get operation failed for key: {keys[i // entries_per_page]}"
            )
    finally:
        store.close()
