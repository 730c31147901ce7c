"""kvpool's log lines in a process that did not configure structlog: on stderr, warnings up.

vLLM, SGLang and LMCache load kvpool's client; their stdout is their own output (and that of
``kvpool get KEY > file`` the object's bytes). structlog unconfigured prints every level,
debug included, on stdout: kvpool's loggers write warnings and errors on stderr instead, and
leave structlog's configuration to the application, which they follow once it has one.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvpool.common.logging import configure_logging_on_first_use

#: Logs one line of each level through a client module's logger, as the client does.
LINES = """
from kvpool.client import client
for level in ("debug", "info", "warning", "error"):
    getattr(client.log, level)(f"a {level} line", key="k")
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_unconfigured_a_client_logs_warnings_up_on_stderr_and_nothing_on_stdout():
    done = run(LINES + "import structlog; assert not structlog.is_configured()")
    assert done.stdout == ""
    assert "a warning line" in done.stderr and "a error line" in done.stderr
    assert "a debug line" not in done.stderr and "a info line" not in done.stderr


def test_an_exception_is_a_plain_traceback_without_local_variables():
    done = run(
        "from kvpool.client import client\n"
        "secret = 'do-not-show'\n"
        "try:\n    1 / 0\n"
        "except ZeroDivisionError:\n    client.log.exception('failed')\n"
    )
    assert done.stdout == ""
    assert "ZeroDivisionError" in done.stderr and "do-not-show" not in done.stderr


def test_an_application_that_configures_structlog_gets_kvpools_lines_its_way():
    """Before or after kvpool's first line: its configuration wins, every level included."""
    done = run(
        LINES.replace('("debug", "info", "warning", "error")', '("warning",)')
        + "import structlog\n"
        "structlog.configure(processors=[structlog.processors.JSONRenderer()])\n" + LINES
    )
    events = [json.loads(line)["event"] for line in done.stdout.splitlines()]
    assert events == ["a debug line", "a info line", "a warning line", "a error line"]
    assert done.stderr.count("a warning line") == 1  # (the one before it configured)


def test_a_configuration_put_off_imports_structlog_only_when_a_line_is_logged():
    done = run(
        "import sys\n"
        "from kvpool.common.logging import configure_logging_on_first_use, get_logger\n"
        "configure_logging_on_first_use('json', 'warning')\n"
        "log = get_logger('kvpool.client')\n"
        "assert 'structlog' not in sys.modules\n" + LINES
    )
    assert done.stdout == ""
    events = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(e["event"], e["level"]) for e in events] == [
        ("a warning line", "warning"),
        ("a error line", "error"),
    ]


def test_a_configuration_put_off_gives_way_to_one_made_since():
    done = run(
        "from kvpool.common.logging import configure_logging_on_first_use\n"
        "configure_logging_on_first_use('json', 'warning')\n"
        "import structlog\n"
        "structlog.configure(processors=[structlog.processors.JSONRenderer()])\n" + LINES
    )
    assert len(done.stdout.splitlines()) == 4 and done.stderr == ""


def test_configure_logging_writes_json_lines_on_stderr_as_kvpools_services_do():
    done = run(
        "from kvpool.common.logging import configure_logging\n"
        "configure_logging('json', 'info')\n" + LINES
    )
    assert done.stdout == ""
    events = [json.loads(line) for line in done.stderr.splitlines()]
    assert [e["level"] for e in events] == ["info", "warning", "error"]
    assert all({"event", "timestamp", "key"} <= set(e) for e in events)


@pytest.mark.parametrize(("fmt", "level"), [("xml", "warning"), ("json", "loud")])
def test_a_configuration_put_off_is_checked_at_once(fmt, level):
    with pytest.raises(ValueError, match=r"log format|log level"):
        configure_logging_on_first_use(fmt, level)


def test_structlog_configured_back_to_its_defaults_is_still_unconfigured_for_kvpool():
    """``structlog.testing.capture_logs`` configures structlog back to its built-in defaults
    as it ends (which print every level on stdout): kvpool's default stays in force."""
    done = run(
        "from structlog.testing import capture_logs\nwith capture_logs():\n    pass\n" + LINES
    )
    assert done.stdout == ""
    assert "a warning line" in done.stderr and "a debug line" not in done.stderr


def test_a_configuration_put_off_writes_to_the_stderr_of_the_moment():
    """Applied while one stream is stderr (a test's capture, say), it must not keep writing
    to that stream once the caller has swapped it back and closed it."""
    done = run(
        "import io, sys\n"
        "from kvpool.common.logging import configure_logging_on_first_use, get_logger\n"
        "configure_logging_on_first_use('json', 'warning')\n"
        "log = get_logger('kvpool.client')\n"
        "real, captured = sys.stderr, io.StringIO()\n"
        "sys.stderr = captured\n"
        "log.warning('while captured')\n"
        "sys.stderr = real\n"
        "captured.close()\n"
        "log.warning('after')\n"
    )
    assert done.stdout == ""
    assert '"event": "after"' in done.stderr and "while captured" not in done.stderr
