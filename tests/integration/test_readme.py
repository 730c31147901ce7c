"""The README's examples run as written, against the `kvpool up` cluster the README starts.

Every ```bash and ```python block of README.md runs, in order, unless the line before it is
an HTML comment saying otherwise (invisible on the rendered page):

* ``<!-- not run: why -->``: illustrative (installs, services that run until stopped);
* ``<!-- background: ... -->``: the `kvpool up` command the blocks after it run against; it
  is started as written, on a free port (the README's 127.0.0.1:50051 stands for it).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import sourced

README = Path(__file__).resolve().parents[2] / "README.md"
#: The master address the README's examples use.
README_MASTER = "127.0.0.1:50051"
#: The run folder the README's `kvpool up` writes its credentials into.
README_RUN_DIR = "./kvpool-up"
#: What a fresh shell does not have: the test session's own credentials.
SESSION_ONLY = ("KVPOOL_MASTER", "KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE", "KVPOOL_TLS_CA",
                "KVPOOL_TEST_ADMIN_TOKEN")  # fmt: skip
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int  # of the opening fence, 1-based
    marker: str  # "run", "not run" or "background"


def readme_blocks() -> list[Block]:
    """The README's bash and python blocks, each with what its preceding comment says."""
    lines = README.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = re.fullmatch(r"```(\w*)\s*", lines[i])
        if not opening:
            i += 1
            continue
        end = lines.index("```", i + 1)
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = "run"
        for kind in ("not run", "background"):
            if before.startswith(f"<!-- {kind}"):
                marker = kind
        if opening[1] in ("bash", "python"):
            blocks.append(Block(opening[1], "\n".join(lines[i + 1 : end]), i + 1, marker))
        i = end + 1
    return blocks


def environment() -> dict[str, str]:
    """What a user's shell has: the kvpool command on PATH, no master chosen yet."""
    env = {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def readme_cluster(tmp_path_factory):
    """The README's own `kvpool up` command, started as written (on a free port)."""
    [background] = [b for b in readme_blocks() if b.marker == "background"]
    [command] = [shlex.split(line, comments=True) for line in background.code.splitlines()]
    assert command[:2] == ["kvpool", "up"], background
    run_dir = tmp_path_factory.mktemp("readme-up")
    process = subprocess.Popen(
        [*command, "--port", "0", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(),
    )
    lines = []
    master = None
    deadline = time.monotonic() + 120
    while master is None and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("kvpool master at "):
            master = line.split()[-1]
    assert master, "".join(lines)
    yield master, run_dir
    process.send_signal(signal.SIGINT)
    try:
        process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()


def test_only_a_few_readme_blocks_are_marked_not_run():
    blocks = readme_blocks()
    not_run = [b.line for b in blocks if b.marker == "not run"]
    assert len([b for b in blocks if b.marker == "run"]) >= 2
    assert len(not_run) <= 3, f"blocks marked not run at lines {not_run}: make them runnable"
    assert README_MASTER in README.read_text()


def test_the_readme_examples_run_as_written(readme_cluster, tmp_path):
    master, run_dir = readme_cluster
    for block in [b for b in readme_blocks() if b.marker == "run"]:
        code = block.code.replace(README_MASTER, master).replace(README_RUN_DIR, str(run_dir))
        env = environment()
        if block.language == "bash":
            argv = ["bash", "-euo", "pipefail", "-c", code]
        else:  # run as the README says: in the shell that sourced client.env
            argv = [sys.executable, "-c", code]
            env.update(sourced(run_dir / "client.env"))
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        output = f"README.md line {block.line}:\n{done.stdout}\n{done.stderr}"
        assert done.returncode == 0, output
        assert "Traceback" not in done.stderr, output
