"""Watching the system from the observer's link while it runs: who says it leads (ten times
a second, each master asked on a thread of its own so that a stopped one holds up nobody),
and what each long-lived process holds (resident memory, threads)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvpool.local_cluster import ManagedProcess

INTERVAL = 0.1


@dataclass
class LeaderWatch:
    """Samples every master's ``/readyz``; ``overlaps`` are the moments two said yes."""

    masters: list[ManagedProcess]
    #: per master: (time, leads) samples; leads None when it did not answer
    samples: dict[str, list[tuple[float, bool | None]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for master in self.masters:
            self.samples[master.name] = []
            thread = threading.Thread(target=self._watch, args=(master,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _watch(self, master: ManagedProcess) -> None:
        series = self.samples[master.name]
        while not self._stop.is_set():
            began = time.monotonic()
            series.append((began, readyz(master)))
            del series[:-200_000]
            self._stop.wait(max(0.0, INTERVAL - (time.monotonic() - began)))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(2)

    def overlaps(self, since: float = 0.0) -> list[tuple[float, list[str]]]:
        """Moments at which two or more masters said they lead: each master's last answer
        before the moment, answers taken at most one interval apart."""
        events = sorted(
            (t, name, leads)
            for name, series in self.samples.items()
            for t, leads in list(series)
            if t >= since
        )
        state: dict[str, tuple[float, bool]] = {}
        found = []
        for t, name, leads in events:
            if leads is None:
                continue
            state[name] = (t, leads)
            leading = sorted(n for n, (at, yes) in state.items() if yes and t - at <= INTERVAL)
            if len(leading) > 1:
                found.append((t, leading))
        return found

    def leaders_now(self) -> list[str]:
        return [name for name, series in self.samples.items() if series and series[-1][1]]


def readyz(master: ManagedProcess) -> bool | None:
    url = f"http://{master.host}:{master.ready['http_port']}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=0.5) as response:
            return response.status == 200
    except urllib.error.HTTPError as error:
        return False if error.code == 503 else None
    except OSError:
        return None


@dataclass(frozen=True)
class Usage:
    rss_kib: int
    threads: int


def usage(pid: int) -> Usage | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if "VmRSS" not in fields:
        return None  # (a process that exited and was not reaped yet has no memory)
    return Usage(int(fields["VmRSS"].split()[0]), int(fields["Threads"]))


def usage_of(pids: dict[str, int]) -> dict[str, Usage]:
    found = {}
    for name, pid in pids.items():
        sample = usage(pid)
        if sample is not None:
            found[name] = sample
    return found
