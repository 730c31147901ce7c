"""`kvpool up` says where everything is, and keeps its logs; `kvpool bench` measures the
cluster every other command uses.

`kvpool up` picks free ports for the metadata lane and the HTTP side doors, so it prints
them all; its processes' logs stay in a folder it names at start and at exit, to be read
after Ctrl-C. `kvpool bench` honours $KVPOOL_MASTER like every other command, and its
--help says which cluster it will measure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import sourced

from kvpool.local_cluster import LocalCluster

KVPOOL = [sys.executable, "-m", "kvpool.cli.main"]


def read_until(process: subprocess.Popen[str], last: str, timeout: float = 90) -> str:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline() if process.stdout else ""
        if not line:
            break
        lines.append(line)
        if last in line:
            break
    return "".join(lines)


def answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status == 200


def test_kvpool_up_prints_every_endpoint_and_keeps_its_logs_after_ctrl_c():
    process = subprocess.Popen(
        [*KVPOOL, "up", "--nodes", "2", "--dram", "16MiB", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    logs = None
    try:
        started = read_until(process, "Ctrl-C")
        master = re.search(r"kvpool master at (\S+)", started)
        lane = re.search(r"metadata lane\s+(\S+):(\d+)", started)
        http = re.findall(r"http://127\.0\.0\.1:\d+", started)
        folder = re.search(r"logs in (\S+)", started)
        assert master and lane and folder, started
        logs = Path(folder[1])
        assert len(http) == 3, f"the master's and each node's HTTP port:\n{started}"
        for url in http:
            assert answers(f"{url}/healthz"), url
        with socket.create_connection((lane[1], int(lane[2])), timeout=5):
            pass  # the lane listens where it says

        process.send_signal(signal.SIGINT)
        stopped, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        assert f"logs kept in {logs}" in stopped
        for name in ("master", "node0", "node1"):
            assert (logs / f"{name}.log").read_text(), f"{name}'s log is kept, and not empty"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if logs is not None:
            shutil.rmtree(logs, ignore_errors=True)


def test_kvpool_up_serves_on_when_a_node_is_drained_and_leaves(tmp_path):
    """(A drained node leaves, with status 0; `kvpool up` took any exit for a crash and
    stopped the whole cluster.)"""
    run_dir = tmp_path / "up"
    process = subprocess.Popen(
        [
            *KVPOOL,
            "up",
            "--nodes",
            "2",
            "--dram",
            "16MiB",
            "--port",
            "0",
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        started = read_until(process, "Ctrl-C")
        assert "Ctrl-C" in started, started
        env = os.environ | sourced(run_dir / "admin.env")
        drained = subprocess.run(
            [*KVPOOL, "drain", "node0", "--wait", "30"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert drained.returncode == 0, drained.stdout + drained.stderr
        said = read_until(process, "serve on", timeout=30)
        assert "node0 was drained and left; the others serve on" in said, said
        time.sleep(1.5)  # (three rounds of its watch)
        assert process.poll() is None, process.communicate(timeout=5)[0]
        status = subprocess.run(
            [*KVPOOL, "status"], env=env, capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 0 and "1 node(s)" in status.stdout, status.stdout
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def put_starts(http_port: int) -> float:
    """PutStart calls the master served, over gRPC and the metadata lane together."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = r'^kvpool_master_(?:lane_)?requests_total\{method="PutStart"\} (\S+)$'
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(1, "64MiB", run_dir=tmp_path_factory.mktemp("bench")) as cluster:
        yield cluster


def test_kvpool_bench_measures_the_cluster_of_kvpool_master(cluster):
    before = put_starts(cluster.master_http_port)
    done = subprocess.run(
        [*KVPOOL, "bench", "--sizes", "64KiB", "--bytes", "1MiB"],
        capture_output=True,
        text=True,
        env={**os.environ, "KVPOOL_MASTER": cluster.master_address},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"measuring the cluster at {cluster.master_address} ($KVPOOL_MASTER" in done.stdout
    assert "starting a local cluster" not in done.stdout
    assert "put GB/s" in done.stdout
    assert put_starts(cluster.master_http_port) >= before + 16, "its puts went to that master"


def test_kvpool_bench_help_says_which_cluster_it_will_measure():
    env = {**os.environ, "KVPOOL_MASTER": "10.1.2.3:50051"}
    shown = subprocess.run(
        [*KVPOOL, "bench", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert shown.returncode == 0
    assert "$KVPOOL_MASTER" in shown.stdout and "10.1.2.3:50051" in shown.stdout
    assert "--local" in shown.stdout


def test_kvpool_bench_says_when_nothing_answers_at_kvpool_master():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    done = subprocess.run(
        [*KVPOOL, "bench", "--sizes", "64KiB", "--bytes", "1MiB"],
        capture_output=True,
        text=True,
        env={**os.environ, "KVPOOL_MASTER": address},
        timeout=60,
    )
    assert done.returncode == 1
    assert f"master {address} did not answer" in done.stderr and "--local" in done.stderr
    assert "Traceback" not in done.stderr
