"""Helpers for the LMCache adapter tests: an L1 arena of memory objects, and blocking wrappers
around the adapter's asynchronous tasks (submit, wait for the kind's event fd, collect)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
import time
import uuid

import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.internal_api import L1MemoryDesc
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

from kvpool.lmcache import KVPoolL2Adapter

ALIGN = 4096
WAIT_S = 20.0


class Arena:
    """A contiguous L1 arena, as LMCache has one, handing out aligned memory objects."""

    def __init__(self, size: int) -> None:
        self.tensor = torch.zeros(size, dtype=torch.uint8)
        self.size = size
        self.desc = L1MemoryDesc(ptr=self.tensor.data_ptr(), size=size, align_bytes=ALIGN)
        self._next = 0
        self._generator = torch.Generator().manual_seed(1234)

    def reset(self) -> None:
        self._next = 0

    def obj(self, nbytes: int, *, random: bool = True, fill: int = 0) -> TensorMemoryObj:
        start = self._next
        end = start + nbytes
        if end > self.size:
            raise MemoryError(f"test arena full ({self.size} bytes)")
        self._next = (end + ALIGN - 1) // ALIGN * ALIGN
        raw = self.tensor[start:end]
        if random:
            raw.copy_(
                torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=self._generator)
            )
        else:
            raw.fill_(fill)
        metadata = MemoryObjMetadata(
            shape=torch.Size([nbytes]),
            dtype=torch.uint8,
            address=raw.data_ptr(),
            phy_size=nbytes,
            fmt=MemoryFormat.KV_2LTD,
            ref_count=1,
        )
        return TensorMemoryObj(raw, metadata, parent_allocator=None)

    def objs(self, count: int, nbytes: int, **kwargs) -> list[TensorMemoryObj]:
        return [self.obj(nbytes, **kwargs) for _ in range(count)]


def model_name() -> str:
    """A model name of its own, so that tests sharing a cluster never share keys."""
    return f"test-model/{uuid.uuid4().hex[:12]}"


def object_keys(count: int, model: str | None = None, **fields) -> list[ObjectKey]:
    model = model or model_name()
    fields.setdefault("kv_rank", 0)
    return [ObjectKey(chunk_hash=os.urandom(16), model_name=model, **fields) for _ in range(count)]


def wait_fd(fd: int, timeout: float = WAIT_S) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(int(timeout * 1000)):
        return False
    with contextlib.suppress(BlockingIOError):
        os.eventfd_read(fd)
    return True


def _collect(adapter, fd: int, query, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        result = query()
        if result is not None:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the adapter did not complete the task in time")
        wait_fd(fd, remaining)


def store(adapter: KVPoolL2Adapter, keys, objs, timeout: float = WAIT_S):
    task_id = adapter.submit_store_task(keys, objs)
    done: dict = {}

    def query():
        done.update(adapter.pop_completed_store_tasks())
        return done.pop(task_id, None)

    return _collect(adapter, adapter.get_store_event_fd(), query, timeout)


def lookup(adapter: KVPoolL2Adapter, keys, timeout: float = WAIT_S):
    task_id = adapter.submit_lookup_and_lock_task(keys, {})
    return _collect(
        adapter,
        adapter.get_lookup_and_lock_event_fd(),
        lambda: adapter.query_lookup_and_lock_result(task_id),
        timeout,
    )


def load(adapter: KVPoolL2Adapter, keys, objs, timeout: float = WAIT_S):
    task_id = adapter.submit_load_task(keys, objs)
    return _collect(
        adapter,
        adapter.get_load_event_fd(),
        lambda: adapter.query_load_result(task_id),
        timeout,
    )


def bits(bitmap, n: int) -> list[bool]:
    return [bitmap.test(i) for i in range(n)]


def plugin_spec(master: str, **params) -> str:
    """The ``--l2-adapter`` JSON that loads kvpool through LMCache's plugin adapter type."""
    return json.dumps(
        {
            "type": "plugin",
            "module_path": "kvpool.lmcache",
            "class_name": "KVPoolL2Adapter",
            "adapter_params": {"master": master, **params},
        }
    )


class StoreWaiter:
    """Collects store results for several threads (``pop_completed_store_tasks`` hands each
    result to whichever caller pops first, so waiters share what was popped)."""

    def __init__(self, adapter: KVPoolL2Adapter) -> None:
        self._adapter = adapter
        self._done: dict = {}
        self._lock = threading.Lock()

    def wait(self, task_id: int, timeout: float = WAIT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                self._done.update(self._adapter.pop_completed_store_tasks())
                if task_id in self._done:
                    return self._done.pop(task_id)
            time.sleep(0.002)
        raise TimeoutError(f"store task {task_id} did not complete")


def poll_result(query, task_id: int, timeout: float = WAIT_S):
    """Polls ``query(task_id)`` (lookup or load) without the event fd."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = query(task_id)
        if result is not None:
            return result
        time.sleep(0.002)
    raise TimeoutError(f"task {task_id} did not complete")
