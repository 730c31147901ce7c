"""``python -m bench.chaos --minutes 30 --seed 7``: the long run (``scripts/chaos.sh``).

Rounds of faults drawn from the seed, for as many minutes as asked, against a cluster in
network namespaces under a steady load; then the verdict: a table of rounds (faults, time to
converge), the checker's figures, and every problem found. Exits 1 if there was one. The
run's folder (histories, fault log, every process's log, ``verdict.json``) is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.chaos.cluster import Layout
from bench.chaos.run import ChaosRun, Verdict
from bench.chaos.schedule import rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the verdict here too")
    parser.add_argument(
        "--checked-stream",
        action="store_true",
        help="nodes serve the checked stream (--data-port 0) and clients use it (issue 17)",
    )
    args = parser.parse_args(argv)
    if args.json is not None and not args.json.parent.is_dir():  # (known now, not at the end)
        parser.error(f"--json: no folder {str(args.json.parent)!r} to write the verdict in")

    layout = Layout(node_args=("--data-port", "0")) if args.checked_stream else Layout()
    run = ChaosRun(args.seed, layout=layout, run_dir=args.run_dir)
    print(f"chaos run, seed {args.seed}, {args.minutes} min; files in {run.run_dir}", flush=True)
    with run:
        end = time.monotonic() + args.minutes * 60
        for faults in rounds(args.seed, run.layout.nodes, run.layout.clients):
            if time.monotonic() >= end:
                break
            report = run.play(faults)
            converged = "no" if report.converged_s is None else f"{report.converged_s:.1f}s"
            replication = ""
            if report.replication_sampled is not None:
                replication = (
                    f"; replicas: {report.replication_checked} of "
                    f"{report.replication_sampled} sampled checked, "
                    f"{report.replication_short} short {report.replication_note}"
                )
            print(
                f"{report.name}: {'; '.join(report.faults)} [{', '.join(report.targets)}] "
                f"-> converged {converged} {report.waiting_for}{replication}",
                flush=True,
            )
        verdict = run.finish()
    print_verdict(verdict)
    if args.json:
        args.json.write_text(json.dumps(verdict.to_json(), indent=1))
    return 1 if verdict.problems() else 0


def print_verdict(verdict: Verdict) -> None:
    f = verdict.findings
    times = [r.converged_s for r in verdict.rounds if r.converged_s is not None]
    print(f"\n{len(verdict.rounds)} rounds, {verdict.faults_injected} faults, {verdict.seconds}s")
    print(f"operations checked: {f['operations']} {f['by_result']}")
    print(
        f"wrong bytes: {f['wrong_bytes']}; untyped errors: {f['untyped_errors']}; "
        f"past deadline: {f['past_deadline']}; longest call: {f['longest_call_s']}s "
        f"({f['longest_call']})"
    )
    print(
        f"acknowledged objects read back: {verdict.read_back}; lost: {len(verdict.lost)}; "
        f"unreadable: {len(verdict.unreadable)}; evicted (cluster full): {len(verdict.evicted)}; "
        f"removed but listed again: {len(verdict.resurrected)}"
    )
    print(f"split-brain samples: {len(verdict.split_brain)}")
    if times:
        print(
            f"converged after the last heal: max {max(times):.1f}s, "
            f"mean {sum(times) / len(times):.1f}s"
        )
    for name, before in verdict.usage_start.items():
        after = verdict.usage_end.get(name)
        rss = verdict.rss_samples.get(name, [])
        if after:
            print(
                f"  {name}: RSS {before.rss_kib // 1024} -> {after.rss_kib // 1024} MiB "
                f"(peak {max(rss, default=0) // 1024} MiB over {len(rss)} samples), "
                f"threads {before.threads} -> {after.threads}"
            )
    print(f"switch: {verdict.switch}")
    problems = verdict.problems()
    print("problems:" if problems else "no problem found")
    for problem in problems:
        print(f"  - {problem}")


if __name__ == "__main__":
    sys.exit(main())
