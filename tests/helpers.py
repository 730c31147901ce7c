"""Small waiting and scraping helpers shared by tests that drive real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Polls ``predicate`` until it holds or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def metric(port: int, name: str) -> float:
    """The value of an unlabelled Prometheus sample served on 127.0.0.1:``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def kvpool_cli(*args: str, master: str) -> subprocess.CompletedProcess[str]:
    """Runs ``kvpool ARGS`` as a shell user would, against ``master`` ($KVPOOL_MASTER)."""
    return subprocess.run(
        [sys.executable, "-m", "kvpool.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "KVPOOL_MASTER": master},
        timeout=60,
    )
