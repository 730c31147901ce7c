"""``kvpool bench --cpu-per-op``: the CPU each process spends per operation, kvpool beside
Mooncake Store.

Throughput says how fast one client goes; what a cluster can grow to is set by the CPU each
process spends per operation, above all the master's, the one process every put of the
cluster goes through. This starts kvpool's master and storage node and Mooncake's master and
store peer (``bench/compare.py``'s machinery, same-host placement), one client runner each,
and times four phases on each system in turn: puts of 64 KiB objects in batches of 32, gets
of them back in batches of 32, their forced removal in batches of 1024 (a store kept full
evicts about one object per put), and exists over 1024 stored keys in batches of 256. Around
each phase it reads the CPU time of the master, the storage process (kvpool's node,
Mooncake's peer) and the client runner from ``/proc/<pid>/stat`` (user + system, all
threads, children excluded), and divides by the operations the phase served (objects, or
keys for exists).

What a figure includes: everything the process ran meanwhile. The master's background work
(timers, heartbeats) is part of it: each process's idle use, measured for a second before
its system's first phase, is recorded beside (``idle_cores``) and not subtracted. The
client runner's figure also holds a phase's untimed edges (building the key list; for gets,
zeroing the destination and checking the bytes read, about 30 ms a phase). The clock ticks
of ``/proc`` are 10 ms: phases last ``--cpu-seconds`` (default 2) so that a process busy for
a tenth of it still counts a few tens of ticks.

kvpool's gets take 1 s read leases here (the master's default is 10 s): its runs remove what
they put, and a removed object's space comes back when its last lease ends. Runs alternate
the order of the systems, as ``--compare`` does, and wait for the other system's processes
to go quiet before each phase; the table gives medians over ``--runs``. Prints the table
and writes ``bench/results/cpu_per_op.json``. Mooncake needs ``bench/setup_mooncake.sh``
first; without it, kvpool alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.compare import (
    HERE,
    SECURITY,
    PlacementBench,
    Workload,
    _choose,
    _phase,
    kvpool_systems,
    open_placement,
)
from bench.processes import process_cpu
from kvpool.common.sizes import parse_size

KiB, MiB = 1024, 1024 * 1024
#: The systems with a master, a storage process and a client (memcpy has no master).
SYSTEMS = ("kvpool", "mooncake")
ROLES = ("master", "storage", "client")
#: The operations measured, in the table's order: metric -> what one operation is.
OPS = {"put": "object", "get": "object", "exists": "key", "remove": "object"}
PUT_SIZE = 64 * KiB
PUT_BATCH = 32
EXISTS_BATCH = 256
EXISTS_KEYS = 1024
#: The most of the store one put phase fills.
PUT_SHARE = 0.4
#: Seconds of each timed phase.
PHASE_SECONDS = 2.0
#: kvpool's read leases in this benchmark (see the module's docstring).
LEASE_TTL = 1.0
#: Seconds over which each process's idle use is measured, before its system's first phase.
IDLE_SECONDS = 1.0
NAMES = {"kvpool": "kvpool", "mooncake": "Mooncake", "kvpool-insecure": "kvpool --insecure"}


def workloads(seconds: float, store_size: int) -> list[Workload]:
    """The two workloads: batched puts and gets of 64 KiB objects, and exists over 1024
    stored keys. A put phase stores at most ``PUT_SHARE`` of the store: with what the last one
    left under its leases, below the master's eviction watermark."""
    count = max(PUT_BATCH, int(store_size * PUT_SHARE) // PUT_SIZE // PUT_BATCH * PUT_BATCH)
    return [
        Workload(
            "32x64KiB", f"batches of {PUT_BATCH} x 64 KiB", PUT_SIZE, count=count,
            batch=PUT_BATCH, seconds=seconds, unit="ops/s",
        ),
        Workload(
            "exists", f"exists, batches of {EXISTS_BATCH} keys", 4 * KiB, count=EXISTS_KEYS,
            batch=PUT_BATCH, seconds=seconds, unit="keys/s", exists_batch=EXISTS_BATCH,
        ),
    ]  # fmt: skip


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    return {role: process_cpu(pid) for role, pid in pids.items()}


class CpuBench(PlacementBench):
    """``PlacementBench`` whose every measured phase also records the CPU each process of the
    system spent in it (``samples``)."""

    def __init__(
        self,
        placement: Any,
        systems: list[str],
        store_size: int,
        log_dir: Path,
        security_of: dict[str, str] | None = None,
    ) -> None:
        super().__init__(placement, systems, store_size, log_dir, security_of)
        self.kvpool_lease_ttl = LEASE_TTL
        #: One per measured phase: run, workload, metric, system, ops, seconds, cpu by role.
        self.samples: list[dict] = []
        #: system -> role -> cores used while nothing was asked of it.
        self.idle_cores: dict[str, dict[str, float]] = {}
        #: Where py-spy's recordings of kvpool's master during put phases go (None: none).
        self.profile_dir: Path | None = None
        self.profiles: list[Path] = []

    def roles(self, system: str) -> dict[str, int]:
        """role -> pid: the master, the storage process and the (first) client runner."""
        pids = self.servers[system].pids
        storage = pids["node"] if "node" in pids else pids["peer"]
        runner = self.runners[system][0]
        assert runner.ready is not None
        return {"master": pids["master"], "storage": storage, "client": runner.ready["pid"]}

    def _measure(self, workload: Workload, system: str, run: str) -> dict[str, float]:
        pids = self.roles(system)
        if system not in self.idle_cores:
            before = cpu_of(pids)
            time.sleep(IDLE_SECONDS)
            after = cpu_of(pids)
            self.idle_cores[system] = {
                r: round((after[r] - before[r]) / IDLE_SECONDS, 4) for r in pids
            }
        runners = self.runners[system][:1]
        prefix = f"{self.tag}/{run}/{workload.name}/{system}"
        base = {"size": workload.size, "batch": workload.batch, "seconds": workload.seconds}
        cmds = [{**base, "prefix": f"{prefix}/c0", "count": workload.count}]
        rates: dict[str, float] = {}
        phases = [("exists", workload.exists_batch)] if workload.exists_batch else []
        phases = phases or [("put", workload.batch), ("get", workload.batch), ("remove", 0)]
        if workload.exists_batch:
            put = _phase(runners, "put", cmds)  # the keys to look up: not measured
            cmds[0]["count"] = put["answers"][0]["ops"]
        for metric, batch in phases:
            cmd = {**cmds[0], "batch": batch} if batch else cmds[0]
            with self._recording(system, metric, run):
                before, started = cpu_of(pids), time.monotonic()
                answer = _phase(runners, metric, [cmd])["answers"][0]
                after, ended = cpu_of(pids), time.monotonic()
            if metric == "put":
                cmds[0]["count"] = answer["ops"]  # what the timed phase managed to store
            if metric == "remove":  # (untimed by the runner: the whole request, then)
                ops, seconds = answer["removed"], max(ended - started, 1e-9)
            else:
                ops, seconds = answer["ops"], max(answer["t1"] - answer["t0"], 1e-9)
                rates[metric] = ops / seconds
            self.samples.append(
                {
                    "run": run,
                    "workload": workload.name,
                    "metric": metric,
                    "system": system,
                    "ops": ops,
                    "seconds": round(seconds, 4),
                    "cpu": {r: round(after[r] - before[r], 3) for r in pids},
                }
            )
        if workload.exists_batch:
            _phase(runners, "remove", cmds)
        return rates

    @contextmanager
    def _recording(self, system: str, metric: str, run: str) -> Iterator[None]:
        """py-spy on kvpool's master during the put phases of the measured runs, when asked
        (``profile_dir``): where the master's time per put goes."""
        wanted = metric == "put" and system.startswith("kvpool") and run != "warm-up"
        if self.profile_dir is None or not wanted:
            yield
            return
        from bench import profile

        master = {"master": self.servers[system].pids["master"]}
        with profile.recording(master, self.profile_dir, f"put-{system}-run{run}") as files:
            yield
        self.profiles += files.values()


def measure(
    systems: list[str],
    runs: int,
    seconds: float = PHASE_SECONDS,
    store_size: int = 4096 * MiB,
    log_dir: Path = HERE / "results" / "logs" / "cpu_per_op",
    warmup: bool = True,
    security: str = "secure",
    profile_dir: Path | None = None,
) -> dict:
    """Runs the workloads ``runs`` times on every system; returns the results, JSON-ready:
    ``samples`` (one per phase measured), ``rows`` (medians, see ``rows``), ``idle_cores``;
    with ``profile_dir``, ``profiles``: py-spy's files of kvpool's master during its put
    phases (its figures then bear py-spy's interference)."""
    from bench import environment
    from bench.mooncake_runner import mooncake_available, mooncake_version

    skipped: dict[str, str] = {}
    if "mooncake" in systems and (why := mooncake_available()):
        skipped["mooncake"] = why
        systems = [s for s in systems if s != "mooncake"]
    for what, why in skipped.items():
        print(f"skipping {what}: {why}", file=sys.stderr)
    if not systems:
        raise ValueError("no system left to measure")
    systems, security_of = kvpool_systems(systems, security)
    chosen = workloads(seconds, store_size)
    started = time.monotonic()
    with open_placement("same-host") as placement:
        bench = CpuBench(placement, systems, store_size, log_dir, security_of)
        bench.profile_dir = profile_dir
        measured = bench.measure(chosen, runs, warmup=warmup)
    samples = [s for s in bench.samples if s["run"] != "warm-up"]
    return {
        "environment": environment.describe(),
        "mooncake_version": mooncake_version() if "mooncake" in systems else None,
        "systems": systems,
        "security_of": security_of,
        "skipped": skipped,
        "runs": runs,
        "phase_seconds": seconds,
        "store_size": store_size,
        "lease_ttl": LEASE_TTL,
        "workloads": [asdict(w) for w in chosen],
        "placement": placement.description,
        "idle_cores": bench.idle_cores,
        "samples": samples,
        "rows": rows(samples),
        "profiles": [str(path) for path in bench.profiles],
        "settle": measured["settle"],
        "other_processes": measured["other_processes"],
        "seconds": round(time.monotonic() - started, 1),
    }


def rows(samples: list[dict]) -> list[dict]:
    """Per operation and system: the median rate (operations per second) and, per process,
    the median over runs of its CPU microseconds per operation."""
    out = []
    systems = list(dict.fromkeys(s["system"] for s in samples))
    for metric in OPS:
        for system in systems:
            mine = [s for s in samples if s["metric"] == metric and s["system"] == system]
            if not mine:
                continue
            row: dict = {
                "op": metric,
                "system": system,
                "runs": len(mine),
                "ops_per_s": statistics.median(s["ops"] / s["seconds"] for s in mine),
            }
            for role in ROLES:
                row[f"{role}_us"] = statistics.median(
                    s["cpu"][role] / max(s["ops"], 1) * 1e6 for s in mine
                )
            out.append(row)
    return out


def master_ratios(results: dict) -> dict[str, float]:
    """Per operation: kvpool's master CPU per operation over Mooncake's (where both ran)."""
    by = {(r["op"], r["system"]): r for r in results["rows"]}
    return {
        op: by[op, "kvpool"]["master_us"] / by[op, "mooncake"]["master_us"]
        for op in OPS
        if (op, "kvpool") in by and (op, "mooncake") in by and by[op, "mooncake"]["master_us"] > 0
    }


HEADERS = ("op", "system", "ops/s", "master µs/op", "storage µs/op", "client µs/op")


def _cells(row: dict) -> list[str]:
    return [
        row["op"],
        NAMES.get(row["system"], row["system"]),
        f"{row['ops_per_s']:,.0f}",
        *(_us(row[f"{role}_us"]) for role in ROLES),
    ]


def _us(value: float) -> str:
    return f"{value:.2f}" if value < 1 else f"{value:.1f}"


def markdown(results: dict) -> str:
    """The table as docs/benchmarks.md shows it."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in results["rows"]]
    return "\n".join(lines)


def ceilings(results: dict) -> list[str]:
    """One sentence per system: the puts per second one master core would serve, at the
    master's measured CPU per put."""
    out = []
    for row in results["rows"]:
        if row["op"] == "put" and row["master_us"] > 0:
            name = NAMES.get(row["system"], row["system"])
            out.append(
                f"{name}: one master core tops out near {1e6 / row['master_us']:,.0f} "
                f"object puts/s ({row['master_us']:.1f} µs of master CPU per put)"
            )
    return out


def print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    env = results["environment"]
    table = Table(
        title=f"CPU time per operation, each process (medians of {results['runs']} runs)",
        caption=f"{env['cpus']} cores, load average {env['load_average'][0]:.1f} at the start; "
        f"64 KiB objects in batches of {PUT_BATCH}, exists in batches of {EXISTS_BATCH}",
    )
    for header in HEADERS:
        table.add_column(header, justify="left" if header in ("op", "system") else "right")
    for row in results["rows"]:
        table.add_row(*_cells(row))
    console = Console(width=max(Console().width, 110))
    console.print(table)
    for op, ratio in master_ratios(results).items():
        console.print(f"{op}: kvpool's master spends {ratio:.1f}x Mooncake's CPU", markup=False)
    for line in ceilings(results):
        console.print(line, markup=False)
    idle = ", ".join(
        f"{NAMES.get(system, system)} " + "/".join(f"{v:.0%}" for v in cores.values())
        for system, cores in results["idle_cores"].items()
    )
    if idle:
        console.print(f"idle (master/storage/client, of a core): {idle}", markup=False)
    for name, why in results["skipped"].items():
        console.print(f"skipped {name}: {why}", markup=False)
    busy = ", ".join(
        f"{' '.join(p['command'].split())[:60]} ({p['cpu']:.0%})"
        for p in results["other_processes"][:4]
    )
    console.print(f"other processes busy meanwhile: {busy or 'none'}", markup=False)


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cpu-per-op`` and its one option; it shares ``--runs``, ``--systems``,
    ``--store-size``, ``--security``, ``--out-dir`` and ``--json`` with ``--compare``."""
    group = parser.add_argument_group("--cpu-per-op (CPU time per operation of each process)")
    group.add_argument(
        "--cpu-per-op",
        action="store_true",
        help="master, storage and client CPU per put, get and exists, kvpool beside Mooncake "
        "Store (bench/cpu_per_op.py; takes --runs, --systems, --store-size, --security)",
    )
    group.add_argument(
        "--cpu-seconds",
        type=float,
        default=PHASE_SECONDS,
        help="seconds of each timed phase (default %(default)s)",
    )
    group.add_argument(
        "--cpu-profile",
        action="store_true",
        help="also record kvpool's master with py-spy during its put phases and say where "
        "its time goes (files under --out-dir/profile; needs root)",
    )


def options(args: argparse.Namespace) -> dict:
    """``measure``'s arguments from the command line's (ValueError: a bad one)."""
    known = (*SYSTEMS, "memcpy")  # (memcpy, in --compare's default list, has no master)
    systems = [s for s in _choose(args.systems, known, "system") if s != "memcpy"]
    if not systems:
        raise ValueError(f"--cpu-per-op measures {' and '.join(SYSTEMS)}: choose one")
    if args.runs < 1:
        raise ValueError("--runs must be at least 1")
    if not 0 < args.cpu_seconds <= 600:
        raise ValueError("--cpu-seconds must be above 0 and at most 600")
    security = getattr(args, "security", "secure")
    if security not in SECURITY:
        raise ValueError(f"--security must be one of {', '.join(SECURITY)}")
    return {
        "systems": systems,
        "runs": args.runs,
        "seconds": args.cpu_seconds,
        "store_size": parse_size(args.store_size),
        "log_dir": Path(args.out_dir) / "logs" / "cpu_per_op",
        "security": security,
        "profile_dir": Path(args.out_dir) / "profile" if args.cpu_profile else None,
    }


def run(args: argparse.Namespace) -> int:
    import json

    try:
        chosen = options(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    results = measure(**chosen)
    path = Path(args.json) if args.json else Path(args.out_dir) / "cpu_per_op.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    if results["profiles"]:
        from bench import profile

        for raw in map(Path, results["profiles"]):
            print(f"\nkvpool's master during a put phase ({raw})")
            print(profile.summarize(raw) if raw.exists() else "  (no samples)")
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.cpu_per_op [options]``: ``kvpool bench --cpu-per-op [options]``."""
    from bench import throughput

    args = sys.argv[1:] if argv is None else argv
    return throughput.main(["--cpu-per-op", *args], prog="python -m bench.cpu_per_op")


if __name__ == "__main__":
    sys.exit(main())
