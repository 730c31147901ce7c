"""What the docs and --help say about the commands is what the commands do.

The NVMe tier is reachable from the local cluster the README starts (`kvpool up
--nvme-size`), and a put to an NVMe tier nobody mounted says how to mount one (not how to
add DRAM). docs/kubernetes.md passes `--nvme` and `--nvme-size` to `kvpool node`, which has
them. `kvpool master --help` gives the default of every port and of the replica count. (The
README's examples themselves run in test_readme.py.)
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import sourced

from kvpool import Client
from kvpool.errors import NoSpace

ROOT = Path(__file__).resolve().parents[2]
KVPOOL = [sys.executable, "-m", "kvpool.cli.main"]
NVME = 2


def help_of(command: str) -> str:
    done = subprocess.run([*KVPOOL, command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())  # argparse wraps lines where it likes


def test_master_help_gives_the_default_of_every_port_and_of_the_replicas():
    shown = help_of("master").split("options:", 1)[1]
    for flag, default in [
        ("--port", "50051"),
        ("--lane-port", "50052"),
        ("--http-port", "9090"),
        ("--default-replicas", "1"),
    ]:
        described = re.search(rf"{flag} \S+ (.*?)(?= --[a-z])", shown)
        assert described and f"default {default}" in described[1], (flag, described)


def test_kubernetes_guide_passes_nvme_flags_that_kvpool_node_has():
    guide = (ROOT / "docs" / "kubernetes.md").read_text()
    section = guide.split("## 6. NVMe")[1].split("\n## ")[0]
    assert "`--nvme <mountPath> --nvme-size <size>`" in section
    assert "not in `kvpool node`" not in section
    node = help_of("node")
    assert "--nvme PATH" in node and "--nvme-size SIZE" in node


def test_kvpool_up_with_nvme_size_gives_every_node_an_nvme_segment(tmp_path):
    process = subprocess.Popen(
        [*KVPOOL, "up", "--nodes", "2", "--dram", "16MiB", "--nvme-size", "32MiB", "--port", "0",
         "--run-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        master = None
        deadline = time.monotonic() + 90
        while master is None and time.monotonic() < deadline:
            line = process.stdout.readline() if process.stdout else ""
            if not line:
                break
            if line.startswith("kvpool master at "):
                master = line.split()[-1]
        assert master, "kvpool up did not start"
        exported = sourced(tmp_path / "client.env")
        credentials = {"token": exported["KVPOOL_TOKEN"], "tls_ca": exported["KVPOOL_TLS_CA"]}
        with Client(master, **credentials) as client:
            assert client.put("cold", b"on nvme", tier="nvme", replicas=2) == 2
            assert [r.tier for r in client.stat("cold").replicas] == [NVME, NVME]
            assert client.get("cold") == b"on nvme"
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
        assert process.returncode == 0
        assert not list(tmp_path.glob("node*-nvme")), "the segments' files go at exit"
        assert (tmp_path / "node0.log").exists(), "the logs stay"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_no_space_in_an_nvme_tier_nobody_mounted_says_how_to_mount_one(cluster_factory):
    cluster = cluster_factory(1, "16MiB")
    with Client(cluster.master_address) as client, pytest.raises(NoSpace) as caught:
        client.put("cold", b"x", tier="nvme")
    message = str(caught.value)
    assert "NVME tier" in message
    assert "--nvme PATH --nvme-size" in message and "kvpool up --nvme-size" in message
    assert "--dram" not in message, message
