"""``kvpool up``: a master and N storage nodes on this machine until Ctrl-C.

It prints every endpoint it opened (the ports are picked free, so they cannot be guessed),
and keeps its processes' logs after it stops, in a folder it names at start and at exit:
a cluster that misbehaved is most often looked into after it was stopped.

The cluster is secure as a shared one would be: a throwaway CA signs the master's
certificate, and the tokens it makes (an admin's, a client's of tenant ``default``) are
written, with the master's address and the CA, to ``client.env`` and ``admin.env`` in the
run folder (readable by this user only): ``source`` one to talk to the cluster.
``--insecure`` runs it without.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from kvpool.common.sizes import parse_size
from kvpool.local_cluster import ClusterError, LocalCluster, ManagedProcess
from kvpool.security.tls import write_atomically


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=2, help="storage nodes to start (default 2)")
    parser.add_argument("--dram", default="1GiB", help="DRAM segment per node (default 1GiB)")
    parser.add_argument(
        "--nvme-size",
        default=None,
        metavar="SIZE",
        help="also give each node an NVMe-tier segment this large, a file in the run directory "
        "(removed at exit), to try tier='nvme' (default: none)",
    )
    parser.add_argument(
        "--port", type=int, default=50051, help="master gRPC port (default 50051; 0: free)"
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS and no tokens (anyone on this machine may do anything)",
    )
    parser.add_argument(
        "--run-dir",
        default=None,
        help="where the logs and ready files go, kept after exit (default: a new kvpool-up-* "
        "folder in the temporary directory)",
    )


def run(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        print("error: --nodes must be at least 1", flush=True)
        return 2
    for flag, size in (("--dram", args.dram), ("--nvme-size", args.nvme_size)):
        try:
            if size is not None:
                parse_size(size)
        except ValueError as error:
            print(f"error: {flag}: {error}", flush=True)
            return 2
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="kvpool-up-"))
    cluster = LocalCluster(0, args.dram, port=args.port, run_dir=run_dir, secure=not args.insecure)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster.start()
        for i in range(args.nodes):
            nvme = ["--nvme", str(run_dir / f"node{i}-nvme"), "--nvme-size", args.nvme_size]
            cluster.add_node(extra=nvme if args.nvme_size else ())
    except ClusterError as error:
        print(f"error: the cluster did not start:\n{error}", flush=True)
        _stop(cluster, run_dir)
        return 1
    _write_env_files(cluster, run_dir)
    _announce(cluster, args, run_dir)
    left: set[str] = set()  # nodes drained (`kvpool drain`) that left: the rest serve on
    try:
        while not stop.wait(0.5):
            for node in cluster.nodes:
                if node.name not in left and _drained_and_left(node):
                    left.add(node.name)
                    print(f"{node.name} was drained and left; the others serve on", flush=True)
            watched = [cluster.master, *(n for n in cluster.nodes if n.name not in left)]
            dead = [p.name for p in watched if p and not p.alive()]
            if dead:
                print(f"error: {', '.join(dead)} exited; stopping\n{cluster.logs()}", flush=True)
                return 1
    finally:
        print("stopping the cluster...", flush=True)
        _stop(cluster, run_dir)
    print("stopped", flush=True)
    return 0


#: What a storage node logs when it leaves after a drain (storage_node/node.py): it drained,
#: or its drain's deadline passed.
DRAIN_ENDS = ("drained: leaving", "drain deadline passed: leaving")


def _drained_and_left(node: ManagedProcess) -> bool:
    """Whether ``node`` exited as a drain ends, on purpose (`kvpool drain`): with status 0,
    after logging that it leaves drained."""
    if node.alive() or node.popen.returncode != 0:
        return False
    try:
        text = node.log_path.read_text(errors="replace")
    except OSError:
        return False
    return any(end in text for end in DRAIN_ENDS)


def _announce(cluster: LocalCluster, args: argparse.Namespace, run_dir: Path) -> None:
    host = "127.0.0.1"
    lines = [
        f"kvpool master at {cluster.master_address}",
        f"  metadata lane  {host}:{cluster.lane_port}",
        f"  master HTTP    http://{host}:{cluster.master_http_port}  (/metrics /healthz /readyz)",
    ]
    for node in cluster.nodes:
        lines.append(f"  {node.name} HTTP     http://{host}:{node.ready['http_port']}")
    tiers = f"{args.dram} DRAM" + (f" + {args.nvme_size} NVMe" if args.nvme_size else "")
    lines += [
        f"  {args.nodes} node(s) with {tiers} each",
        f"  logs in {run_dir} (kept after exit)",
        *(
            [
                f"  a client of tenant 'default': source {run_dir / 'client.env'}; "
                "kvpool put hello --value world; kvpool get hello",
                f"  the admin: source {run_dir / 'admin.env'}; kvpool status",
            ]
            if cluster.secure
            else [
                "  INSECURE (--insecure): no TLS, no tokens",
                f"  try: export KVPOOL_MASTER={cluster.master_address}; kvpool status",
            ]
        ),
        "  Ctrl-C stops the cluster",
    ]
    print("\n".join(lines), flush=True)


def _write_env_files(cluster: LocalCluster, run_dir: Path) -> None:
    """client.env and admin.env: what a shell needs to reach the cluster (0600: tokens)."""
    for name, env in (("client.env", cluster.client_env()), ("admin.env", cluster.admin_env())):
        lines = [f"export KVPOOL_MASTER={cluster.master_address}"]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
        write_atomically(run_dir / name, ("\n".join(lines) + "\n").encode())


def _stop(cluster: LocalCluster, run_dir: Path) -> None:
    """Stops every process; removes the NVMe segments' files, keeps the logs."""
    cluster.stop()
    for nvme in run_dir.glob("node*-nvme"):
        shutil.rmtree(nvme, ignore_errors=True)
    print(f"logs kept in {run_dir}", flush=True)
