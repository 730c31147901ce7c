"""Each `kvpool` command imports what it needs, and nothing of the other commands.

A shell user waits for every import of every command, so `kvpool get` loads neither the
master nor the storage node, and `kvpool --help` not even the client. A storage node must not
load the master's modules either: their Prometheus metrics register on import, and the
node's /metrics would serve them as its own. (How long a command takes is a benchmark figure,
in docs/benchmarks.md: `python -m bench.cli_latency`.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import urllib.request

import pytest

from kvpool import Client

#: Runs `kvpool ARGS` in this interpreter, then prints the kvpool modules it imported.
PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from kvpool.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(sys.argv[1:])
        except SystemExit as exit_:
            code = exit_.code
    print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
    """
)


def imported_by(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == 0, result
    return result["modules"]


def under(modules: list[str], *packages: str) -> list[str]:
    return [m for m in modules if m in packages or m.startswith(tuple(p + "." for p in packages))]


def test_kvpool_help_imports_no_command(tmp_path):
    modules = imported_by("--help")
    assert under(modules, "kvpool.master", "kvpool.storage_node", "kvpool.client", "grpc") == []


def test_a_storage_node_imports_nothing_of_the_master():
    assert under(imported_by("node", "--help"), "kvpool.master") == []


def test_the_master_imports_nothing_of_the_storage_node_or_the_client():
    modules = imported_by("master", "--help")
    assert under(modules, "kvpool.storage_node", "kvpool.client") == []


@pytest.fixture
def small_cluster(cluster_factory):
    cluster = cluster_factory(1, "16MiB")
    with Client(cluster.master_address) as client:
        client.put("six", b"6bytes")
    return cluster


def test_kvpool_get_imports_neither_the_master_nor_the_storage_node(small_cluster):
    modules = imported_by("get", "six", "-o", "/dev/null", "--master", small_cluster.master_address)
    assert "kvpool.client.client" in modules, "the get ran"
    assert under(modules, "kvpool.master", "kvpool.storage_node") == []


def test_a_storage_nodes_metrics_name_no_master_metric(small_cluster):
    port = small_cluster.nodes[0].ready["http_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    assert "kvpool_node_" in text
    assert sorted(set(re.findall(r"\bkvpool_master_\w+", text))) == []
