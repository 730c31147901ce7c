"""A process of the cluster under test that exits during a chaos run is a crash (no fault
kills one), and the verdict says so. Until seed 43 (2026-12-05) the run itself broke instead:
an exited process not yet reaped has a /proc entry without memory figures."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.chaos.monitor import usage, usage_of
from bench.chaos.run import Verdict


def test_a_process_that_exited_has_no_usage_reaped_or_not():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # (exited, not reaped: a zombie)
        with open(f"/proc/{child.pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    else:
        raise AssertionError("the child did not exit")
    assert usage(child.pid) is None
    assert usage_of({"node2": child.pid, "self": 1}).keys() == {"self"}
    child.wait()
    assert usage(child.pid) is None


def test_the_verdict_names_the_processes_that_exited():
    verdict = Verdict(
        findings={"wrong_bytes": 0, "untyped_errors": 0, "past_deadline": 0},
        rounds=[],
        split_brain=[],
        exited=["node2"],
    )
    assert verdict.problems() == ["processes exited during the run: node2"]
