"""The files an admin edits, under a real master: a malformed one never stops it, never
drops its nodes, and at start is one clear line; ``kvpool token create`` run many times at
once keeps every token it printed.

A credentials file replaced by deeply nested JSON raised RecursionError on every call the
master checked a token on (the node's heartbeats too: it was declared dead); a quotas or
capability key file did the same in its serving loop; at start, a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import cluster_status

from kvpool import Client
from kvpool.master.capability_keys import load_or_create
from kvpool.security.tokens import CredentialStore

KVPOOL = str(Path(sys.executable).parent / "kvpool")
DEEP = "[" * 100_000 + "]" * 100_000


def _replace(path: Path, content: str) -> None:
    """Puts ``content`` in place of ``path`` at once (as an editor or a copy tool does)."""
    temporary = path.with_name(path.name + ".edit")
    temporary.write_text(content)
    os.replace(temporary, path)


def _bad_key_file(path: Path) -> str:
    content = json.loads(path.read_text())
    content["keys"][0]["id"] = "ID"
    return json.dumps(content).replace('"ID"', "1e400")


def test_malformed_files_under_a_running_master_keep_it_serving_with_what_it_read(
    cluster_factory, tmp_path
):
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"version": 1, "tenants": {"default": {"objects": 100}}}))
    cluster = cluster_factory(
        nodes=1, dram="64MiB", master_args=["--quotas", str(quotas), "--node-ttl", "2"]
    )
    with Client(cluster.master_address, timeout=30) as client:
        client.put("before", b"kept")
    credentials = cluster.run_dir / "credentials.json"
    keys = cluster.run_dir / "capability-keys.json"
    _replace(credentials, '{"version": 1, "tokens": ' + DEEP + "}")
    _replace(quotas, '{"version": 1, "tenants": ' + DEEP + "}")
    _replace(keys, _bad_key_file(keys))
    time.sleep(4.0)  # (twice the node TTL: a node refused its heartbeats would be dead)

    assert cluster.master is not None and cluster.master.alive()
    assert cluster_status(cluster.master_address).nodes == 1
    with Client(cluster.master_address, timeout=30) as client:
        assert client.get("before") == b"kept"
        client.put("after", b"still served")
        assert client.get("after") == b"still served"
    log = cluster.master.log_path.read_text()
    assert "credentials file unusable; still using the tokens read from it before" in log
    assert "quotas file unusable; still using the quotas read from it before" in log
    assert "capability key file not taken" in log
    assert "nested too deeply" in log and "OverflowError" in log
    assert "Traceback" not in log and "RecursionError" not in log


def _master(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        KVPOOL, "master", "--host", "127.0.0.1", "--port", "0", "--lane-port", "0",
        "--http-port", "0", "--tombstone-file", str(tmp_path / "tombstones.json"), *args,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("which", ["credentials", "quotas", "keys"])
def test_a_master_started_on_a_malformed_file_says_so_in_one_line(tmp_path, which):
    credentials = tmp_path / "credentials.json"
    keys = tmp_path / "keys.json"
    quotas = tmp_path / "quotas.json"
    CredentialStore.create(credentials)
    load_or_create(keys)
    quotas.write_text(json.dumps({"version": 1}))
    bad = {"credentials": credentials, "quotas": quotas, "keys": keys}[which]
    bad.write_text(_bad_key_file(keys) if which == "keys" else '{"version": 1, "x": ' + DEEP + "}")
    done = _master(
        tmp_path,
        *("--credentials", str(credentials), "--quotas", str(quotas)),
        *("--capability-key-file", str(keys), "--log-format", "json"),
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    [line] = [line for line in output.splitlines() if '"level": "error"' in line]
    assert str(bad) in line and ("nested too deeply" in line or "OverflowError" in line), line


def test_token_creates_run_at_once_all_land_in_the_file(tmp_path):
    path = tmp_path / "credentials.json"

    def create(name: str) -> str:
        done = subprocess.run(
            [KVPOOL, "token", "create", "--credentials", str(path), "--name", name,
             "--role", "admin"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    with ThreadPoolExecutor(8) as pool:
        printed = list(pool.map(create, [f"racer{i}" for i in range(8)]))
    store = CredentialStore(path)
    assert [token for token in printed if store.authenticate(token) is None] == []
    assert len(store.records()) == 8
