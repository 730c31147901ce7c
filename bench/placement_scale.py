"""``python -m bench.placement_scale``: the master's cost of a put batch as the cluster
grows.

Runs the master's core (master/state.py, no I/O) in this process, with 1 to 256 storage
nodes mounted, and times whole put cycles of 32 keys (PutStart, PutEnd, the nodes' answers)
for 1 and 2 replicas: the CPU a master spends per batch, which bounds the puts per second
one master serves. Placement once scanned every node for every key (about 6 ms per batch at
256 nodes); master/placement.py draws nodes (random) or keeps them in a heap (most-free)
instead. Prints a table and writes bench/results/placement_scale.json.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from bench.summary import print_and_save
from kvpool.common.gc_tuning import tune_for_server
from kvpool.common.status import Tier
from kvpool.master.config import MasterConfig
from kvpool.master.records import Commit, PutOptions, SegmentInfo
from kvpool.master.state import MasterState

HERE = Path(__file__).resolve().parent
BATCH = 32
OBJECT = 4096


def measure(nodes: int, replicas: int, batches: int, placement: str) -> float:
    """Median microseconds of master CPU per put cycle of ``BATCH`` keys."""
    state = MasterState(
        MasterConfig(placement=placement), clock=time.monotonic, rng=random.Random(1)
    )
    for n in range(nodes):
        info = SegmentInfo(
            segment_id=f"n{n}/dram0",
            node_id=f"n{n}",
            host=f"host{n}",
            worker_address=b"-",
            base_address=0x10_0000,
            size=64 << 30,
            rkey=b"-",
            tier=Tier.DRAM,
        )
        state.mount_segment(info, [])
    options = PutOptions(replicas=replicas)
    times = []
    for b in range(batches + 50):
        keys = [f"bench/{b}/{i}" for i in range(BATCH)]
        started = time.process_time()
        slots = state.put_start("bench", keys, [OBJECT] * BATCH, options)
        commits = [
            Commit(k, s.put_id, (True,) * len(s.replicas)) for k, s in zip(keys, slots, strict=True)
        ]
        state.put_end(commits)
        for command in state.outbox:
            state.command_done(command.command_id, True)
        state.outbox.clear()
        state.resolved.clear()
        if b >= 50:  # the first ones warm up
            times.append(time.process_time() - started)
    times.sort()
    return times[len(times) // 2] * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,8,64,256", help="cluster sizes")
    parser.add_argument("--batches", type=int, default=300, help="put cycles per measure")
    parser.add_argument("--placement", choices=("random", "most-free"), default="random")
    parser.add_argument("--json", default=str(HERE / "results" / "placement_scale.json"))
    args = parser.parse_args(argv)
    tune_for_server()  # as the master runs
    sizes = [int(n) for n in args.nodes.split(",")]
    results = {
        f"{nodes} nodes": {
            f"{replicas} replica{'s' if replicas > 1 else ''}": round(
                measure(nodes, replicas, args.batches, args.placement)
            )
            for replicas in (1, 2)
        }
        for nodes in sizes
    }
    title = f"master CPU per put cycle of {BATCH} keys ({args.placement} placement)"
    print_and_save(title, "cluster", results, args.json, unit="us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
