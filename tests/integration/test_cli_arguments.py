"""`kvpool master` and `kvpool node` refuse bad numbers with exit code 2 and one line that
names the flag; two nodes on one host get ids of their own; a taken port is named as such."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool import Client
from kvpool.common.memory_limit import memory_limit
from kvpool.local_cluster import ManagedProcess

KVPOOL = [sys.executable, "-m", "kvpool.cli.main"]
FREE_PORTS = ["--port", "0", "--lane-port", "0", "--http-port", "0"]
NO_MASTER = ["--master", "127.0.0.1:1"]  # never reached: these nodes stop before


def kvpool(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs a kvpool command that must end by itself (a master or node that started after
    all would run until the timeout, and fail the test)."""
    return subprocess.run(
        [*KVPOOL, *args, "--log-format", "console"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The one line that says why a command refused to start, once it has (exit code 2)."""
    output = done.stderr + done.stdout
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    return output.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-inflight", "0"),
        ("--lease-ttl", "nan"),
        ("--lease-ttl", "601"),  # longer than any lease a reader may ask for
        ("--write-timeout", "inf"),
        ("--tick", "-5"),
        ("--node-ttl", "0"),
        ("--client-ttl", "forever"),
        ("--reservation-timeout", "-inf"),
        ("--reclaim-delay", "-1"),
        ("--soft-pin-ttl", "1e300"),
        ("--high-watermark", "1.5"),
        ("--eviction-ratio", "nan"),
        ("--default-replicas", "9"),
        ("--election-ttl", "0"),
        ("--story-events", "-1"),
        ("--port", "65536"),
        ("--lane-port", "-2"),
    ],
)
def test_the_master_refuses_a_number_out_of_range_naming_its_flag(flag, value):
    line = refusal(kvpool("master", *FREE_PORTS, f"{flag}={value}"))
    assert f"argument {flag}:" in line and repr(value) in line


@pytest.mark.parametrize("name", ["rev/nodes", ""])
def test_the_master_refuses_a_cluster_name_that_would_reach_into_another_cluster_s_keys(name):
    """(etcd keys live under /kvpool/NAME/: a master of "rev/nodes" listed itself as a
    storage node of cluster "rev", whose next leader waited for it.)"""
    line = refusal(kvpool("master", *FREE_PORTS, f"--cluster={name}"))
    assert "argument --cluster:" in line and "without '/'" in line


def test_the_master_refuses_an_eviction_ratio_that_reaches_the_watermark():
    done = kvpool("master", *FREE_PORTS, "--high-watermark", "0.5", "--eviction-ratio", "0.5")
    line = refusal(done)
    assert "--eviction-ratio (0.5) must be below --high-watermark (0.5)" in line


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--dram", "99999999TiB"),
        ("--dram", "9" * 400),  # a float that overflows
        ("--dram", "-1GiB"),
        ("--nvme-size", "0"),
        ("--heartbeat-interval", "nan"),
        ("--heartbeat-interval", "0"),
        ("--drain-timeout", "-1"),
        ("--http-port", "70000"),
    ],
)
def test_a_node_refuses_a_number_out_of_range_naming_its_flag(flag, value, tmp_path):
    nvme = ["--nvme", str(tmp_path / "nvme")] if flag == "--nvme-size" else []
    line = refusal(kvpool("node", *NO_MASTER, "--http-port", "0", *nvme, f"{flag}={value}"))
    assert f"argument {flag}:" in line


def test_a_node_refuses_more_dram_than_the_machine_has():
    too_much = f"{2 * memory_limit() // (1 << 20)}MiB"
    line = refusal(kvpool("node", *NO_MASTER, "--http-port", "0", "--dram", too_much))
    assert "--dram" in line and "more than this machine's memory" in line


def test_a_taken_http_port_is_named_as_such_not_as_storage_that_failed():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = kvpool(
            "node", *NO_MASTER, "--listen", "127.0.0.1", "--http-port", str(port), "--dram", "64MiB"
        )
    line = refusal(done)
    assert f"port {port} is taken" in line and "pass --http-port" in line
    assert "cannot open storage" not in done.stderr + done.stdout


#: What a process of an insecure cluster has: no token, no CA.
SECURE_ENV = ("KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE", "KVPOOL_TLS_CA")


class Nodes:
    """`kvpool node` processes started as a user would, with no --node-id. (On an --insecure
    cluster, said explicitly: a node's token names the one node id it may act as, and these
    tests are about the ids nodes take when given none.)"""

    def __init__(self, master: str, run_dir: Path) -> None:
        self.master = master
        self.run_dir = run_dir
        self.started: list[ManagedProcess] = []

    def start(self, *args: str) -> ManagedProcess:
        name = f"plain-node-{len(self.started)}"
        argv = [*KVPOOL, "node", "--master", self.master, "--listen", "127.0.0.1"]
        argv += ["--http-port", "0", "--drain-timeout", "1", "--log-format", "json", *args]
        argv += ["--insecure"]
        env = {k: v for k, v in os.environ.items() if k not in SECURE_ENV}
        node = ManagedProcess(name, argv, self.run_dir, env)
        self.started.append(node)
        return node

    def ready(self, *args: str) -> dict:
        node = self.start(*args)
        node.ready = node.wait_ready(time.monotonic() + 60)
        return node.ready


@pytest.fixture
def nodes(cluster_factory, tmp_path, monkeypatch) -> Iterator[Nodes]:
    cluster = cluster_factory(0, "64MiB", secure=False)
    for name in SECURE_ENV:  # (this process is a client of it too)
        monkeypatch.delenv(name, raising=False)
    started = Nodes(cluster.master_address, cluster.run_dir)
    yield started
    for node in started.started:
        node.stop()


def test_two_nodes_started_alike_on_one_host_get_ids_of_their_own(nodes):
    first = nodes.ready("--dram", "64MiB")
    second = nodes.ready("--dram", "64MiB")
    host = socket.gethostname()
    assert first["node_id"] != second["node_id"]
    assert first["node_id"].startswith(f"{host}-") and second["node_id"].startswith(f"{host}-")
    with Client(nodes.master, timeout=10) as client:
        assert client.put_many([("a", b"x" * 1000), ("b", b"y")], replicas=2) == [2, 2]
        assert client.get("a") == b"x" * 1000


def test_a_node_with_an_nvme_segment_keeps_its_id_and_shares_its_segment_with_no_other(
    nodes, tmp_path
):
    def nvme(directory: str) -> list[str]:
        return ["--dram", "0", "--nvme", str(tmp_path / directory), "--nvme-size", "64MiB"]

    first = nodes.ready(*nvme("a"))
    other = nodes.ready(*nvme("b"))
    assert other["node_id"] != first["node_id"], "another directory, another node"

    same = nodes.start(*nvme("a"))
    assert same.popen.wait(timeout=30) == 2, same.log_tail()
    log = same.log_tail()
    assert "is in use by another process" in log and "its own --nvme directory" in log

    nodes.started[0].stop()
    assert nodes.ready(*nvme("a"))["node_id"] == first["node_id"], "back under the same id"
