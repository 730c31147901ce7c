"""The kvpool LMCache adapter against the raw kvpool client, on one cluster.

    python bench/lmcache_adapter.py [--master HOST:PORT] [--chunk 32MiB] [--batch 16]

Both sides move the same chunks between the same pre-registered L1 arena and storage nodes:
the raw side with ``Client.put_many`` / ``get_into_many``, the adapter side with LMCache's
asynchronous calls (submit, wait on the event fd, collect), timed from submission to result.
"Load" is the load task alone; "lookup+load" adds the lookup-and-lock round trip that a
prefetch makes first. Without ``--master`` a local cluster is started, so bytes always cross
a process boundary. Each round runs both sides (which goes first alternates); the table
shows medians in GB/s, every load checked byte for byte.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import statistics
import sys
import time
import uuid

import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.internal_api import L1MemoryDesc
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

from kvpool import Client
from kvpool.common.sizes import format_size, parse_size
from kvpool.lmcache import KVPoolL2Adapter

ALIGN = 4096
#: Read leases (and the adapter's load deadline): removed chunks free their space after this.
LEASE_S = 5.0
#: Free space kept beyond a round's needs (the master evicts above 90 % use by default).
HEADROOM = 0.2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default=None, help="use this cluster instead of a local one")
    parser.add_argument("--chunk", default="32MiB", help="chunk size (default 32MiB)")
    parser.add_argument("--batch", type=int, default=16, help="chunks per task (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes of the local cluster")
    parser.add_argument("--dram", default="2GiB", help="DRAM per node of the local cluster")
    args = parser.parse_args(argv)
    chunk = parse_size(args.chunk)
    if args.master:
        return _bench(args.master, chunk, args.batch, args.rounds)
    from kvpool.local_cluster import LocalCluster

    print(f"starting a local cluster: {args.nodes} node(s) x {args.dram} DRAM ...", flush=True)
    with LocalCluster(args.nodes, args.dram) as cluster:
        cluster.export_client_env()
        return _bench(cluster.master_address, chunk, args.batch, args.rounds)


class Arena:
    """One contiguous L1 arena: ``batch`` source chunks, then ``batch`` target chunks."""

    def __init__(self, chunk: int, batch: int) -> None:
        self.chunk = (chunk + ALIGN - 1) // ALIGN * ALIGN
        self.batch = batch
        self.tensor = torch.empty(2 * batch * self.chunk, dtype=torch.uint8)
        self.desc = L1MemoryDesc(self.tensor.data_ptr(), self.tensor.numel(), ALIGN)
        for i in range(batch):
            view = self.tensor[i * self.chunk : i * self.chunk + chunk]
            view.copy_(torch.frombuffer(bytearray(os.urandom(chunk)), dtype=torch.uint8))
        self.sources = [self._obj(i, chunk) for i in range(batch)]
        self.targets = [self._obj(batch + i, chunk) for i in range(batch)]
        self.array = self.tensor.numpy()

    def _obj(self, slot: int, size: int) -> TensorMemoryObj:
        raw = self.tensor[slot * self.chunk : slot * self.chunk + size]
        meta = MemoryObjMetadata(
            shape=torch.Size([size]),
            dtype=torch.uint8,
            address=raw.data_ptr(),
            phy_size=size,
            fmt=MemoryFormat.KV_2LTD,
            ref_count=1,
        )
        return TensorMemoryObj(raw, meta, parent_allocator=None)

    def views(self, objs: list[TensorMemoryObj]):
        base = self.tensor.data_ptr()
        return [self.array[o.data_ptr - base : o.data_ptr - base + o.get_size()] for o in objs]

    def check(self) -> None:
        for source, target in zip(self.sources, self.targets, strict=True):
            if not torch.equal(source.tensor, target.tensor):
                raise SystemExit("loaded bytes differ from stored bytes")
        for target in self.targets:
            target.tensor.zero_()


def _wait(fd: int, query, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while (result := query()) is None:
        if time.monotonic() > deadline:
            raise SystemExit("the adapter did not finish a task in time")
        if poller.poll(100):
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(fd)
    return result


def _raw_round(client: Client, arena: Arena, keys: list[str]) -> tuple[float, float]:
    started = time.perf_counter()
    pairs = list(zip(keys, arena.views(arena.sources), strict=True))
    errors = [r for r in client.put_many(pairs) if _bad(r)]
    stored = time.perf_counter() - started
    started = time.perf_counter()
    errors += [r for r in client.get_into_many(keys, arena.views(arena.targets)) if _bad(r)]
    loaded = time.perf_counter() - started
    if errors:
        raise SystemExit(f"raw client: {errors[0]}")
    arena.check()
    client.remove_many(keys, force=True)
    return stored, loaded


def _adapter_round(
    adapter: KVPoolL2Adapter, arena: Arena, keys: list[ObjectKey]
) -> tuple[float, float, float]:
    started = time.perf_counter()
    task = adapter.submit_store_task(keys, arena.sources)
    done: dict = {}

    def popped():
        done.update(adapter.pop_completed_store_tasks())
        return done.pop(task, None)

    if not _wait(adapter.get_store_event_fd(), popped).is_successful():
        raise SystemExit("adapter: store failed")
    stored = time.perf_counter() - started

    started = time.perf_counter()
    task = adapter.submit_lookup_and_lock_task(keys, {})
    found = _wait(
        adapter.get_lookup_and_lock_event_fd(),
        lambda: adapter.query_lookup_and_lock_result(task),
    )
    looked_up = time.perf_counter() - started
    started = time.perf_counter()
    task = adapter.submit_load_task(keys, arena.targets)
    loaded_bits = _wait(adapter.get_load_event_fd(), lambda: adapter.query_load_result(task))
    loaded = time.perf_counter() - started
    adapter.submit_unlock(keys)
    if found.popcount() != len(keys) or loaded_bits.popcount() != len(keys):
        raise SystemExit("adapter: lookup or load missed")
    arena.check()
    adapter.delete(keys)
    return stored, loaded, looked_up + loaded


def _wait_for_room(client: Client, needed: int, chunk: int, timeout: float = 60.0) -> None:
    """Removed objects free their space once their read leases end: wait for it, with
    headroom, so that the master's eviction (above its high watermark) never takes the
    chunks of the round being measured."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        segments = client.cluster_status().segments
        capacity = sum(s.capacity for s in segments)
        free = capacity - sum(s.used for s in segments)
        if free >= needed + HEADROOM * capacity and max(s.largest_free for s in segments) >= chunk:
            return
        time.sleep(0.2)
    raise SystemExit(f"the cluster has no room for {format_size(needed)}: give it more --dram")


def _bad(result) -> bool:
    return isinstance(result, Exception)


def _bench(master: str, chunk: int, batch: int, rounds: int) -> int:
    arena = Arena(chunk, batch)
    total = chunk * batch
    print(f"{batch} chunks x {format_size(chunk)} per task, {rounds} round(s), master {master}")
    raw = Client(master, replicas=1, timeout=60, lease_ttl=LEASE_S)
    raw.register_buffer(arena.array)
    adapter = KVPoolL2Adapter(
        {"master": master, "replicas": 1, "store_timeout_s": 60, "load_timeout_s": LEASE_S},
        l1_memory_desc=arena.desc,
    )
    samples: dict[str, list[float]] = {
        "raw store": [],
        "raw load": [],
        "adapter store": [],
        "adapter load": [],
        "adapter lookup+load": [],
    }
    try:
        for round_ in range(rounds + 1):  # round 0 warms up endpoints and page tables
            _wait_for_room(raw, 2 * total, chunk)
            tag = uuid.uuid4().hex[:8]
            raw_keys = [f"bench-raw/{tag}/{i}" for i in range(batch)]
            lm_keys = [
                ObjectKey(chunk_hash=os.urandom(16), model_name=f"bench/{tag}", kv_rank=0)
                for _ in range(batch)
            ]
            if round_ % 2:  # alternate which side goes first
                raw_store, raw_load = _raw_round(raw, arena, raw_keys)
                lm_store, lm_load, lm_both = _adapter_round(adapter, arena, lm_keys)
            else:
                lm_store, lm_load, lm_both = _adapter_round(adapter, arena, lm_keys)
                raw_store, raw_load = _raw_round(raw, arena, raw_keys)
            if round_ == 0:
                continue
            for name, seconds in zip(
                samples, (raw_store, raw_load, lm_store, lm_load, lm_both), strict=True
            ):
                samples[name].append(total / seconds / 1e9)
    finally:
        adapter.close()
        raw.close()
    gbps = {name: statistics.median(values) for name, values in samples.items()}
    print()
    print(f"| {'path':<22} | {'GB/s':>6} | {'vs raw':>7} |")
    print(f"|{'-' * 24}|{'-' * 8}|{'-' * 9}|")
    for name, value in gbps.items():
        base = gbps["raw store"] if "store" in name else gbps["raw load"]
        print(f"| {name:<22} | {value:6.2f} | {value / base:6.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
