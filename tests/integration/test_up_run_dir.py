"""`kvpool up --run-dir D` keeps D after exit, so running it again there is the natural next
step: it starts a fresh cluster (new throwaway CA and tokens, the env files rewritten) and
leaves what is not its throwaway credentials alone. A second `kvpool up` in a folder one
runs in, a folder whose credentials another tool made, a run folder that is a file or cannot
be made: each is refused with one `error:` line on stderr and exit status 1, no traceback.
A number out of range is refused as it is read (exit status 2, the flag named), before
anything is made or started. The env files name the CA by its absolute path, so that they
can be sourced from any folder, whatever folder `--run-dir` was given relative to.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import sourced

KVPOOL = [sys.executable, "-m", "kvpool.cli.main"]
UP = [*KVPOOL, "up", "--nodes", "1", "--dram", "16MiB", "--port", "0"]


def start_up(run_dir: Path, cwd: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """A `kvpool up` in ``run_dir`` (relative to ``cwd``, when given), once it says it
    serves; and what it said."""
    process = subprocess.Popen(
        [*UP, "--run-dir", str(run_dir)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = process.stdout.readline() if process.stdout else ""
        if not line:
            break
        said.append(line)
        if "Ctrl-C stops the cluster" in line:
            return process, "".join(said)
    process.kill()
    _, errors = process.communicate(timeout=30)
    raise AssertionError(f"kvpool up did not start:\n{''.join(said)}\n{errors}")


def stop_up(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    _, errors = process.communicate(timeout=60)
    assert process.returncode == 0, errors


def refusal(*args: str) -> str:
    """The one error line of a `kvpool up` that must refuse to start (exit status 1)."""
    done = subprocess.run([*UP, *args], capture_output=True, text=True, timeout=90)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "error:" not in done.stdout, "errors go to stderr"
    return errors[0]


def admin_status(run_dir: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = os.environ | sourced(run_dir / "admin.env")
    env.pop("KVPOOL_TOKEN_FILE", None)
    return subprocess.run(
        [*KVPOOL, "status"], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_kvpool_up_runs_again_in_the_run_dir_it_kept(tmp_path):
    run_dir = tmp_path / "up"
    first, _ = start_up(run_dir)
    first_env = sourced(run_dir / "admin.env")
    stop_up(first)
    left_behind = run_dir / "node5-nvme" / "segment"  # (as a crashed run would leave it)
    left_behind.parent.mkdir()
    left_behind.write_bytes(b"kept")

    second, said = start_up(run_dir)
    try:
        assert f"logs in {run_dir}" in said, said
        status = admin_status(run_dir)
        assert status.returncode == 0 and "1 node(s)" in status.stdout, status.stderr
        assert sourced(run_dir / "admin.env")["KVPOOL_TOKEN"] != first_env["KVPOOL_TOKEN"]
        line = refusal("--run-dir", str(run_dir))  # while the second one runs there
        assert "another `kvpool up`" in line and str(second.pid) in line, line
        assert admin_status(run_dir).returncode == 0, "the refused one left the running one be"
    finally:
        if second.poll() is None:
            stop_up(second)
    assert left_behind.read_bytes() == b"kept", "what is not its own, kvpool up leaves alone"
    assert (run_dir / "master.log").read_text().count('"master started"') == 2, "logs go on"


def test_kvpool_up_leaves_credentials_it_did_not_make_alone(tmp_path):
    credentials = tmp_path / "credentials.json"
    credentials.write_text('{"version": 1, "tokens": []}')
    line = refusal("--run-dir", str(tmp_path))
    assert "credentials.json" in line and "did not make" in line, line
    assert credentials.read_text() == '{"version": 1, "tokens": []}'


def test_kvpool_up_leaves_a_folder_of_someone_else_s_keys_alone(tmp_path):
    (tmp_path / "pki").mkdir()
    notes = tmp_path / "pki" / "notes.txt"
    notes.write_text("mine")
    keys = tmp_path / "capability-keys.json"
    keys.write_text("{}")
    line = refusal("--run-dir", str(tmp_path))
    assert "capability-keys.json" in line and "pki" in line and "did not make" in line, line
    assert notes.read_text() == "mine" and keys.read_text() == "{}"


def test_kvpool_up_refuses_a_run_dir_it_cannot_make_in_one_line(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert "is a file, not a folder" in refusal("--run-dir", str(a_file))
    line = refusal("--run-dir", str(a_file / "below"))
    assert "cannot make the run folder" in line, line


def test_a_run_dir_that_is_a_symlink_loop_is_refused_in_one_line(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    line = refusal("--run-dir", str(tmp_path / "a"))
    assert str(tmp_path / "a") in line, line


def test_a_run_dir_under_the_home_of_no_such_user_is_refused_in_one_line():
    line = refusal("--run-dir", "~no-such-user-of-kvpool/up")
    assert "~no-such-user-of-kvpool/up" in line and "give a full path" in line, line


def test_the_env_files_of_a_relative_run_dir_work_from_any_folder(tmp_path):
    process, said = start_up(Path("up"), cwd=tmp_path)
    try:
        run_dir = tmp_path / "up"
        assert f"logs in {run_dir}" in said, said
        for name in ("admin.env", "client.env"):
            assert Path(sourced(run_dir / name)["KVPOOL_TLS_CA"]).is_absolute(), name
        status = admin_status(run_dir, cwd=Path("/"))
        assert status.returncode == 0 and "1 node(s)" in status.stdout, status.stderr
    finally:
        stop_up(process)


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--port", "99999", "from 0 to 65535"),
        ("--nodes", "0", "from 1 to 64"),
        ("--dram", "0", "must be a size from"),
        ("--nvme-size", "4x", "cannot read '4x' as a size"),
        ("--dram", "1TiB", "more than this machine's memory"),
    ],
)
def test_a_number_out_of_range_is_refused_before_anything_starts(tmp_path, flag, value, said):
    run_dir = tmp_path / "up"
    done = subprocess.run(
        [*KVPOOL, "up", "--run-dir", str(run_dir), flag, value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and said in done.stderr, done.stderr
    assert re.search(rf"(argument {flag}|^error: {flag} )", done.stderr, re.M), done.stderr
    assert not run_dir.exists(), "nothing is made for a cluster that cannot start"
