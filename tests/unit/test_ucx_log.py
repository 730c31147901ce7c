"""UCX's own log lines go to kvpool's structured log, never raw onto the process's output.

UCX prints its errors (``mm_sysv.c:61 UCX ERROR shmat(...) failed`` each time an endpoint to
a dead same-host node is tried) on the process's stdout by default. kvpool puts its own
handler in front (transport/ucx_log.py): each message becomes a structlog event
``ucx reported`` at a level that says what it means to a kvpool user, and a storm of one
message is cut down to a few lines.
"""

from __future__ import annotations

import json
import subprocess
import sys

from kvpool.transport.ucx_log import BURST, RateLimit

#: A process that configures kvpool's logging (JSON lines on stderr, as kvpool's own processes
#: do), loads the UCX binding, has UCX log what the arguments say, and exits.
EMITTER = """
import sys
from kvpool.common.logging import configure_logging
configure_logging("json", level="debug")
from kvpool.transport import ucp, ucx_log
for spec in sys.argv[1:]:
    level, line, count = spec.split(":")
    for i in range(int(count)):
        ucx_log.emit(level, f"message {i} from line {line}", int(line))
"""


def run_emitter(*specs: str) -> tuple[str, list[dict]]:
    """Its stdout, and its stderr as JSON events (it fails the test on any other line)."""
    done = subprocess.run(
        [sys.executable, "-c", EMITTER, *specs], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    events = []
    for line in done.stderr.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a raw line on stderr: {line!r}") from None
    return done.stdout, events


def test_ucx_errors_become_warnings_and_warnings_info_in_the_structured_log():
    stdout, events = run_emitter("ERROR:10:1", "WARN:20:1", "DIAG:30:1", "DEBUG:40:1")
    assert stdout == ""
    assert [(e["event"], e["level"], e["ucx_level"], e["source"], e["detail"]) for e in events] == [
        ("ucx reported", "warning", "ERROR", "kv_log_emit.c:10", "message 0 from line 10"),
        ("ucx reported", "info", "WARN", "kv_log_emit.c:20", "message 0 from line 20"),
        ("ucx reported", "debug", "DIAG", "kv_log_emit.c:30", "message 0 from line 30"),
        ("ucx reported", "debug", "DEBUG", "kv_log_emit.c:40", "message 0 from line 40"),
    ]


def test_a_storm_of_one_message_is_cut_down_to_a_few_lines():
    stdout, events = run_emitter("ERROR:10:2000", "ERROR:11:1")
    assert stdout == ""
    from_10 = [e for e in events if e.get("source") == "kv_log_emit.c:10"]
    assert [e["detail"] for e in from_10] == [f"message {i} from line 10" for i in range(BURST)]
    assert [e["detail"] for e in events if e.get("source") == "kv_log_emit.c:11"] == [
        "message 0 from line 11"
    ], "another source line is not held back by the storm"
    others = [e for e in events if e["event"] != "ucx reported"]
    assert all(e["event"] == "ucx messages dropped" for e in others), others
    assert len(events) <= BURST + 1 + 10


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_limit_lets_a_burst_through_per_window_and_counts_the_rest():
    clock = FakeClock()
    limit = RateLimit(burst=2, window=10.0, clock=clock)
    assert [limit.admit("a") for _ in range(5)] == [(True, 0), (True, 0)] + [(False, 0)] * 3
    assert limit.admit("b") == (True, 0), "each source has its own allowance"
    clock.now = 10.0
    assert limit.admit("a") == (True, 3), "the first line of a new window says what was left out"
    assert limit.admit("a") == (True, 0)
    assert limit.admit("a") == (False, 0)


def test_the_rate_limit_keeps_a_bounded_number_of_sources():
    limit = RateLimit(burst=1, max_sources=3, clock=FakeClock())
    for source in "abcdef":
        limit.admit(source)
    assert limit.admit("f") == (False, 0)  # still known
    assert limit.admit("a") == (True, 0)  # forgotten, so new again
