"""A chaos run: the network, the system, the load, rounds of faults, and the verdict.

``ChaosRun`` starts everything (``start``), plays rounds of faults while the clients keep
putting, getting and removing (``play``), measures after each round how long the cluster
takes to converge once the last fault healed, checks the history so far (``check``) and at
the end reads back every acknowledged object and compares the processes' memory and threads
with what they held after the warm-up (``finish``). ``close`` always cleans up: processes,
namespaces, the switch, the loop device and the disk throttle.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.chaos import checker, history
from bench.chaos.checker import Findings, Stall
from bench.chaos.cluster import ChaosCluster, Layout
from bench.chaos.faults import DISKS, STALLS, THROTTLE, Fault, Injected, Stage, inject
from bench.chaos.monitor import LeaderWatch, Usage, usage_of
from bench.chaos.topology import Network

#: Seconds the cluster has, after the last fault of a round healed, to converge.
CONVERGE_WITHIN = 45.0
#: Seconds a call may run past its client's timeout before it counts as late.
SLACK = 3.0
#: Resident memory a process's peak may gain from the first third of the run (after the
#: warm-up) to the last: the larger of these. Peaks, not the first and last samples: a
#: master's memory rises and falls with its terms as leader (a leader holds the cluster's
#: objects), so its last sample says who leads at the end; a leak raises every later peak.
RSS_GROWTH_KIB = 96 * 1024
RSS_GROWTH_RATIO = 0.5
THREAD_GROWTH = 8
#: Lost or unreadable keys whose story the verdict fetches, at most.
STORIES_KEPT = 2000
#: Set (to anything but "0") once re-replication exists: convergence then also waits for
#: every acknowledged object to have its replicas back (issue 24, part A): the objects
#: sampled before the round's first fault on the nodes its faults target
#: (``replication_sample``).
REREPLICATION_ENV = "KVPOOL_CHAOS_REREPLICATION"
#: Keys stat'd, at most, to sample a round's objects for re-replication (one pass, before the
#: round's first fault), and how many of those the sample keeps, at most: each convergence
#: poll stats every one kept that its client has not removed.
SAMPLE_STATS = 200
SAMPLE_KEPT = 100
#: Seconds the sampling's stats may take in all (a stat times out after 5 s where the
#: previous round left no leader): the keys not stat'd by then are not sampled.
SAMPLE_WITHIN = 10.0


@dataclass
class RoundReport:
    name: str
    faults: list[str]
    targets: list[str]
    converged_s: float | None  # after the last heal; None: not within CONVERGE_WITHIN
    waiting_for: str = ""  # what was still missing when it did not converge
    started: float = 0.0
    healed: float = 0.0
    #: The storage nodes the round's faults cut off, stopped, slowed or broke the disk of
    #: (``nodes_targeted``): a master may take them for dead and copy their objects away.
    targeted_nodes: list[str] = field(default_factory=list)
    #: With re-replication checked (``REREPLICATION_ENV``; all None without): the objects
    #: sampled before the first fault (on two nodes, one of them targeted where the round
    #: targets a node), how many of them were still there (not removed by their clients) at
    #: convergence's last check, and how many of those lay on fewer than two nodes. None
    #: checked: convergence never got as far as counting replicas.
    replication_sampled: int | None = None
    replication_checked: int | None = None
    replication_short: int | None = None
    #: Says so when the round targeted a node and its check counted no object: it proved
    #: nothing about re-replication (``replication_note``).
    replication_note: str = ""


@dataclass
class Verdict:
    findings: dict
    rounds: list[RoundReport]
    split_brain: list[tuple[float, list[str]]]
    lost: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)
    read_back: int = 0
    #: Keys whose remove succeeded (and was never refused) that the leader still lists at
    #: the end: removed objects brought back (a node reported them after the removal).
    resurrected: list[str] = field(default_factory=list)
    #: Acknowledged objects gone because the leader evicted them (their story says so): the
    #: cluster filled up, which the suite's sizing must rule out; not counted as lost.
    evicted: list[str] = field(default_factory=list)
    usage_start: dict[str, Usage] = field(default_factory=dict)
    usage_end: dict[str, Usage] = field(default_factory=dict)
    #: Each process's resident memory (KiB) after the warm-up, after each round, at the end.
    rss_samples: dict[str, list[int]] = field(default_factory=dict)
    leaks: list[str] = field(default_factory=list)
    faults_injected: int = 0
    switch: dict = field(default_factory=dict)
    seconds: float = 0.0
    #: Processes of the system under test that exited on their own during the run (no fault
    #: kills one: each is a crash).
    exited: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = []
        f = self.findings
        if f["wrong_bytes"]:
            found.append(f"{f['wrong_bytes']} gets returned wrong bytes")
        if f["untyped_errors"]:
            found.append(f"{f['untyped_errors']} calls failed with an untyped exception")
        if f["past_deadline"]:
            found.append(f"{f['past_deadline']} calls ran past their deadline + {SLACK}s")
        if self.split_brain:
            found.append(f"two masters said they lead at once ({len(self.split_brain)} samples)")
        if self.lost:
            found.append(f"{len(self.lost)} acknowledged objects lost: {self.lost[:5]}")
        if self.resurrected:
            found.append(
                f"{len(self.resurrected)} removed objects listed again: {self.resurrected[:5]}"
            )
        if self.evicted:
            found.append(
                f"{len(self.evicted)} acknowledged objects evicted: the cluster filled up (its "
                f"DRAM is too small for this load: see the masters' eviction passes) "
                f"{self.evicted[:5]}"
            )
        if self.unreadable:
            found.append(f"{len(self.unreadable)} acknowledged objects unreadable after healing")
        for r in self.rounds:
            if r.converged_s is None:
                found.append(f"round {r.name} did not converge: {r.waiting_for}")
        vacuous = replication_never_checked(self.rounds)
        if vacuous:
            found.append(vacuous)
        found.extend(self.leaks)
        if self.exited:
            found.append(f"processes exited during the run: {', '.join(self.exited)}")
        return found

    def to_json(self) -> dict:
        raw = asdict(self)
        raw["problems"] = self.problems()
        return raw


class ChaosRun:
    def __init__(self, seed: int, layout: Layout | None = None, run_dir: Path | None = None):
        self.seed = seed
        self.layout = layout or Layout()
        self.run_dir = run_dir or Path(tempfile.mkdtemp(prefix="kvc-run-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.network: Network | None = None
        self.system: ChaosCluster | None = None
        self.watch: LeaderWatch | None = None
        self.stage: Stage | None = None
        self.rounds: list[RoundReport] = []
        self.stalls: list[Stall] = []
        self.faults_injected = 0
        self.usage_start: dict[str, Usage] = {}
        #: Each process's usage after the warm-up and after each round.
        self.usage_samples: dict[str, list[Usage]] = {}
        self.started_at = time.monotonic()
        self.rereplication = os.environ.get(REREPLICATION_ENV, "0") not in ("", "0")
        #: (found, short) of the sample at convergence's last count of replicas, or None.
        self._replication_counted: tuple[int, int] | None = None
        self._observers: dict[bool, object] = {}
        self._fault_log = (self.run_dir / "faults.jsonl").open("a", buffering=1)

    # ---- life cycle

    def start(self, warm_up: float = 5.0) -> ChaosRun:
        try:
            self.network = Network.create(self.layout.site_names(), self.seed)
            self.system = ChaosCluster(self.network, self.run_dir, self.layout, self.seed).start()
            self.stage = Stage(self.network, self.system)
            assert self.system.cluster is not None
            self.watch = LeaderWatch(list(self.system.cluster.masters))
            self.watch.start()
            time.sleep(warm_up)
            self.usage_start = usage_of(self.system.processes())
            self._sample_usage(self.usage_start)
        except BaseException:
            self.close()
            raise
        return self

    def observer(self, admin: bool = False):
        """A client on the observer's link (an admin's: cluster status)."""
        if admin not in self._observers:
            assert self.system is not None
            self._observers[admin] = self.system.observer_client(admin=admin, timeout=5.0)
        return self._observers[admin]

    def close(self) -> None:
        """Undoes everything, each step whatever the others did (a second Ctrl-C included:
        signals are held off until the namespaces and the disk are gone)."""
        try:
            previous = {
                s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)
            }
        except ValueError:  # not the main thread: signals are not ours to hold
            previous = {}
        try:
            for step in self._cleanup_steps():
                with contextlib.suppress(Exception):  # the next step runs regardless
                    step()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _cleanup_steps(self) -> list:
        steps: list = []
        if self.network is not None:
            steps.append(self.network.heal_all)
        if self.watch is not None:
            steps.append(self.watch.stop)
        for client in self._observers.values():
            steps.append(client.close)  # type: ignore[attr-defined]
        self._observers = {}
        if self.system is not None:
            disk = self.system.disk
            if disk is not None and disk.device:
                steps.append(lambda: THROTTLE.write_text(f"{disk.major_minor} 0\n"))
            steps.append(self.system.stop)
        if self.network is not None:
            steps.append(self.network.close)
        steps.append(self._fault_log.close)
        return steps

    def __enter__(self) -> ChaosRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- faults

    def play(self, faults: list[Fault], name: str = "") -> RoundReport:
        """Injects the round's faults on their schedule, heals each after its duration
        (always, even when something fails), then waits for the cluster to converge."""
        assert self.stage is not None
        name = name or f"round{len(self.rounds) + 1}"
        targeted = nodes_targeted(faults, self.stage.nodes())
        # (just before the first fault: afterwards the newest keys were put where the faults
        # let them, on nodes that were not away)
        sample = self._replication_sample(targeted) if self.rereplication else None
        began = time.monotonic()
        pending = sorted(faults, key=lambda f: f.start)
        active: list[tuple[float, Injected]] = []
        targets: list[str] = []
        try:
            while pending or active:
                now = time.monotonic()
                while pending and began + pending[0].start <= now:
                    fault = pending.pop(0)
                    injected = inject(self.stage, fault, f"{name}-{len(targets)}", now)
                    self.faults_injected += 1
                    targets.append(injected.resolved)
                    self._log("inject", name, fault, injected.resolved)
                    active.append((now + fault.duration, injected))
                for due, injected in list(active):
                    if due <= now:
                        self._heal(name, injected)
                        active.remove((due, injected))
                time.sleep(0.05)
        finally:
            for _, injected in active:
                self._heal(name, injected)
        healed = time.monotonic()
        converged, waiting = self.converge(CONVERGE_WITHIN, sample)
        checked, short = self._replication_counted or (None, None)
        report = RoundReport(
            name,
            [f.describe() for f in faults],
            targets,
            None if converged is None else round(converged - healed, 2),
            waiting,
            began,
            healed,
            targeted,
            None if sample is None else len(sample),
            checked,
            short,
        )
        if sample is not None:
            report.replication_note = replication_note(targeted, len(sample), checked)
        self.rounds.append(report)
        if self.system is not None:
            self._sample_usage(usage_of(self.system.processes()))
        self._fault_log.write(json.dumps({"event": "round", **asdict(report)}) + "\n")
        return report

    def _sample_usage(self, sample: dict[str, Usage]) -> None:
        for name, usage in sample.items():
            self.usage_samples.setdefault(name, []).append(usage)

    def _samples_until(self, end: dict[str, Usage]) -> dict[str, list[Usage]]:
        """Each process's samples, ``end`` last."""
        return {
            name: [*self.usage_samples.get(name, []), *([end[name]] if name in end else [])]
            for name in self.usage_samples.keys() | end.keys()
        }

    def _heal(self, name: str, injected: Injected) -> None:
        injected.heal()
        now = time.monotonic()
        if injected.fault.kind in STALLS:
            self.stalls.append(Stall(injected.resolved, injected.at, now))
        self._log("heal", name, injected.fault, injected.resolved)

    def _log(self, event: str, name: str, fault: Fault, target: str) -> None:
        record = {"event": event, "round": name, "t": time.monotonic(), "target": target}
        self._fault_log.write(json.dumps({**record, "fault": asdict(fault)}) + "\n")

    # ---- convergence

    def converge(
        self, within: float, sample: Sequence[str] | None = None
    ) -> tuple[float | None, str]:
        """When the cluster was whole again: one leader, every node mounted, a put of two
        replicas read back (and, with re-replication, every object of ``sample`` that its
        client has not removed back on two nodes); (None, what was missing) if not within
        ``within`` seconds. ``sample``: the objects a round sampled before its first fault
        (``play``); without one, the newest objects on two nodes now."""
        deadline = time.monotonic() + within
        missing = ""
        self._replication_counted = None
        if self.rereplication and sample is None:
            # (read from the histories once, not at every poll: they grow to hundreds of
            # thousands of operations)
            sample = self._replication_sample(())
        while time.monotonic() < deadline:
            missing = self._missing(sample or [])
            if not missing:
                done = time.monotonic()
                if done > deadline:  # (the last poll began in time and ended after)
                    return None, f"whole again only {done - deadline + within:.1f} s after"
                return done, ""
            time.sleep(0.25)
        return None, missing

    def _missing(self, sample: Sequence[str]) -> str:
        assert self.watch is not None and self.system is not None
        leaders = self.watch.leaders_now()
        if len(leaders) != 1:
            return f"leaders: {leaders}"
        from kvpool.errors import KVPoolError

        client = self.observer()
        try:
            status = self.observer(admin=True).cluster_status()
            if status.nodes != self.layout.nodes:
                return f"{status.nodes} of {self.layout.nodes} nodes mounted"
            key = f"probe-{time.monotonic_ns()}"
            value = history.value_of(key, 4096)
            stored = client.put(key, value, replicas=2)
            if stored != 2:
                return f"a probe put stored {stored} of 2 replicas"
            if client.get(key) != value:
                return "a probe read back wrong bytes"
            client.remove(key, force=True)
            if self.rereplication:
                found, short = replication_shortfall(sample, self._nodes_of)
                self._replication_counted = (found, short)
                if short:
                    return f"{short} of {found} sampled objects on fewer than two nodes"
        except KVPoolError as error:
            return f"{type(error).__name__}: {str(error)[:200]}"
        return ""

    def _replication_sample(self, targeted: Collection[str]) -> list[str]:
        """The objects whose replicas convergence counts after this round
        (``replication_sample``): keys acknowledged and not removed, read from the histories
        (once), stat'd by the observer."""
        from kvpool.errors import KVPoolError

        keys = checker.must_exist(self.ops())
        deadline = time.monotonic() + SAMPLE_WITHIN

        def nodes_of(key: str) -> list[str] | None:
            if time.monotonic() > deadline:
                return None
            try:
                return self._nodes_of(key)
            except KVPoolError:  # (not sampled: a timeout, a leader changing)
                return None

        return replication_sample(keys, nodes_of, targeted)

    def _nodes_of(self, key: str) -> list[str] | None:
        """The nodes that hold a replica of ``key``; None if there is no such object (its
        client removed it: a lost key is the end's read-back to find)."""
        from kvpool.errors import ObjectNotFound

        try:
            return [replica.node_id for replica in self.observer().stat(key).replicas]
        except ObjectNotFound:
            return None

    # ---- checking

    def ops(self) -> list[history.Op]:
        assert self.system is not None
        return list(history.read(self.system.histories()))

    def findings(self) -> Findings:
        return checker.check(self.ops(), self.layout.timeout, SLACK, self.stalls)

    def read_back(self, before: float) -> tuple[list[str], dict[str, str], int]:
        """Reads every key acknowledged and not removed by ``before``; returns (lost keys,
        unreadable keys with their errors, how many were read). A key a client removed
        meanwhile is not counted (checked again after a client's deadline has passed)."""
        from kvpool.errors import KVPoolError, ObjectNotFound

        expected = checker.must_exist(self.ops(), before)
        client = self.observer()
        missing: dict[str, str] = {}
        keys = sorted(expected)
        for attempt in range(3):
            missing = {}
            for i in range(0, len(keys), 64):
                batch = keys[i : i + 64]
                try:
                    results = client.get_many(batch)
                except KVPoolError as error:
                    results = [error] * len(batch)
                for key, result in zip(batch, results, strict=True):
                    if isinstance(result, Exception):
                        missing[key] = type(result).__name__
                    elif result != history.value_of(key, expected[key]):
                        missing[key] = "wrong bytes"
            if not missing:
                break
            keys = sorted(missing)
            time.sleep(2.0 * (attempt + 1))
        if missing:
            time.sleep(self.layout.timeout + SLACK)  # removes in flight have ended by now
            gone = checker.removed_since(self.ops(), set(missing))
            missing = {k: v for k, v in missing.items() if k not in gone}
        lost = sorted(k for k, v in missing.items() if v == ObjectNotFound.__name__)
        unreadable = {k: v for k, v in missing.items() if k not in lost}
        return lost, unreadable, len(expected)

    def resurrected(self) -> list[str]:
        """Keys the leader lists whose every remove answered ok (a key is put once)."""
        removed: dict[str, bool] = {}
        for op in self.ops():
            if op.op == "remove":
                removed[op.key] = removed.get(op.key, True) and op.result == "ok"
        listed: list[str] = []
        client = self.observer()
        start_after = ""
        while True:
            page = client.list_keys(limit=10_000, start_after=start_after)
            listed.extend(page.keys)
            if not page.next_start_after:
                break
            start_after = page.next_start_after
        return sorted(key for key in listed if removed.get(key, False))

    def write_stories(self, keys: list[str]) -> dict[str, list[str]]:
        """The leader's story of each key in ``keys`` (the lost and unreadable ones), with
        the client calls on it, into ``missing-stories.json``: what a finding is chased by.
        Returns each key's events, by name."""
        if not keys:
            return {}
        from kvpool.errors import KVPoolError

        wanted = set(keys)
        calls: dict[str, list[dict]] = {key: [] for key in keys}
        for op in self.ops():
            if op.key in wanted:
                calls[op.key].append(asdict(op))
        stories: dict[str, dict] = {}
        client = self.observer()
        for key in keys:
            try:
                events = [asdict(e) for e in client.story(key)]
            except KVPoolError as error:
                events = [{"error": f"{type(error).__name__}: {error}"}]
            stories[key] = {"story": events, "calls": calls[key]}
        path = self.run_dir / "missing-stories.json"
        path.write_text(json.dumps(stories, indent=1, default=str))
        return {key: [e.get("event", "") for e in v["story"]] for key, v in stories.items()}

    def verdict(self, final: bool) -> Verdict:
        assert self.system is not None and self.watch is not None
        lost, unreadable, read = self.read_back(time.monotonic())
        resurrected = self.resurrected()
        stories = self.write_stories([*lost, *unreadable, *resurrected][:STORIES_KEPT])
        evicted = [key for key in lost if "evicted" in stories.get(key, ())]
        lost = [key for key in lost if key not in set(evicted)]
        usage_end = usage_of(self.system.processes()) if final else {}
        verdict = Verdict(
            self.findings().summary(),
            list(self.rounds),
            self.watch.overlaps(),
            lost,
            unreadable,
            read,
            resurrected,
            evicted,
            self.usage_start,
            usage_end,
            rss_of(self._samples_until(usage_end)),
            leaks(self._samples_until(usage_end)) if final else [],
            self.faults_injected,
            self.network.stats() if self.network is not None else {},
            round(time.monotonic() - self.started_at, 1),
        )
        if final:
            verdict.exited = sorted(set(self.system.processes()) - set(usage_end))
        return verdict

    def finish(self) -> Verdict:
        """Stops the load, then judges the whole run."""
        assert self.system is not None
        processes = self.system.processes()
        usage_before_stop = usage_of(processes)
        self.system.stop_workers()
        verdict = self.verdict(final=False)
        verdict.exited = sorted(set(processes) - set(usage_before_stop))
        verdict.usage_end = usage_before_stop
        verdict.rss_samples = rss_of(self._samples_until(usage_before_stop))
        verdict.leaks = leaks(self._samples_until(usage_before_stop))
        (self.run_dir / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=1))
        return verdict


def rss_of(samples: dict[str, list[Usage]]) -> dict[str, list[int]]:
    return {name: [usage.rss_kib for usage in series] for name, series in samples.items()}


def leaks(samples: dict[str, list[Usage]]) -> list[str]:
    """Processes whose memory grew over the run: the peak of the last third of its samples
    above the peak of the first third by more than allowed (with two samples: the last above
    the first), or threads grown from the first sample to the last. The first third's peak
    is its role's (``master2``: every master's): a master holds the cluster's objects only
    while it leads, and one that stood by early and leads late is no leak."""
    found = []
    thirds = {name: max(1, len(series) // 3) for name, series in samples.items()}
    early_of_role: dict[str, int] = {}
    for name, series in samples.items():
        if len(series) >= 2:
            peak = max(usage.rss_kib for usage in series[: thirds[name]])
            role = name.rstrip("0123456789")
            early_of_role[role] = max(early_of_role.get(role, 0), peak)
    for name, series in samples.items():
        if len(series) < 2:
            continue
        early = early_of_role[name.rstrip("0123456789")]
        late = max(usage.rss_kib for usage in series[-thirds[name] :])
        allowed = max(RSS_GROWTH_KIB, int(early * RSS_GROWTH_RATIO))
        if late - early > allowed:
            found.append(
                f"{name}: resident memory peaked at {early // 1024} MiB in the first third of "
                f"the run (its role's), {late // 1024} MiB in the last (more than "
                f"{allowed // 1024} MiB more)"
            )
        if series[-1].threads - series[0].threads > THREAD_GROWTH:
            found.append(f"{name}: threads {series[0].threads} -> {series[-1].threads}")
    return found


def nodes_targeted(faults: Iterable[Fault], nodes: Sequence[str]) -> list[str]:
    """The storage nodes (of ``nodes``, the last one the persistent node with the disk) that
    ``faults`` cut off, stop, slow or break the disk of, in ``nodes``' order: named as a
    fault's target (``node1``, ``client0:node1``); every node for a fault on all links or
    one that cuts the leader off from the nodes; the persistent node for a disk fault.
    Faults on masters, etcd or clients alone target none."""
    hit: set[str] = set()
    for fault in faults:
        if fault.kind in DISKS:
            hit.update(nodes[-1:])
        elif fault.kind == "partition-leader-nodes" or fault.target == "all":
            hit.update(nodes)
        else:
            hit.update(fault.target.split(":"))
    return [node for node in nodes if node in hit]


#: A worker's key (``bench/chaos/worker.py``): its thread (``client0-t1``), its put count.
WORKER_KEY = re.compile(r"(.+-t[0-9]+)-([0-9]+)")


def newest_first(keys: Iterable[str]) -> list[str]:
    """Workers' keys (``client0-t1-0000042``: client, thread, the thread's put count) newest
    first, a thread's at a time in turn: each thread keeps its last ``live_keys``
    acknowledged keys and removes the oldest as it adds one (``bench/chaos/worker.py``), so
    the newest of every thread are the keys its clients remove last. Other keys come last."""
    threads: dict[str, list[tuple[int, str]]] = {}
    others: list[str] = []
    for key in keys:
        worker = WORKER_KEY.fullmatch(key)
        if worker is not None:
            threads.setdefault(worker[1], []).append((int(worker[2]), key))
        else:
            others.append(key)
    turns = [sorted(threads[thread], reverse=True) for thread in sorted(threads)]
    longest = max(map(len, turns), default=0)
    ordered = [turn[i][1] for i in range(longest) for turn in turns if i < len(turn)]
    return [*ordered, *others]


def replication_sample(
    keys: Iterable[str],
    nodes_of: Callable[[str], Collection[str] | None],
    targeted: Collection[str],
    stats: int = SAMPLE_STATS,
    kept: int = SAMPLE_KEPT,
) -> list[str]:
    """The objects whose replicas convergence counts after a round, chosen before its first
    fault: of the ``stats`` newest of ``keys`` (acknowledged and not removed; ``newest_first``:
    the likeliest to be left when the round has converged), those that ``nodes_of`` (the
    nodes holding a replica; None: no such object) finds on two nodes or more, one of them
    in ``targeted`` (any two, where the round targets no node: then the check still says
    that no object fell below two), ``kept`` at most, newest first."""
    sample: list[str] = []
    for key in newest_first(keys)[:stats]:
        if len(sample) >= kept:
            break
        nodes = nodes_of(key)
        if nodes is None or len(set(nodes)) < 2:
            continue
        if not targeted or set(nodes) & set(targeted):
            sample.append(key)
    return sample


def replication_shortfall(
    keys: Iterable[str], nodes_of: Callable[[str], Collection[str] | None]
) -> tuple[int, int]:
    """(found, short): how many of ``keys`` ``nodes_of`` finds (None: removed since, by its
    client: not counted), and how many of those lie on fewer than two nodes."""
    found = short = 0
    for key in keys:
        nodes = nodes_of(key)
        if nodes is None:
            continue
        found += 1
        short += len(set(nodes)) < 2
    return found, short


def replication_note(targeted: Sequence[str], sampled: int, checked: int | None) -> str:
    """What a round's report says of a re-replication check that proved nothing: the round
    targeted a node and convergence counted no sampled object (none sampled, or all removed
    by their clients before the end). "" otherwise (a round that targets no node is not
    about re-replication: its check only says that no object fell below two replicas)."""
    if not targeted or checked:
        return ""
    if checked is None:
        return "replication not checked: convergence never got as far as counting replicas"
    if not sampled:
        return (
            f"replication check vacuous: no object sampled (none on two nodes, one of them "
            f"{' or '.join(targeted)})"
        )
    return (
        f"replication check vacuous: all {sampled} objects sampled on "
        f"{', '.join(targeted)} were removed by their clients before convergence"
    )


def replication_never_checked(rounds: Sequence[RoundReport]) -> str:
    """The verdict's problem where re-replication was checked in vain: some rounds targeted
    a storage node, and not one of them counted a sampled object at convergence. "" where
    one did (a round now and then whose sample its clients removed is noted in its report,
    not failed: that is the load's pace, not the cluster's fault), or re-replication was
    not checked (``replication_sampled`` None), or no round targeted a node."""
    at_risk = [r for r in rounds if r.targeted_nodes and r.replication_sampled is not None]
    if not at_risk or any(r.replication_checked for r in at_risk):
        return ""
    return (
        f"re-replication checked in vain: none of the {len(at_risk)} rounds that targeted a "
        f"storage node counted a sampled object at convergence"
    )
