"""``kvpool bench --compare``: kvpool, Mooncake Store and a memory copy, side by side.

For each placement (``same-host``: two processes on one host; ``netns``: client and storage in
two network namespaces over a veth pair, TCP only), this starts kvpool's master and storage
node, Mooncake's master and store peer, and one client runner per system (kvpool, Mooncake,
memcpy). Every run then measures each workload on each system in turn, rotating the order from
run to run, so that all three see the same machine at nearly the same time; the table gives
the median of the runs. The 4-client workload starts three more runners per system (separate
processes) that start each phase together.

Before measuring, each store is filled once to most of its capacity and emptied (first touches
of a segment's pages cost far more than a copy), and one unrecorded run warms every path.
Objects are removed (forced) after each workload; kvpool keeps the space of an object removed
under a read lease until the lease ends (10 s), so each store is sized (``--store-size``,
default 4 GiB) for the few hundred MiB that a run leaves waiting.

kvpool runs secure, as it does by default: TLS on the master's ports, tokens for the node and
the clients (bench/kvpool_runner.py). ``--security insecure`` runs it ``--insecure``;
``--security both`` runs a secure and an insecure kvpool side by side, as two more systems of
the rotation ("kvpool" and "kvpool-insecure"): every run measures each workload on both, one
right after the other, the order alternating from run to run, and a second table gives the
difference per workload (a secure kvpool should stay within 10 % of an insecure one). Both
clusters hold their store at once: ``both`` needs twice kvpool's ``--store-size`` of memory.

Mooncake needs ``bench/setup_mooncake.sh`` first; without it the comparison runs kvpool and
memcpy only. The netns placement needs root. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from kvpool.common.sizes import format_size, parse_size

HERE = Path(__file__).resolve().parent
SYSTEMS = ("kvpool", "mooncake", "memcpy")
PLACEMENTS = ("same-host", "netns")
SECURITY = ("secure", "insecure", "both")
#: The system name of the insecure kvpool when ``--security both`` runs it beside the secure.
KVPOOL_INSECURE = "kvpool-insecure"
KiB, MiB = 1024, 1024 * 1024


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    size: int  # bytes per object
    count: int  # objects per client (at most, with ``seconds``)
    batch: int = 1  # keys per call
    seconds: float | None = None  # stop a phase after this long
    clients: int = 1
    unit: str = "GB/s"  # GB/s, ops/s (objects) or keys/s
    exists_batch: int = 0  # > 0: an exists workload over ``count`` stored keys
    #: Calls in flight to try (from one client process): each system is measured with each
    #: of these many threads (and kvpool with as many coroutines, asyncio, too) and the best
    #: way by median is the system's figure. Empty: one call at a time.
    inflight: tuple[int, ...] = ()

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("exists",) if self.exists_batch else ("put", "get")


WORKLOADS = (
    Workload("32MiB", "32 MiB objects", 32 * MiB, count=8),
    Workload("4MiB", "4 MiB objects", 4 * MiB, count=32),
    Workload("32x1MiB", "batches of 32 x 1 MiB", 1 * MiB, count=128, batch=32),
    Workload(
        "32x4KiB", "batches of 32 x 4 KiB", 4 * KiB, count=32768, batch=32, seconds=0.5,
        unit="ops/s",
    ),
    Workload(
        "exists", "exists, batches of 256 keys", 4 * KiB, count=1024, batch=32, seconds=0.5,
        unit="keys/s", exists_batch=256,
    ),
    Workload("4x4MiB", "4 clients x 4 MiB objects", 4 * MiB, count=16, clients=4),
    Workload(
        "32x4KiB-inflight", "batches of 32 x 4 KiB, calls in flight", 4 * KiB, count=65536,
        batch=32, seconds=1.0, unit="ops/s", inflight=(1, 4, 8, 16),
    ),
)  # fmt: skip

#: How each system can have calls in flight from one process: threads sharing one client,
#: and for kvpool also coroutines of one ``kvpool.aio.AsyncClient``. memcpy has no calls.
INFLIGHT_MODES = {"kvpool": ("threads", "asyncio"), "mooncake": ("threads",)}


def inflight_variants(workload: Workload, system: str) -> list[tuple[str, int]]:
    """(mode, calls in flight) for each way ``system`` is measured on ``workload``."""
    modes = INFLIGHT_MODES.get("kvpool" if system.startswith("kvpool") else system, ())
    return [(mode, n) for mode in modes for n in workload.inflight]


def variant_name(mode: str, in_flight: int) -> str:
    return f"{mode} x{in_flight}"


@dataclass(frozen=True)
class Target:
    placement: str
    workload: str
    metric: str
    versus: str  # the system kvpool is measured against
    factor: float  # kvpool's median must reach factor x versus's median

    def describe(self) -> str:
        return f">= {self.factor:g}x {self.versus}"


TARGETS = (
    *(Target("same-host", "32MiB", m, "mooncake", 3.0) for m in ("put", "get")),
    *(Target("same-host", "32MiB", m, "memcpy", 0.5) for m in ("put", "get")),
    *(Target("netns", "32MiB", m, "mooncake", 2.0) for m in ("put", "get")),
    *(Target(p, "32x4KiB", m, "mooncake", 1.0) for p in PLACEMENTS for m in ("put", "get")),
    *(Target(p, "exists", "exists", "mooncake", 1.0) for p in PLACEMENTS),
    *(
        Target(p, "32x4KiB-inflight", m, "mooncake", 1.5)
        for p in PLACEMENTS
        for m in ("put", "get")
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--compare (kvpool vs Mooncake Store vs memcpy)")
    group.add_argument(
        "--compare",
        action="store_true",
        help="kvpool, Mooncake Store and memcpy side by side (bench/compare.py; "
        "run bench/setup_mooncake.sh first)",
    )
    group.add_argument(
        "--store-size", default="4GiB", help="memory of each store: kvpool's node, Mooncake's peer"
    )
    group.add_argument("--runs", type=int, default=5, help="alternating runs (default 5)")
    group.add_argument("--placements", default=",".join(PLACEMENTS), help="%(default)s")
    group.add_argument("--systems", default=",".join(SYSTEMS), help="%(default)s")
    group.add_argument(
        "--workloads", default=",".join(w.name for w in WORKLOADS), help="%(default)s"
    )
    group.add_argument(
        "--security",
        choices=SECURITY,
        default="secure",
        help="kvpool with TLS and tokens (secure, the default), --insecure, or both side by "
        "side, alternating, with their difference per workload (both: twice the memory)",
    )
    group.add_argument(
        "--ceilings",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure bare UCX, TCP and gRPC in each placement (bench/ceilings.py)",
    )
    group.add_argument(
        "--out-dir", default=str(HERE / "results"), help="compare.json, compare.png, logs/"
    )
    group.add_argument(
        "--profile",
        metavar="WORKLOAD",
        help="instead: run WORKLOAD on kvpool alone under py-spy (client, master, node) and "
        "say where the time goes (bench/profile.py)",
    )
    group.add_argument("--profile-seconds", type=float, default=10.0, help="%(default)s")
    group.add_argument(
        "--profile-native", action="store_true", help="with C frames (gRPC, protobuf, UCX)"
    )
    group.add_argument(
        "--update-docs",
        action="store_true",
        help="also write docs/benchmarks.json, docs/benchmarks.png and the table in "
        "docs/benchmarks.md",
    )


def run(args: argparse.Namespace) -> int:
    from bench import report

    try:
        options = _options(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    if args.profile:
        return profile_workload(
            options, args.profile, args.profile_seconds, out_dir / "profile", args.profile_native
        )
    results = compare(**options)
    json_path = Path(args.json) if args.json else out_dir / "compare.json"
    report.write_all(results, json_path, out_dir / "compare.png", docs=args.update_docs)
    report.print_table(results)
    return 0


def _options(args: argparse.Namespace) -> dict:
    placements = _choose(args.placements, PLACEMENTS, "placement")
    systems = _choose(args.systems, SYSTEMS, "system")
    by_name = {w.name: w for w in WORKLOADS}
    chosen = args.profile or args.workloads
    workloads = [by_name[n] for n in _choose(chosen, tuple(by_name), "workload")]
    if args.runs < 1:
        raise ValueError("--runs must be at least 1")
    security = getattr(args, "security", "secure")
    if args.profile and security == "both":
        raise ValueError("--profile runs one kvpool: --security secure or insecure")
    if getattr(args, "update_docs", False) and security == "insecure":
        raise ValueError(
            "the docs' table is of kvpool as it runs by default, secure: --security secure "
            "or both with --update-docs"
        )
    return {
        "placements": placements,
        "systems": systems,
        "workloads": workloads,
        "runs": args.runs,
        "store_size": parse_size(args.store_size),
        "ceilings": args.ceilings,
        "log_dir": Path(args.out_dir) / "logs",
        "security": security,
    }


def _choose(text: str, known: tuple[str, ...], what: str) -> list[str]:
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen:
        raise ValueError(f"unknown {what}(s) {unknown}: choose from {', '.join(known)}")
    return chosen


# ---------------------------------------------------------------- the comparison


def compare(
    placements: list[str],
    systems: list[str],
    workloads: list[Workload],
    runs: int,
    store_size: int = 4096 * MiB,
    log_dir: Path = HERE / "results" / "logs",
    warmup: bool = True,
    ceilings: bool = False,
    security: str = "secure",
) -> dict:
    """Measures every workload on every system in every placement; returns the results as
    a JSON-ready dict (see report.py for its shape). ``security``: kvpool secure, insecure,
    or both (then "kvpool" is the secure one and "kvpool-insecure" the other)."""
    import os

    from bench import environment
    from bench.mooncake_runner import mooncake_available, mooncake_version

    skipped: dict[str, str] = {}
    if "mooncake" in systems and (why := mooncake_available()):
        skipped["mooncake"] = why
        systems = [s for s in systems if s != "mooncake"]
    if "netns" in placements and os.geteuid() != 0:
        skipped["netns"] = "network namespaces need root"
        placements = [p for p in placements if p != "netns"]
    for what, why in skipped.items():
        print(f"skipping {what}: {why}", file=sys.stderr)
    systems, security_of = kvpool_systems(systems, security)
    results: dict = {
        "environment": environment.describe(),
        "mooncake_version": mooncake_version() if "mooncake" in systems else None,
        "systems": systems,
        "security": security,
        "security_of": security_of,
        "skipped": skipped,
        "runs": runs,
        "store_size": store_size,
        "workloads": [asdict(w) for w in workloads],
        "targets": [asdict(t) for t in TARGETS],
        "placements": {},
    }
    started = time.monotonic()
    for name in placements:
        with open_placement(name) as placement:
            if ceilings:
                results.setdefault("ceilings", {})[name] = _ceilings(placement)
            bench = PlacementBench(placement, systems, store_size, log_dir / name, security_of)
            results["placements"][name] = bench.measure(workloads, runs, warmup=warmup)
    results["seconds"] = round(time.monotonic() - started, 1)
    return results


def kvpool_systems(systems: list[str], security: str) -> tuple[list[str], dict[str, str]]:
    """The systems with kvpool as ``security`` asks (``both``: "kvpool-insecure" right after
    "kvpool"), and each kvpool system's security ("secure" or "insecure")."""
    if security not in SECURITY:
        raise ValueError(f"unknown security {security!r}: choose from {', '.join(SECURITY)}")
    if "kvpool" not in systems:
        return list(systems), {}
    if security != "both":
        return list(systems), {"kvpool": security}
    out: list[str] = []
    for system in systems:
        out += ["kvpool", KVPOOL_INSECURE] if system == "kvpool" else [system]
    return out, {"kvpool": "secure", KVPOOL_INSECURE: "insecure"}


def profile_workload(
    options: dict, workload: str, seconds: float, out_dir: Path, native: bool = False
) -> int:
    """Runs one workload on kvpool alone under py-spy in each placement; prints summaries."""
    from bench import profile

    [chosen] = [w for w in options["workloads"] if w.name == workload]
    for name in options["placements"]:
        with open_placement(name) as placement:
            bench = PlacementBench(
                placement,
                ["kvpool"],
                options["store_size"],
                options["log_dir"] / name,
                {"kvpool": options.get("security", "secure")},
            )
            files = bench.profile(chosen, seconds, out_dir, f"{name}-{workload}", native)
        for role, path in files.items():
            print(f"\n[{name}] {workload}: {role} ({path})")
            print(profile.summarize(path) if path.exists() else "  (no samples)")
    return 0


def _ceilings(placement) -> dict:
    import tempfile

    from bench import ceilings

    print(f"[{placement.name}] measuring bare UCX, TCP and gRPC", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvpool-ceilings-") as work_dir:
        return ceilings.measure(placement, Path(work_dir))


@contextmanager
def open_placement(name: str) -> Iterator:
    from bench import netns

    if name == "same-host":
        yield netns.same_host()
    else:
        with netns.veth_pair() as placement:
            yield placement


class PlacementBench:
    """Every system's servers and clients in one placement, and the runs on them."""

    def __init__(
        self,
        placement,
        systems: list[str],
        store_size: int,
        log_dir: Path,
        security_of: dict[str, str] | None = None,
    ) -> None:
        self.placement = placement
        self.systems = systems
        #: kvpool system -> "secure" or "insecure" (a kvpool not named here is secure)
        self.security_of = {
            s: (security_of or {}).get(s, "secure") for s in systems if s.startswith("kvpool")
        }
        self.store_size = store_size
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        for old in log_dir.glob("*.log"):
            old.unlink()
        self.tag = uuid.uuid4().hex[:6]
        self.servers: dict = {}
        self.runners: dict[str, list] = {s: [] for s in systems}
        self.pids: set[int] = set()
        #: system -> its processes (servers and client runners), to let them go quiet
        self.system_pids: dict[str, set[int]] = {s: set() for s in systems}
        #: system -> seconds waited, before each measurement, for the others to go quiet
        self.settle_waits: dict[str, list[float]] = {s: [] for s in systems}
        self.settle_timeouts: dict[str, int] = {s: 0 for s in systems}
        #: workload -> metric -> system -> way of issuing calls -> [one value per run]
        self.variant_values: dict = {}
        #: Read leases kvpool's clients ask for (0: the master's default). Removing a leased
        #: object by force frees its space only when the lease ends: a profile, which runs a
        #: workload back to back, asks for short leases so that the store does not fill up.
        self.kvpool_lease_ttl = 0.0

    def measure(self, workloads: list[Workload], runs: int, warmup: bool = True) -> dict:
        from bench import environment

        snapshot = environment.cpu_snapshot()
        values: dict = {
            w.name: {m: {s: [] for s in self.systems} for m in w.metrics} for w in workloads
        }
        started = time.monotonic()
        with ExitStack() as stack:
            self._start_servers(stack)
            self._start_runners(stack, 1)
            single = [w for w in workloads if w.clients == 1]
            concurrent = [w for w in workloads if w.clients > 1]
            if warmup:
                self._fill_stores()
                self._runs(single, 1, values=None, label="warm-up")
            self._runs(single, runs, values)
            if concurrent:
                self._start_runners(stack, max(w.clients for w in concurrent))
                if warmup:
                    self._runs(concurrent, 1, values=None, label="warm-up")
                self._runs(concurrent, runs, values)
        return {
            "description": self.placement.description,
            "seconds": round(time.monotonic() - started, 1),
            "inflight": _best_variants(self.variant_values, values),  # (before the medians)
            "values": values,
            "medians": _medians(values),
            "settle": {
                system: {
                    "median_wait_s": round(statistics.median(waits), 3) if waits else 0.0,
                    "timeouts": self.settle_timeouts[system],
                }
                for system, waits in self.settle_waits.items()
            },
            "other_processes": environment.busy_since(snapshot, self.pids),
        }

    def profile(
        self, workload: Workload, seconds: float, out_dir: Path, stem: str, native: bool = False
    ) -> dict:
        """Repeats ``workload`` on kvpool for ``seconds`` under py-spy; role -> raw file."""
        from bench import profile

        self.kvpool_lease_ttl = 1.0
        with ExitStack() as stack:
            self._start_servers(stack)
            self._start_runners(stack, workload.clients)
            self._runs([workload], 1, values=None, label="warm-up")
            servers = self.servers["kvpool"]
            targets = {"master": servers.master.pid, "node": servers.node.pid}
            for i, runner in enumerate(self.runners["kvpool"][: workload.clients]):
                targets[f"client{i}"] = runner.ready["pid"]
            print(
                f"[{self.placement.name}] profiling {workload.name} for {seconds:g} s", flush=True
            )
            with profile.recording(targets, out_dir, stem, native) as files:
                end = time.monotonic() + seconds
                rounds = 0
                while time.monotonic() < end:
                    if workload.inflight:  # every way of having calls in flight, in turn
                        self._measure_inflight(workload, "kvpool", f"profile{rounds}", None)
                    else:
                        self._measure(workload, "kvpool", f"profile{rounds}")
                    rounds += 1
        return files

    # ---- processes

    def _start_servers(self, stack: ExitStack) -> None:
        from bench.kvpool_runner import KvpoolServers
        from bench.mooncake_runner import MooncakeServers
        from bench.processes import child_env

        size = format_size(self.store_size).replace(" ", "")
        kinds = {
            label: lambda label=label, security=security: KvpoolServers(
                self.placement,
                self.log_dir,
                size,
                child_env(),
                secure=security == "secure",
                name=label,
            )
            for label, security in self.security_of.items()
        }
        kinds["mooncake"] = lambda: MooncakeServers(
            self.placement, self.log_dir, self.store_size, child_env()
        )
        for system in self.systems:
            if system in kinds:
                how = f" ({self.security_of[system]})" if system in self.security_of else ""
                print(f"[{self.placement.name}] starting {system} servers{how}", flush=True)
                self.servers[system] = stack.enter_context(kinds[system]())
                self.pids.update(self.servers[system].pids.values())
                self.system_pids[system].update(self.servers[system].pids.values())

    def _start_runners(self, stack: ExitStack, per_system: int) -> None:
        from bench import memcpy_runner
        from bench.processes import RunnerProcess, child_env

        started = []
        for system in self.systems:
            while len(self.runners[system]) < per_system:
                index = len(self.runners[system])
                if system == "memcpy":
                    argv, env = memcpy_runner.client_argv(), child_env()
                elif system == "mooncake":
                    server = self.servers[system]
                    argv, env = server.client_argv(), server.client_env()
                else:
                    server = self.servers[system]
                    argv = server.client_argv(self.kvpool_lease_ttl)
                    env = server.client_env(child_env())
                name = f"{system}-client{index}"
                runner = RunnerProcess(name, argv, self.log_dir / f"{name}.log", env)
                stack.callback(runner.stop)
                self.runners[system].append(runner)
                started.append((system, runner))
        for system, runner in started:
            runner.wait_ready(120)
            self.pids.update({runner.pid, runner.ready["pid"]})
            self.system_pids[system].add(runner.ready["pid"])

    # ---- runs

    def _fill_stores(self) -> None:
        """Writes each store nearly full once, then empties it. (Reading too would take
        leases, and kvpool keeps the space of a leased object until its lease ends.)"""
        size = 32 * MiB
        count = int(self.store_size * 0.8) // size
        for system in self.systems:
            if system == "memcpy":
                continue
            print(f"[{self.placement.name}] filling {system}'s store once", flush=True)
            runner = self.runners[system][0]
            prefix = f"{self.tag}/fill/{system}"
            for op in ("put", "remove"):
                runner.request(
                    {"op": op, "prefix": prefix, "size": size, "count": count, "batch": 1}
                )

    def _runs(
        self, workloads: list[Workload], runs: int, values: dict | None, label: str = ""
    ) -> None:
        for run in range(runs):
            print(
                f"[{self.placement.name}] {label or f'run {run + 1}/{runs}'}: "
                f"{', '.join(w.name for w in workloads)}",
                flush=True,
            )
            order = (
                self.systems[run % len(self.systems) :] + self.systems[: run % len(self.systems)]
            )
            for workload in workloads:
                for system in order:
                    if (workload.exists_batch or workload.inflight) and system == "memcpy":
                        continue
                    self._settle(system)
                    if workload.inflight:
                        self._measure_inflight(workload, system, f"{label or run}", values)
                        continue
                    measured = self._measure(workload, system, f"{label or run}")
                    if values is not None:
                        for metric, value in measured.items():
                            values[workload.name][metric][system].append(value)

    def _measure_inflight(
        self, workload: Workload, system: str, run: str, values: dict | None
    ) -> None:
        """Each way of having calls in flight in turn; ``values`` gets the best of this run
        (replaced by the runs of the best way by median once all runs are done)."""
        best: dict[str, float] = {}
        for mode, n in inflight_variants(workload, system):
            name = variant_name(mode, n)
            measured = self._measure(
                workload, system, f"{run}/{mode}{n}", {"threads": n, "mode": mode}
            )
            for metric, value in measured.items():
                best[metric] = max(best.get(metric, 0.0), value)
                if values is not None:
                    by_variant = self.variant_values.setdefault(workload.name, {})
                    by_variant = by_variant.setdefault(metric, {}).setdefault(system, {})
                    by_variant.setdefault(name, []).append(value)
        if values is not None:
            for metric, value in best.items():
                values[workload.name][metric][system].append(value)

    def _settle(self, system: str) -> None:
        """Waits until the other systems' processes are idle, so that background work one
        leaves behind (Mooncake's client was seen keeping more than a core busy after its own
        workload had returned) is not billed to the next."""
        from bench import environment

        others = set().union(*(p for s, p in self.system_pids.items() if s != system))
        if not others:
            return
        waited, quiet = environment.wait_until_quiet(others)
        self.settle_waits[system].append(waited)
        if not quiet:
            self.settle_timeouts[system] += 1

    def _measure(
        self, workload: Workload, system: str, run: str, extra: dict | None = None
    ) -> dict[str, float]:
        runners = self.runners[system][: workload.clients]
        prefix = f"{self.tag}/{run}/{workload.name}/{system}"
        base = {"size": workload.size, "batch": workload.batch, "seconds": workload.seconds}
        base.update(extra or {})
        cmds = [
            {**base, "prefix": f"{prefix}/c{i}", "count": workload.count}
            for i in range(len(runners))
        ]
        measured = {}
        put = _phase(runners, "put", cmds)
        for cmd, answer in zip(cmds, put["answers"], strict=True):
            cmd["count"] = answer["ops"]  # what a timed phase managed to store
        if workload.exists_batch:
            exists = [{**c, "batch": workload.exists_batch} for c in cmds]
            measured["exists"] = _rate(_phase(runners, "exists", exists), workload.unit)
        else:
            measured["put"] = _rate(put, workload.unit)
            measured["get"] = _rate(_phase(runners, "get", cmds), workload.unit)
        _phase(runners, "remove", cmds)
        return measured


def _medians(values: dict) -> dict:
    return {
        workload: {
            metric: {system: statistics.median(v) for system, v in by_system.items() if v}
            for metric, by_system in by_metric.items()
        }
        for workload, by_metric in values.items()
    }


def _best_variants(variant_values: dict, values: dict) -> dict:
    """Per workload, metric and system with calls in flight: the median of each way of
    issuing them and the best; ``values`` then holds the best way's runs, so that the
    system's median is that way's."""
    out: dict = {}
    for workload, by_metric in variant_values.items():
        for metric, by_system in by_metric.items():
            for system, by_variant in by_system.items():
                medians = {v: statistics.median(runs) for v, runs in by_variant.items()}
                best = max(medians, key=medians.__getitem__)
                values[workload][metric][system] = list(by_variant[best])
                out.setdefault(workload, {}).setdefault(metric, {})[system] = {
                    "best": best,
                    "medians": medians,
                }
    return out


def _phase(runners: list, op: str, cmds: list[dict]) -> dict:
    """Sends ``op`` to every runner (starting together when there are several)."""
    start_at = time.monotonic() + 0.25 if len(runners) > 1 else None
    for runner, cmd in zip(runners, cmds, strict=True):
        runner.send({**cmd, "op": op, "start_at": start_at})
    answers = [runner.receive() for runner in runners]
    return {"answers": answers}


def _rate(phase: dict, unit: str) -> float:
    """Aggregate rate: everything moved, over the earliest start to the latest end."""
    answers = phase["answers"]
    span = max(a["t1"] for a in answers) - min(a["t0"] for a in answers)
    span = max(span, 1e-9)
    if unit == "GB/s":
        return sum(a["bytes"] for a in answers) / span / 1e9
    return sum(a["ops"] for a in answers) / span
