"""``python -m bench.full_store``: put latency in a store that is always full.

A KV cache runs full: every put makes the master evict least recently used objects. This
starts a local cluster (one master, one node with a small DRAM segment), lets one client put
batches of small objects without pause for a while, and prints the put latency percentiles for
each object size. With small objects an eviction pass takes thousands of them; the master
runs it in steps, answering calls between them (``MasterState.tick(step)``), which is what the
tail percentiles here show. Every batch must succeed; the newest batch is read back and
checked byte for byte. Prints a table and writes bench/results/full_store.json.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench.summary import print_and_save
from kvpool import Client
from kvpool.common.sizes import format_size, parse_size
from kvpool.local_cluster import LocalCluster

HERE = Path(__file__).resolve().parent
BATCH = 32
WARM_UP = 200  # batches left out: the store fills during them
PERCENTILES = (0.5, 0.9, 0.99, 0.999)


def measure(client: Client, size: int, seconds: float) -> dict[str, float]:
    """Puts batches of ``BATCH`` objects of ``size`` bytes for ``seconds`` (after the warm-up);
    returns the percentiles of a batch's latency in ms, and batches per second."""
    payloads = [os.urandom(size) for _ in range(BATCH)]
    prefix = f"full-{size}"
    latencies: list[float] = []
    batch = 0
    started = 0.0
    while True:
        if batch == WARM_UP:
            started = time.monotonic()
        elif batch > WARM_UP and time.monotonic() - started >= seconds:
            break
        items = [(f"{prefix}/{batch}/{i}", data) for i, data in enumerate(payloads)]
        sent = time.perf_counter()
        results = client.put_many(items)
        elapsed = time.perf_counter() - sent
        failed = [r for r in results if not isinstance(r, int)]
        if failed:
            raise SystemExit(f"a put failed in a full store: {failed[0]!r}")
        if batch >= WARM_UP:
            latencies.append(elapsed)
        batch += 1
    newest = [key for key, _ in items]
    if client.get_many(newest) != payloads:
        raise SystemExit("the newest batch did not read back exactly")
    latencies.sort()
    row = {
        f"p{p * 100:g} (ms)": latencies[int(p * (len(latencies) - 1))] * 1e3 for p in PERCENTILES
    }
    row["max (ms)"] = latencies[-1] * 1e3
    row["batches/s"] = len(latencies) / (time.monotonic() - started)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="64MiB", help="the node's DRAM (default 64MiB)")
    parser.add_argument("--sizes", default="4KiB,64KiB", help="object sizes, one run each")
    parser.add_argument("--seconds", type=float, default=15.0, help="per size (default 15)")
    parser.add_argument("--json", default=str(HERE / "results" / "full_store.json"))
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results: dict[str, dict[str, float]] = {}
    with (
        LocalCluster(1, args.store) as cluster,
        Client(cluster.master_address, **cluster.client_credentials()) as client,
    ):
        for size in sizes:
            print(f"putting batches of {BATCH} x {format_size(size)} for {args.seconds:g} s")
            results[format_size(size)] = measure(client, size, args.seconds)
    title = f"put latency, batches of {BATCH}, {args.store} store kept full"
    print_and_save(title, "object size", results, args.json, "{:,.2f}".format)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
