"""``python -m bench.cli_latency``: how long one ``kvpool`` command takes, start to exit.

A shell user waits for the whole process: interpreter start, imports, connecting to the
master, the call, the transfer, shutting down. This starts a local cluster (what ``kvpool up``
starts: a master and two storage nodes), stores a 6-byte object, and runs each command
``--runs`` times as a child process, as a user would (``kvpool get KEY -o /dev/null``),
printing the median and the fastest wall time of each. Writes bench/results/cli_latency.json.
``--master`` measures against a running cluster instead.

Python caches compiled modules unless told not to (``PYTHONDONTWRITEBYTECODE``, which some
development shells set): compiling kvpool's modules at every start would be billed to the
command. So the commands run with caching on, their cache in a temporary folder
(``PYTHONPYCACHEPREFIX``: nothing is written into the checkout), each once untimed first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.summary import print_and_save

HERE = Path(__file__).resolve().parent
KEY = "cli-latency/6-bytes"


def commands(key: str) -> dict[str, list[str]]:
    """What is timed: name -> arguments after ``kvpool``."""
    return {
        "kvpool --help": ["--help"],
        "kvpool get KEY -o /dev/null (6 B)": ["get", key, "-o", "/dev/null"],
        "kvpool stat KEY": ["stat", key],
        "kvpool status": ["status"],
    }


def time_command(
    kvpool: str, args: list[str], master: str, runs: int, env: dict[str, str]
) -> dict[str, float]:
    """Runs ``kvpool ARGS`` once, then ``runs`` times timed: the median and the fastest wall
    time in ms."""
    argv = [kvpool, *args, "--master", master] if args != ["--help"] else [kvpool, *args]
    times = []
    for _ in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, env=env, timeout=60)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"kvpool {' '.join(args)} failed:\n{done.stderr.decode()}")
    times = times[1:]  # the first run fills the bytecode cache
    return {"median (ms)": statistics.median(times) * 1e3, "fastest (ms)": min(times) * 1e3}


def measure(kvpool: str, master: str, runs: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="kvpool-pycache-") as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        stored = subprocess.run(
            [kvpool, "put", KEY, "--value", "6bytes", "--master", master],
            capture_output=True,
            env=env,
            timeout=60,
        )
        if stored.returncode != 0 and b"already exists" not in stored.stderr:
            raise SystemExit(f"could not store the object:\n{stored.stderr.decode()}")
        return {
            name: time_command(kvpool, args, master, runs, env)
            for name, args in commands(KEY).items()
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_latency", description=__doc__)
    parser.add_argument("--runs", type=int, default=10, help="runs of each command (default 10)")
    parser.add_argument(
        "--master", default=None, help="a running cluster (default: start a local one)"
    )
    parser.add_argument(
        "--kvpool",
        default=str(Path(sys.executable).with_name("kvpool")),
        help="the kvpool command to time (default: the one beside this Python)",
    )
    parser.add_argument("--json", default=str(HERE / "results" / "cli_latency.json"))
    args = parser.parse_args(argv)
    if args.master:
        results = measure(args.kvpool, args.master, args.runs)
    else:
        from kvpool.local_cluster import LocalCluster

        print("starting a local cluster: a master and 2 nodes x 64MiB DRAM ...", flush=True)
        with LocalCluster(2, "64MiB") as cluster:
            cluster.export_client_env()
            results = measure(args.kvpool, cluster.master_address, args.runs)
    print_and_save(
        f"one kvpool command, start to exit ({args.runs} runs each)",
        "command",
        results,
        args.json,
        cell="{:.0f}".format,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
