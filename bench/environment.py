"""What a benchmark result was measured on: machine, versions, settings, and who else was busy.

The machine is shared: ``busy_processes`` samples every process's CPU time over a moment and
names those that kept a core busy, so that a result can say what it competed with.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: What makes up kvpool itself: uncommitted changes there are recorded with the results.
CORE = ("client", "common", "kvpool", "master", "proto", "storage_node", "transport")
CORE += ("lmcache_adapter", "pyproject.toml", "setup.py")


def describe(exclude_pids: Iterable[int] = ()) -> dict:
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "kvpool_commit": _git("rev-parse", "--short", "HEAD"),
        "kvpool_changes": _git("status", "--porcelain", "--", *CORE).splitlines(),
        "settings": {k: v for k, v in os.environ.items() if k.startswith(("UCX_", "MC_"))},
        "load_average": os.getloadavg(),
        "busy_processes": busy_processes(exclude_pids=exclude_pids),
    }


def busy_processes(seconds: float = 1.0, exclude_pids: Iterable[int] = ()) -> list[dict]:
    """Processes that kept more than a tenth of a core busy over the next ``seconds``."""
    snapshot = cpu_snapshot()
    time.sleep(seconds)
    return busy_since(snapshot, exclude_pids)


def cpu_snapshot() -> tuple[float, dict[int, tuple[str, int]]]:
    return time.monotonic(), _cpu_times()


def busy_since(
    snapshot: tuple[float, dict[int, tuple[str, int]]],
    exclude_pids: Iterable[int] = (),
    threshold: float = 0.1,
) -> list[dict]:
    """Processes (other than ``exclude_pids`` and this one) that used more than ``threshold``
    of a core since ``snapshot``, busiest first."""
    start, before = snapshot
    elapsed = max(time.monotonic() - start, 1e-3)
    after = _cpu_times()
    skip = {os.getpid(), *exclude_pids}
    tick = os.sysconf("SC_CLK_TCK")
    busy = []
    for pid, (name, ticks) in after.items():
        if pid in skip:
            continue
        share = (ticks - before.get(pid, (name, 0))[1]) / tick / elapsed
        if share > threshold:
            busy.append({"pid": pid, "command": name, "cpu": round(share, 2)})
    return sorted(busy, key=lambda p: -p["cpu"])


def wait_until_quiet(
    pids: Iterable[int], threshold: float = 0.1, window: float = 0.2, timeout: float = 5.0
) -> tuple[float, bool]:
    """Waits until ``pids`` together use less than ``threshold`` of a core over ``window``
    seconds; returns (seconds waited, whether they went quiet before ``timeout``)."""
    pids = list(pids)
    tick = os.sysconf("SC_CLK_TCK")
    started = time.monotonic()
    while True:
        before = sum(_ticks(pid) for pid in pids)
        time.sleep(window)
        used = (sum(_ticks(pid) for pid in pids) - before) / tick
        waited = time.monotonic() - started
        if used < threshold * window:
            return waited, True
        if waited >= timeout:
            return waited, False


def _ticks(pid: int) -> int:
    """CPU time (user + system, all threads) of ``pid`` so far, in clock ticks; 0 if gone."""
    try:
        return _ticks_in(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return 0


def _ticks_in(stat: str) -> int:
    """utime + stime from the text of a /proc/PID/stat (after the command, which may hold
    spaces and parentheses)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _cpu_times() -> dict[int, tuple[str, int]]:
    times = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        name = cmdline.decode(errors="replace").strip()[:120]
        name = name or stat[stat.index("(") : stat.rindex(")") + 1]
        times[int(entry.name)] = (name, _ticks_in(stat))
    return times


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    return done.stdout.rstrip()
