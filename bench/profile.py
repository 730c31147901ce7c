"""``kvpool bench --compare --profile WORKLOAD``: where kvpool's time goes, with py-spy.

The workload runs on kvpool alone, over and over for ``--profile-seconds``, while py-spy
samples the client runner(s), the master and the storage node: every thread, idle ones too
(a client blocked on the network is time the caller waits as well). For each process this
writes ``<placement>-<workload>-<role>.txt`` under ``bench/results/profile/`` (collapsed
stacks: speedscope and flamegraph.pl read them), and prints where its threads spend
their samples: the functions they were in (inclusive) and the innermost frames (exclusive).

py-spy needs root (ptrace); bench/setup_mooncake.sh installs it into .venv.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

RATE = 250


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@contextmanager
def recording(
    targets: Mapping[str, int], out_dir: Path, stem: str, native: bool = False
) -> Iterator[dict[str, Path]]:
    """py-spy records every ``role -> pid`` until the block ends; yields role -> raw file.
    ``native`` adds C frames (gRPC, protobuf, UCX) at some cost to the target."""
    binary = py_spy()
    if binary is None:
        raise RuntimeError("py-spy is missing: run bench/setup_mooncake.sh")
    out_dir.mkdir(parents=True, exist_ok=True)
    spies, files = [], {}
    for role, pid in targets.items():
        files[role] = out_dir / f"{stem}-{role}.txt"
        argv = [binary, "record", "--pid", str(pid), "--rate", str(RATE), "--idle", "--threads"]
        argv += ["--format", "raw", "--output", str(files[role])]
        argv += ["--native"] if native else ["--nonblocking"]
        spies.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:
        yield files
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()


FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


#: Innermost frames where a thread sleeps: a thread that is nearly always in one is idle.
WAITS = ("select", "wait", "progress_until", "Thread.run", "epoll", "poll")


def summarize(raw: Path, top: int = 10) -> str:
    """Per thread: its share of samples (idle threads in one line), then the functions its
    samples were in (inclusive, below the call chain's common roots) and at (innermost)."""
    inclusive: dict[str, Counter] = defaultdict(Counter)
    leaves: dict[str, Counter] = defaultdict(Counter)
    totals: Counter = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = re.sub(r"^thread \((0x[0-9A-Fa-f]+|\d+)\): ", "", frames[0])
        thread = re.sub(r"\d+", "N", thread)  # one entry for a pool's worker threads
        calls = [_short(f) for f in frames[1:]] or ["(no Python frame)"]
        totals[thread] += count
        for name in set(calls):
            inclusive[thread][name] += count
        leaves[thread][calls[-1]] += count
    lines = []
    for thread, total in totals.most_common():
        (leaf, leaf_count), *_ = leaves[thread].most_common(1)
        if leaf_count / total > 0.95 and any(w in leaf for w in WAITS):
            lines.append(f"  thread {thread}: idle ({leaf_count / total:.0%} waiting in {leaf})")
            continue
        lines.append(f"  thread {thread}: {total} samples")
        shown = [(n, c) for n, c in inclusive[thread].most_common() if c / total < 0.97]
        for name, count in shown[:top]:
            lines.append(f"    {count / total:6.1%} in  {name}")
        for name, count in leaves[thread].most_common(top // 2 + 1):
            lines.append(f"    {count / total:6.1%} at  {name}")
    return "\n".join(lines)


def _short(frame: str) -> str:
    match = FRAME.match(frame)
    return f"{match['name']} ({match['file']})" if match else frame
