"""``kvpool bench`` (or ``python -m bench.throughput`` from the checkout's root): put and get
throughput between this process and storage node processes.

It measures the cluster of ``--master``, else of ``$KVPOOL_MASTER`` (as every kvpool command
does), else (or with ``--local``) a local cluster it starts (master + nodes as child
processes), so the bytes always cross a process boundary. Objects are written from, and read
into, one pre-registered buffer (the zero-copy path an inference engine uses).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass

from kvpool.common.sizes import format_size, parse_size

DESCRIPTION = (
    "put/get throughput between this process and storage node processes, of the cluster at "
    "--master, else at $KVPOOL_MASTER, else of a local cluster it starts"
)
ENV_VAR = "KVPOOL_MASTER"
DEFAULT_SIZES = "1MiB,32MiB"
#: Read lease of the benchmark's gets, in seconds.
LEASE = 1.0


@dataclass
class Result:
    tier: str
    size: int
    count: int
    put_gbps: float
    get_gbps: float
    put_p50_ms: float
    get_p50_ms: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    now = os.environ.get(ENV_VAR, "")
    parser.add_argument(
        "--master",
        default=None,
        help=f"the cluster to measure, HOST:PORT (default: ${ENV_VAR}, "
        + (f"now {now}" if now else "unset here")
        + "; without either, a local cluster it starts)",
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help=f"measure a local cluster it starts, even where ${ENV_VAR} is set",
    )
    parser.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"object sizes (default {DEFAULT_SIZES})"
    )
    parser.add_argument(
        "--bytes", default="512MiB", help="bytes moved per size and direction (default 512MiB)"
    )
    parser.add_argument("--nodes", type=int, default=2, help="nodes of the local cluster")
    parser.add_argument("--dram", default="1GiB", help="DRAM per node of the local cluster")
    parser.add_argument(
        "--nvme-size",
        default=None,
        help="also give each local node an NVMe segment this large (in a temporary directory) "
        "and measure the NVMe tier beside DRAM",
    )
    parser.add_argument(
        "--tiers", default=None, help="tiers to measure, e.g. dram,nvme (default: what exists)"
    )
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument(
        "--metadata",
        action="store_true",
        help="measure master lookups (Exists, GetReplicas) in keys/s instead of throughput",
    )
    from bench import compare, cpu_per_op

    compare.add_arguments(parser)
    cpu_per_op.add_arguments(parser)
    from bench import nvme_disk

    nvme_disk.add_arguments(parser)


def main(argv: list[str] | None = None, prog: str = "python -m bench.throughput") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.cpu_per_op:
        from bench import cpu_per_op

        return cpu_per_op.run(args)
    if args.compare:
        from bench import compare

        return compare.run(args)
    if args.nvme_disk:
        from bench import nvme_disk

        return nvme_disk.run(args)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
        per_size = parse_size(args.bytes)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.metadata:
        from bench import metadata

        metadata.report(_on_cluster(args, metadata.measure))
        return 0
    tiers = (args.tiers or ("dram,nvme" if args.nvme_size else "dram")).split(",")
    results = _on_cluster(
        args, lambda master: _measure(master, sizes, per_size, args.replicas, tiers)
    )
    return _report(results, args.json)


def _on_cluster(args: argparse.Namespace, work):
    """Runs ``work(master_address)`` on ``--master`` (else ``$KVPOOL_MASTER``), or on a local
    cluster started for it; says which."""
    if args.master and args.local:
        raise SystemExit("bench: --master or --local, not both")
    master = None if args.local else args.master or os.environ.get(ENV_VAR)
    if master:
        source = "--master" if args.master else f"${ENV_VAR}"
        print(f"measuring the cluster at {master} ({source}; --local for a fresh one)", flush=True)
        from kvpool.errors import MasterUnavailable

        try:
            return work(master)
        except MasterUnavailable as error:
            raise SystemExit(f"error: {error} (or measure a cluster of its own: --local)") from None
    import tempfile

    from kvpool.local_cluster import LocalCluster

    what = f"{args.dram} DRAM" + (f" + {args.nvme_size} NVMe" if args.nvme_size else "")
    print(f"starting a local cluster: {args.nodes} node(s) x {what} ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-") as scratch:
        cluster = LocalCluster(0, args.dram)
        with cluster:
            for i in range(args.nodes):
                extra = ["--nvme", f"{scratch}/nvme{i}", "--nvme-size", args.nvme_size]
                cluster.add_node(extra=extra if args.nvme_size else ())
            cluster.export_client_env()
            return work(cluster.master_address)


def _measure(
    master: str, sizes: list[int], per_size: int, replicas: int, tiers: list[str]
) -> list[Result]:
    import numpy as np

    from kvpool import Client
    from kvpool.errors import ObjectNotFound

    results = []
    # Short read leases: a round removes its objects, and their space returns only when the
    # last reader's lease ends (the next round needs it).
    with Client(master, replicas=replicas, timeout=60, lease_ttl=LEASE) as client:
        for tier, size in [(t, s) for t in tiers for s in sizes]:
            count = max(8, per_size // size)
            source = np.frombuffer(os.urandom(size), dtype=np.uint8).copy()
            target = np.empty(size, dtype=np.uint8)
            regions = [client.register_buffer(source), client.register_buffer(target)]
            prefix = f"bench/{uuid.uuid4().hex[:8]}/{size}/"
            keys = [f"{prefix}{i}" for i in range(count)]
            put_times, get_times = [], []
            client.put(prefix + "warmup", source, tier=tier)
            client.get_into(prefix + "warmup", target)
            for key in keys:
                start = time.perf_counter()
                client.put(key, source, tier=tier)
                put_times.append(time.perf_counter() - start)
            for key in keys:
                start = time.perf_counter()
                try:
                    client.get_into(key, target)
                except ObjectNotFound:
                    raise SystemExit(
                        f"bench: {key} was evicted before it was read back: the cluster holds "
                        f"less than {count} x {size} bytes in the {tier} tier; raise --dram "
                        "(or --nvme-size) or lower --bytes"
                    ) from None
                get_times.append(time.perf_counter() - start)
            if not np.array_equal(source, target):
                raise SystemExit("bench: the bytes read back differ from the bytes written")
            client.remove_many([*keys, prefix + "warmup"], force=True)
            time.sleep(LEASE)  # the space comes back when the leases end
            for region in regions:
                client.unregister_buffer(region)
            results.append(
                Result(
                    tier,
                    size,
                    count,
                    size * count / sum(put_times) / 1e9,
                    size * count / sum(get_times) / 1e9,
                    statistics.median(put_times) * 1e3,
                    statistics.median(get_times) * 1e3,
                )
            )
    return results


def _report(results: list[Result], json_path: str | None) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="kvpool put/get throughput (client and node in separate processes)")
    columns = ("tier", "object", "count", "put GB/s", "get GB/s", "put p50 ms", "get p50 ms")
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.tier,
            format_size(r.size),
            str(r.count),
            f"{r.put_gbps:.2f}",
            f"{r.get_gbps:.2f}",
            f"{r.put_p50_ms:.2f}",
            f"{r.get_p50_ms:.2f}",
        )
    Console().print(table)
    if json_path:
        with open(json_path, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
