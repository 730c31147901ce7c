"""Real LMCache 0.5.6 with kvpool as its L2: the StorageManager (L1 -> L2 -> L1), LMCache's own
adapter check, and ``lmcache server`` reporting the adapter healthy."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch
from lmcache.v1.distributed.api import (
    GroupedObjectKeys,
    MemoryLayoutDesc,
    PrefetchTaskSpec,
)
from lmcache.v1.distributed.config import parse_args
from lmcache.v1.distributed.storage_manager import StorageManager
from lmcache_support import object_keys, plugin_spec

from kvpool.lmcache import KVPoolL2Adapter

WAIT_S = 20.0


def _until(predicate, timeout: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_storage_manager_stores_to_kvpool_and_prefetches_back(lm_cluster):
    config = parse_args(
        [
            "--l1-size-gb",
            "0.0625",
            "--no-l1-use-lazy",
            "--eviction-policy",
            "LRU",
            "--l2-adapter",
            plugin_spec(lm_cluster.master_address),
        ]
    )
    manager = StorageManager(config)
    try:
        (adapter,) = [a for _, _, a in manager._snapshot_adapters()]
        assert isinstance(adapter, KVPoolL2Adapter)
        assert adapter.report_status()["l1_registered_bytes"] == manager.l1_memory_desc.size

        # 8 chunks of 2 x 64K bf16 (256 KiB each), as an engine would write them into L1
        layout = MemoryLayoutDesc(shapes=[torch.Size([2, 65536])], dtypes=[torch.bfloat16])
        keys = object_keys(8)
        reserved = manager.reserve_write(keys, layout)
        assert set(reserved) == set(keys)
        expected = {}
        for i, key in enumerate(keys):
            data = torch.randn(2, 65536, generator=torch.Generator().manual_seed(i))
            reserved[key].tensor.copy_(data.to(torch.bfloat16))
            expected[key] = reserved[key].tensor.clone()
        manager.finish_write(keys)

        # the store controller pushes every chunk to kvpool
        _until(lambda: adapter.stats.stored_keys == 8, what="the L2 store")
        # the store controller releases its L1 read locks after the result: until then a
        # (non-forced) delete skips the chunks it still holds; deleting is idempotent
        deleted = [0]

        def all_deleted() -> bool:
            deleted[0] += manager.delete_l1_keys(keys)[0]
            return deleted[0] == 8

        _until(all_deleted, what="the L1 read locks' release")

        handle = manager.submit_prefetch_task(
            PrefetchTaskSpec(
                key_groups=[GroupedObjectKeys(keys=keys, object_group_id=0, layout_desc=layout)]
            )
        )
        assert manager.wait_prefetch_status(handle, WAIT_S)
        result = manager.query_prefetch_status(handle)
        assert result.l2_hit_count == 8
        assert result.l1_hit_count == 0
        with manager.read_prefetched_results(keys, result.l1_owners) as objects:
            assert objects is not None
            for key, obj in zip(keys, objects, strict=True):
                assert torch.equal(obj.tensor, expected[key])
        manager.finish_read_prefetched(keys, l1_owners=result.l1_owners)
        assert adapter.report_status()["locked_keys"] == 0
        assert adapter.report_status()["unregistered_buffers"] == 0
    finally:
        manager.close()
    assert adapter.closed


def test_lmcache_basic_check_of_the_adapter_passes(lm_cluster, lmcache_env):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "lmcache.v1.basic_check",
            "--mode",
            "test_l2_adapter",
            "--num-keys",
            "8",
            "--l2-adapter",
            plugin_spec(lm_cluster.master_address),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=lmcache_env,
    )
    out = completed.stdout
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "Testing L2 adapter #0 (KVPoolL2Adapter)" in out, out + completed.stderr[-3000:]
    assert "Test Failed" not in out, out
    assert "Validation: 8/8 correctly absent" in out, out
    assert "Batch store OK" in out, out
    assert "Validation: 8/8 found" in out, out
    assert "Validation (loaded): 8/8" in out, out
    assert "Validation (content): 8/8" in out, out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _lmcache_command() -> list[str]:
    script = Path(sys.executable).with_name("lmcache")
    if script.exists():
        return [str(script)]
    found = shutil.which("lmcache")
    return [found] if found else [sys.executable, "-m", "lmcache.cli.main"]


def test_lmcache_server_reports_the_kvpool_adapter_healthy(lm_cluster, lmcache_env, tmp_path):
    http_port = _free_port()
    log_path = tmp_path / "lmcache-server.log"
    command = [
        *_lmcache_command(),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(_free_port()),
        "--http-port",
        str(http_port),
        "--prometheus-port",
        str(_free_port()),
        "--disable-metrics",
        "--l1-size-gb",
        "0.0625",
        "--eviction-policy",
        "LRU",
        "--l2-adapter",
        plugin_spec(lm_cluster.master_address),
    ]
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=lmcache_env, start_new_session=True
        )
    try:
        status = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status", timeout=5) as r:
                    status = json.loads(r.read())
                break
            except OSError:
                time.sleep(0.3)
        assert status is not None, log_path.read_text(errors="replace")[-5000:]
        adapters = status["storage_manager"]["l2_adapters"]
        assert [a["type"] for a in adapters] == ["KVPoolL2Adapter"]
        assert adapters[0]["is_healthy"] is True
        assert adapters[0]["master"] == lm_cluster.master_address
        assert adapters[0]["storage_nodes"] == 2
        assert status["is_healthy"] is True
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck", timeout=5) as r:
            assert json.loads(r.read())["status"] == "healthy"
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
