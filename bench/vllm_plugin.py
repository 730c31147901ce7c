"""kvpool's vLLM tier (``kvpool.vllm``) against the raw kvpool client, on one cluster.

    .venv-vllm/bin/python -m bench.vllm_plugin [--master HOST:PORT] [--chunk 8MiB] [--batch 16]

Runs in .venv-vllm (scripts/install_vllm.sh): the tier is built the way vLLM builds it, by
``TieringOffloadingSpec.get_manager`` from a ``secondary_tiers`` entry naming the module path,
over the spec's own shared primary region. Both sides move the same batches between the same
primary slots (registered once by each) and the storage nodes: the raw side with
``Client.put_many`` / ``get_into_many`` on the calling thread, the tier with vLLM's calls
(``submit_store`` / ``submit_load``, then ``get_finished_jobs``), timed from submission to the
result in hand. "polled" collects the result the way a scheduler does, one poll per
millisecond-long step; "drained" waits with ``drain_jobs`` (no poll granularity). "in flight"
submits ``--in-flight`` jobs at once and polls once a millisecond until all are answered, as a
scheduler does with the jobs of several requests: the poll's granularity then overlaps the
transfers, and the raw side moves the same batches one call after another. Which side goes
first alternates per round; medians in GB/s; every load checked byte for byte. Without
``--master`` a local cluster is started, so bytes always cross a process boundary.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
import uuid

import numpy as np
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.base import TransferJob

from kvpool import Client
from kvpool.common.sizes import format_size, parse_size

PAGE = 4096
#: Read leases (and the tier's load deadline): removed chunks free their space after this.
LEASE_S = 5.0
#: Free space kept beyond a round's needs (the master evicts above 90 % use by default).
HEADROOM = 0.2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default=None, help="use this cluster instead of a local one")
    parser.add_argument("--chunk", default="8MiB", help="bytes per primary slot (default 8MiB)")
    parser.add_argument("--batch", type=int, default=16, help="chunks per job (default 16)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes of the local cluster")
    parser.add_argument("--dram", default="1GiB", help="DRAM per node of the local cluster")
    parser.add_argument(
        "--in-flight", type=int, default=4, help="jobs submitted at once, polled (default 4)"
    )
    args = parser.parse_args(argv)
    if args.in_flight < 1:
        parser.error("--in-flight must be at least 1")
    chunk = (parse_size(args.chunk) + PAGE - 1) // PAGE * PAGE
    if args.master:
        return _bench(args.master, chunk, args.batch, args.rounds, args.in_flight)
    from kvpool.local_cluster import LocalCluster

    print(f"starting a local cluster: {args.nodes} node(s) x {args.dram} DRAM ...", flush=True)
    with LocalCluster(args.nodes, args.dram) as cluster:
        cluster.export_client_env()
        return _bench(cluster.master_address, chunk, args.batch, args.rounds, args.in_flight)


def _manager(master: str, chunk: int, batch: int):
    """vLLM's tiering manager with one kvpool tier, over ``2 * batch`` primary slots."""
    tier = {
        "type": "KVPoolTierManager",
        "module_path": "kvpool.vllm",
        "master": master,
        "replicas": 1,
        "store_timeout_s": 60,
        "load_timeout_s": LEASE_S,
    }
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=chunk,
        enable_kv_cache_events=False,
        extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 2 * batch * chunk,
            "secondary_tiers": [tier],
        },
        engine_id=f"kvpool-bench-{os.getpid()}",
        model=OffloadingModelConfig(name="kvpool-bench/model", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    return OffloadingSpecFactory.create_spec(config).get_manager()


class Slots:
    """The primary region as numpy: sources in slots [0, batch), targets in [batch, 2 batch)."""

    def __init__(self, view: memoryview, batch: int) -> None:
        self.flat = view.cast("B")
        self.array = np.frombuffer(self.flat, dtype=np.uint8).reshape(view.shape)
        self.batch = batch
        rng = np.random.default_rng(0)
        for i in range(batch):
            self.array[i] = rng.integers(0, 256, self.array.shape[1], dtype=np.uint8)
        self.expected = [hashlib.sha256(self.array[i].tobytes()).digest() for i in range(batch)]

    def sources(self) -> list[memoryview]:
        return [self.flat[i * self.stride : (i + 1) * self.stride] for i in range(self.batch)]

    def targets(self) -> list[memoryview]:
        b, s = self.batch, self.stride
        return [self.flat[(b + i) * s : (b + i + 1) * s] for i in range(b)]

    @property
    def stride(self) -> int:
        return self.array.shape[1]

    def check(self) -> None:
        for i in range(self.batch):
            if hashlib.sha256(self.array[self.batch + i].tobytes()).digest() != self.expected[i]:
                raise SystemExit("loaded bytes differ from stored bytes")
        self.array[self.batch :] = 0


def _raw_round(client: Client, slots: Slots, names: list[str]) -> tuple[float, float]:
    started = time.perf_counter()
    errors = [r for r in client.put_many(list(zip(names, slots.sources(), strict=True))) if _bad(r)]
    stored = time.perf_counter() - started
    started = time.perf_counter()
    errors += [r for r in client.get_into_many(names, slots.targets()) if _bad(r)]
    loaded = time.perf_counter() - started
    if errors:
        raise SystemExit(f"raw client: {errors[0]}")
    slots.check()
    client.remove_many(names, force=True)
    return stored, loaded


def _tier_jobs(tier, job_id: int, key_sets, chunk_ids, load: bool, polled: bool) -> float:
    """Submits one job per key set (all at once) and waits until every one is answered."""
    jobs = [
        TransferJob(
            job_id=job_id + i,
            keys=keys,
            chunk_ids=np.array(chunk_ids, dtype=np.int32),
            is_promotion=load,
            req_context=ReqContext(req_id="bench"),
        )
        for i, keys in enumerate(key_sets)
    ]
    started = time.perf_counter()
    for job in jobs:
        (tier.submit_load if load else tier.submit_store)(job)
    results: list = []
    while len(results) < len(jobs):
        if polled:
            time.sleep(0.001)  # one scheduler step
        else:
            tier.drain_jobs()
        results += tier.get_finished_jobs()
    seconds = time.perf_counter() - started
    if not all(result.success for result in results):
        raise SystemExit(f"tier: a {'load' if load else 'store'} job failed")
    if len(jobs) == 1:
        OWN_TIME.append(seconds - (results[0].transfer_time or 0.0))
    return seconds


#: Per tier job: its time from submission to result in hand, less the kvpool call it made
#: (the job's transfer_time): what the tier itself costs (thread hand-off, names, results).
OWN_TIME: list[float] = []


def _tier_round(
    tier, client: Client, slots: Slots, job: int, polled: bool, jobs: int = 1
) -> tuple[float, float]:
    """``jobs`` store jobs of one batch each, then their loads (each into the target slots:
    the jobs of a kind run one after another, so every load is checked by the last)."""
    key_sets = [
        [make_offload_key(uuid.uuid4().bytes, 0) for _ in range(slots.batch)] for _ in range(jobs)
    ]
    sources = list(range(slots.batch))
    targets = list(range(slots.batch, 2 * slots.batch))
    stored = _tier_jobs(tier, job, key_sets, sources, load=False, polled=polled)
    loaded = _tier_jobs(tier, job + jobs, key_sets, targets, load=True, polled=polled)
    slots.check()
    client.remove_many([tier.name(k) for keys in key_sets for k in keys], force=True)
    return stored, loaded


def _wait_for_room(client: Client, needed: int, chunk: int, timeout: float = 60.0) -> None:
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


def _bench(master: str, chunk: int, batch: int, rounds: int, in_flight: int) -> int:
    manager = _manager(master, chunk, batch)
    (tier,) = manager.secondary_tiers
    slots = Slots(manager.primary_tier.get_kv_memoryview(), batch)
    total = chunk * batch
    print(f"{batch} chunks x {format_size(chunk)} per job, {rounds} round(s), master {master}")
    raw = Client(master, replicas=1, timeout=60, lease_ttl=LEASE_S)
    raw.register_buffer(slots.flat)
    names = ["raw store", "raw load", "tier store (drained)", "tier load (drained)"]
    names += ["tier store (polled)", "tier load (polled)"]
    names += [f"tier store ({in_flight} in flight)", f"tier load ({in_flight} in flight)"]
    samples: dict[str, list[float]] = {name: [] for name in names}
    job = 0
    try:
        for round_ in range(rounds + 1):  # round 0 warms up endpoints and page tables
            _wait_for_room(raw, (2 + in_flight) * total, chunk)
            tag = uuid.uuid4().hex[:8]
            raw_names = [f"bench-raw/{tag}/{i}" for i in range(batch)]
            order = [0, 1, 2, 3] if round_ % 2 else [1, 2, 3, 0]
            timings = {}
            for side in order:
                if side == 0:
                    timings[side] = _raw_round(raw, slots, raw_names)
                else:
                    jobs = in_flight if side == 3 else 1
                    timings[side] = _tier_round(tier, raw, slots, job, side >= 2, jobs)
                    job += 2 * jobs
            if round_ == 0:
                continue
            flat = [*timings[0], *timings[1], *timings[2]]
            for name, seconds in zip(samples, flat, strict=False):
                samples[name].append(total / seconds / 1e9)
            for name, seconds in zip(names[-2:], timings[3], strict=True):
                samples[name].append(in_flight * total / seconds / 1e9)
    finally:
        raw.close()
        del slots  # (its views of the primary region go before vLLM unmaps it)
        manager.shutdown()
    gbps = {name: statistics.median(values) for name, values in samples.items()}
    print()
    print(f"| {'path':<26} | {'GB/s':>6} | {'vs raw':>7} |")
    print(f"|{'-' * 28}|{'-' * 8}|{'-' * 9}|")
    for name, value in gbps.items():
        base = gbps["raw store"] if "store" in name else gbps["raw load"]
        print(f"| {name:<26} | {value:6.2f} | {value / base:6.0%} |")
    own = statistics.median(OWN_TIME)
    single = [v for k, v in gbps.items() if k.startswith("tier") and "in flight" not in k]
    job = statistics.median(total / v for v in single) / 1e9
    print(
        f"\nthe tier's own time per job (submission to result, less its kvpool call): "
        f"median {own * 1e3:.2f} ms of {job * 1e3:.1f} ms ({own / job:.1%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
