"""kvpool's SGLang HiCache backend against the raw kvpool client, on one cluster.

    python -m bench.sglang_plugin [--master HOST:PORT] [--page-tokens 64] [--batch 16]

Both sides move the same pages between the same registered host KV pool (laid out as
SGLang's ``MHATokenToKVPoolHost`` with ``page_first``: a page is its K and its V, each one
piece) and the storage nodes: the raw side with ``Client.put_parts_many`` /
``get_into_parts_many`` (``exists_many`` first, for a prefetch) on pieces it prepared
beforehand, the backend side with the calls
SGLang's cache controller makes (``batch_set_v1``, ``batch_get_v1``, and
``batch_exists`` + ``batch_get_v1`` as a prefetch does), the backend built by SGLang's own
factory from the "dynamic" configuration. Without ``--master`` a local cluster is started,
so bytes always cross a process boundary. Each round runs both sides (which goes first
alternates); the table shows medians in GB/s, every load checked byte for byte.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from bench.sglang_host_pool import MHAHostPool, page_indices
from kvpool import Client
from kvpool.common.sizes import format_size
from kvpool.sglang.pages import HostPages

#: Read leases (and the backend's load deadline): removed pages free their space after this.
LEASE_S = 5.0
#: Free space kept beyond a round's needs (the master evicts above 90 % use by default).
HEADROOM = 0.2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default=None, help="use this cluster instead of a local one")
    parser.add_argument("--page-tokens", type=int, default=64, help="tokens per page (64)")
    parser.add_argument("--layers", type=int, default=32, help="layers (32: Llama-3.1-8B)")
    parser.add_argument("--heads", type=int, default=8, help="KV heads of this rank (8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dimension (128)")
    parser.add_argument("--batch", type=int, default=16, help="pages per call (default 16)")
    parser.add_argument("--rounds", type=int, default=9, help="measured rounds (default 9)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes of the local cluster")
    parser.add_argument("--dram", default="1GiB", help="DRAM per node of the local cluster")
    args = parser.parse_args(argv)
    pool = MHAHostPool(2 * args.batch, args.page_tokens, args.layers, args.heads, args.head_dim)
    if args.master:
        return _bench(args.master, pool, args.batch, args.rounds)
    from kvpool.local_cluster import LocalCluster

    print(f"starting a local cluster: {args.nodes} node(s) x {args.dram} DRAM ...", flush=True)
    with LocalCluster(args.nodes, args.dram) as cluster:
        cluster.export_client_env()
        return _bench(cluster.master_address, pool, args.batch, args.rounds)


def _backend(master: str, pool: MHAHostPool):
    """The backend as SGLang's cache controller attaches it (TP1, page_first host pool)."""
    config = HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="bench/model",
        extra_config={
            "backend_name": "kvpool",
            "module_path": "kvpool.sglang",
            "class_name": "KVPoolHiCacheStorage",
            "interface_v1": 1,
            "master": master,
            "replicas": 1,
            "store_timeout_s": 60,
            "load_timeout_s": LEASE_S,
        },
    )
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    backend.on_host_pools_registered()
    return backend


class Pages:
    """The pool's first ``batch`` pages are the sources, the next ``batch`` the targets."""

    def __init__(self, pool: MHAHostPool, batch: int) -> None:
        self.pool, self.batch = pool, batch
        pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape).to(pool.dtype))
        self.sources = page_indices(list(range(batch)), pool.page_size)
        self.targets = page_indices(list(range(batch, 2 * batch)), pool.page_size)
        pages = HostPages(pool)
        self.source_pieces = pages.pieces(batch, self.sources)
        self.target_pieces = pages.pieces(batch, self.targets)

    def check(self) -> None:
        size = self.pool.page_size
        for i in range(self.batch):
            if not torch.equal(self.pool.page(i * size), self.pool.page((self.batch + i) * size)):
                raise SystemExit("loaded bytes differ from stored bytes")
        for i in range(self.batch):
            self.pool.page((self.batch + i) * size).zero_()


def _raw_round(client: Client, pages: Pages, keys: list[str]) -> tuple[float, float, float]:
    started = time.perf_counter()
    errors = [
        r for r in client.put_parts_many(zip(keys, pages.source_pieces, strict=True)) if _bad(r)
    ]
    stored = time.perf_counter() - started
    started = time.perf_counter()
    loaded_results = client.get_into_parts_many(zip(keys, pages.target_pieces, strict=True))
    loaded = time.perf_counter() - started
    errors += [r for r in loaded_results if _bad(r)]
    if errors:
        raise SystemExit(f"raw client: {errors[0]}")
    pages.check()
    started = time.perf_counter()
    found = client.exists_many(keys)
    loaded_results = client.get_into_parts_many(zip(keys, pages.target_pieces, strict=True))
    both = time.perf_counter() - started
    if not all(f is True for f in found) or any(_bad(r) for r in loaded_results):
        raise SystemExit("raw client: a lookup or load missed")
    pages.check()
    client.remove_many(keys, force=True)
    return stored, loaded, both


def _backend_round(
    backend, client: Client, pages: Pages, keys: list[str]
) -> tuple[float, float, float]:
    started = time.perf_counter()
    stored_ok = backend.batch_set_v1(keys, pages.sources)
    stored = time.perf_counter() - started
    started = time.perf_counter()
    loaded_ok = backend.batch_get_v1(keys, pages.targets)
    loaded = time.perf_counter() - started
    if not all(stored_ok) or not all(loaded_ok):
        raise SystemExit("backend: a store or load failed")
    pages.check()
    started = time.perf_counter()
    hits = backend.batch_exists(keys)
    both_ok = backend.batch_get_v1(keys[:hits], pages.targets[: hits * pages.pool.page_size])
    both = time.perf_counter() - started
    if hits != len(keys) or not all(both_ok):
        raise SystemExit("backend: a lookup or load missed")
    pages.check()
    client.remove_many(backend.kvpool_keys(keys), force=True)
    return stored, loaded, both


def _wait_for_room(client: Client, needed: int, page: int, timeout: float = 60.0) -> None:
    """Removed objects free their space once their read leases end: wait for it, with
    headroom, so that the master's eviction never takes the pages being measured."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        segments = client.cluster_status().segments
        capacity = sum(s.capacity for s in segments)
        free = capacity - sum(s.used for s in segments)
        if free >= needed + HEADROOM * capacity and max(s.largest_free for s in segments) >= page:
            return
        time.sleep(0.2)
    raise SystemExit(f"the cluster has no room for {format_size(needed)}: give it more --dram")


def _bad(result: object) -> bool:
    return isinstance(result, Exception)


def _bench(master: str, pool: MHAHostPool, batch: int, rounds: int) -> int:
    pages = Pages(pool, batch)
    total = pool.page_bytes() * batch
    print(
        f"{batch} pages x {format_size(pool.page_bytes())} (K and V, {pool.page_size} tokens) "
        f"per call, {rounds} round(s), master {master}"
    )
    raw = Client(master, replicas=1, timeout=60, lease_ttl=LEASE_S)
    raw.register_buffer(memoryview(pool.kv_buffer.view(torch.uint8).numpy()).cast("B"))
    backend = _backend(master, pool)
    samples: dict[str, list[float]] = {
        "raw store": [],
        "raw load": [],
        "raw exists+load": [],
        "backend store": [],
        "backend load": [],
        "backend exists+load": [],
    }
    try:
        for round_ in range(rounds + 1):  # round 0 warms up endpoints and page tables
            _wait_for_room(raw, 2 * total, pool.page_bytes())
            tag = uuid.uuid4().hex[:8]
            raw_keys = [f"bench-raw/{tag}/{i}" for i in range(batch)]
            sg_keys = [f"{tag}{i:056x}" for i in range(batch)]
            if round_ % 2:  # alternate which side goes first
                raw_times = _raw_round(raw, pages, raw_keys)
                sg_times = _backend_round(backend, raw, pages, sg_keys)
            else:
                sg_times = _backend_round(backend, raw, pages, sg_keys)
                raw_times = _raw_round(raw, pages, raw_keys)
            if round_ == 0:
                continue
            for name, seconds in zip(samples, (*raw_times, *sg_times), strict=True):
                samples[name].append(total / seconds / 1e9)
    finally:
        backend.close()
        raw.close()
    gbps = {name: statistics.median(values) for name, values in samples.items()}
    print()
    print(f"| {'path':<22} | {'GB/s':>6} | {'vs raw':>7} |")
    print(f"|{'-' * 24}|{'-' * 8}|{'-' * 9}|")
    for name, value in gbps.items():
        base = gbps["raw " + name.split(" ", 1)[1]]
        print(f"| {name:<22} | {value:6.2f} | {value / base:6.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
