"""``kvpool up``: a master and N storage nodes on this machine until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading

from kvpool.common.sizes import parse_size
from kvpool.local_cluster import ClusterError, LocalCluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=2, help="storage nodes to start (default 2)")
    parser.add_argument("--dram", default="1GiB", help="DRAM segment per node (default 1GiB)")
    parser.add_argument("--port", type=int, default=50051, help="master gRPC port (0: free)")
    parser.add_argument(
        "--run-dir", default=None, help="where logs and ready files go (default: a temp dir)"
    )


def run(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        print("error: --nodes must be at least 1", flush=True)
        return 2
    try:
        parse_size(args.dram)
    except ValueError as error:
        print(f"error: --dram: {error}", flush=True)
        return 2
    cluster = LocalCluster(args.nodes, args.dram, port=args.port, run_dir=args.run_dir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster.start()
    except ClusterError as error:
        print(f"error: the cluster did not start:\n{error}", flush=True)
        cluster.stop()
        return 1
    print(f"kvpool master at {cluster.master_address}", flush=True)
    print(f"  {args.nodes} node(s) with {args.dram} DRAM each; logs in {cluster.run_dir}")
    print(f"  try: export KVPOOL_MASTER={cluster.master_address}; kvpool status")
    print("  Ctrl-C stops the cluster", flush=True)
    try:
        while not stop.wait(0.5):
            dead = [p.name for p in [cluster.master, *cluster.nodes] if p and not p.alive()]
            if dead:
                print(f"error: {', '.join(dead)} exited; stopping\n{cluster.logs()}", flush=True)
                return 1
    finally:
        print("stopping the cluster...", flush=True)
        cluster.stop()
    print("stopped", flush=True)
    return 0
