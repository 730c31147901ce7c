"""The harness's "let the others go quiet" step: it waits for idle processes only as long as
it takes to see them idle, and gives up (saying so) on busy ones."""

from __future__ import annotations

import subprocess
import sys

from bench.environment import wait_until_quiet


def test_idle_processes_count_as_quiet_at_once():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        waited, quiet = wait_until_quiet([sleeper.pid], timeout=5.0)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert quiet and waited < 2.0


def test_a_busy_process_is_waited_for_until_the_timeout_and_reported():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        waited, quiet = wait_until_quiet([spinner.pid], timeout=0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert not quiet and waited >= 0.5


def test_processes_that_are_gone_are_quiet():
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert wait_until_quiet([done.pid], timeout=1.0)[1]
