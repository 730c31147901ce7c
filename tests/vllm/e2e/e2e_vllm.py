"""vLLM (CPU) with kvpool behind it, end to end, both ways (run by scripts/e2e_vllm.sh).

For each way, the same prompt twice, with a restart of every cache in between:

- ``tier``: vLLM's native offloading (``TieringOffloadingSpec``; on this CPU engine its
  variant ``kvpool.vllm.KVPoolCPUTieringSpec``) with kvpool's tier (``kvpool.vllm``) as its
  secondary tier. The engine is restarted, which empties its KV cache
  and its CPU primary tier.
- ``lmcache``: vLLM's ``LMCacheMPConnector`` to an LMCache multiprocess server whose L2 adapter
  is kvpool's (``kvpool.lmcache``). The LMCache server (its L1) and the engine are restarted.

vLLM's own prefix caching is off, so a cached token can only come from outside the engine.
The first run of each way finds nothing (0 cached tokens) and computes the whole prompt: it is
the run without any cache. The second must report the prompt's full blocks as cached
(``usage.prompt_tokens_details.cached_tokens``, and vLLM's ``external_prefix_cache_hits``
metric), kvpool must have served them (the master counted the located chunks, and for the
tier the tier's own count of chunks loaded), and its output tokens must equal the first
run's. The model is a tiny random Llama made here (``tiny_model.py``); the kvpool cluster a
local one (``kvpool.local_cluster``, secure: TLS and a token, passed in the configuration).

Prints one line per check and ``E2E OK`` at the end; exits 1 at the first failed check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tiny_model import build, prompt_ids

from kvpool import Client
from kvpool.etcd_process import free_ports
from kvpool.local_cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[3]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
LMCACHE = ROOT / ".venv" / "bin" / "lmcache"
BLOCK = 128
PROMPT_TOKENS = 600
MAX_TOKENS = 12
#: Starting an engine imports vLLM, loads the model and profiles memory: ~21 s on an idle
#: 2-core machine, much more on a busy one.
START_TIMEOUT = 600.0


class Failed(SystemExit):
    def __init__(self, message: str) -> None:
        print(f"FAIL: {message}", flush=True)
        super().__init__(1)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)
    print(f"ok: {message}", flush=True)


def free_port() -> int:
    """A free port below the kernel's ephemeral range (``free_ports``): the LMCache server
    is started again on its port, which a connection made meanwhile once took ("Address
    already in use")."""
    (port,) = free_ports(1)
    return port


def http(url: str, body: dict | None = None, timeout: float = 120.0) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        raise Failed(f"{url}: {error.code} {error.read()[:2000]!r}") from None


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(r"([^{ ]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


class Process:
    """A child process with its log; stopped with SIGINT, then SIGKILL."""

    #: Every process started, stopped at exit whatever happened.
    started: list[Process] = []

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        self._file = log.open("w")
        self.popen = subprocess.Popen(
            argv, stdout=self._file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        Process.started.append(self)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_http(self, url: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise Failed(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
            try:
                http(url, timeout=5)
                return
            except OSError:
                time.sleep(1)
        raise Failed(f"{self.name} not up within {timeout} s:\n{self.tail()}")

    def wait_port(self, port: int, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise Failed(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                return
            except OSError:
                time.sleep(1)
        raise Failed(f"{self.name} not listening within {timeout} s:\n{self.tail()}")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGINT to the process (it stops its own children), then SIGKILL to them all."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # whatever it left behind
        if not self._file.closed:
            self._file.close()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])


class Engine(Process):
    """vLLM's OpenAI-compatible server on the tiny model, prefix caching off."""

    def __init__(self, work: Path, name: str, model: Path, extra: list[str]) -> None:
        self.port = free_port()
        argv = [
            str(VLLM_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--port",
            str(self.port),
            "--block-size",
            str(BLOCK),
            "--max-model-len",
            "2048",
            "--no-enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--enforce-eager",
            # stopped gracefully: the scheduler shuts its offloading tiers down (and the kvpool
            # tier logs what it did)
            "--shutdown-timeout",
            "30",
            *extra,
        ]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
        for variable in ("KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE", "KVPOOL_TLS_CA", "KVPOOL_MASTER"):
            env.pop(variable, None)  # the configuration carries them, as a user's would
        print(f"starting {name} ...", flush=True)
        started = time.monotonic()
        super().__init__(name, argv, work / f"{name}.log", env)
        self.wait_http(f"http://127.0.0.1:{self.port}/health")
        print(f"{name} up in {time.monotonic() - started:.0f} s", flush=True)

    def complete(self, text: list[int], model: Path) -> dict:
        body = {
            "model": str(model),
            "prompt": text,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "return_token_ids": True,
        }
        answer = json.loads(http(f"http://127.0.0.1:{self.port}/v1/completions", body))
        usage = answer["usage"]
        details = usage.get("prompt_tokens_details") or {}
        return {
            "output": answer["choices"][0]["token_ids"],
            "text": answer["choices"][0]["text"],
            "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": details.get("cached_tokens") or 0,
        }

    def metrics(self) -> str:
        return http(f"http://127.0.0.1:{self.port}/metrics").decode()


def kvpool_chunks(client: Client, prefix: str) -> int:
    return len(client.list_keys(prefix, limit=1000).keys)


def located(cluster: LocalCluster) -> float:
    """Chunks the master located for readers so far (GetReplicas, found)."""
    text = http(f"http://127.0.0.1:{cluster.master_http_port}/metrics").decode()
    return metric(text, "kvpool_master_keys_total", method="GetReplicas", status="ok")


def wait_for_chunks(client: Client, prefix: str, count: int, timeout: float = 120.0) -> int:
    """Stores run after the request, asynchronously: wait until kvpool holds them."""
    deadline = time.monotonic() + timeout
    while (held := kvpool_chunks(client, prefix)) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    return held


def run_twice(way: str, start, cluster: LocalCluster, client: Client, prefix: str, text: list[int]):
    """Cold run (nothing cached anywhere), restart of every cache, warm run; the checks."""
    engine = start("cold")
    cold = engine.complete(text, MODEL)
    blocks = (cold["prompt_tokens"] - 1) // BLOCK
    check(blocks >= 2, f"{way}: the prompt has {cold['prompt_tokens']} tokens, {blocks} blocks")
    check(cold["cached_tokens"] == 0, f"{way}: cold run found nothing cached")
    held = wait_for_chunks(client, prefix, blocks)
    check(held >= blocks, f"{way}: kvpool holds the prompt's {blocks} blocks ({held} chunks)")
    engine.stop()
    before = located(cluster)
    engine = start("warm")
    warm = engine.complete(text, MODEL)
    warm["metrics"] = engine.metrics()
    (engine.log.parent / f"{engine.name}.metrics").write_text(warm["metrics"])
    hits = metric(warm["metrics"], "vllm:external_prefix_cache_hits_total")
    engine.stop()
    served = located(cluster) - before
    check(
        warm["cached_tokens"] == blocks * BLOCK,
        f"{way}: warm run: {warm['cached_tokens']} of {warm['prompt_tokens']} prompt tokens "
        f"cached (expected {blocks * BLOCK}); vLLM external_prefix_cache_hits {hits:.0f}",
    )
    check(hits >= blocks * BLOCK, f"{way}: vLLM counted {hits:.0f} external hit tokens")
    check(served >= blocks, f"{way}: the kvpool master located {served:.0f} chunks for readers")
    check(
        warm["output"] == cold["output"],
        f"{way}: warm output equals the uncached run's: {warm['output']}",
    )
    return cold, warm, engine


MODEL = Path()


def tier_way(work: Path, cluster: LocalCluster, client: Client, text: list[int]) -> dict:
    credentials = cluster.client_credentials()
    tier = {
        "type": "KVPoolTierManager",
        "module_path": "kvpool.vllm",
        "master": cluster.master_address,
        "token": credentials["token"],
        "tls_ca": credentials["tls_ca"],
        "key_prefix": "e2e-tier",
    }
    # vLLM's TieringOffloadingSpec on a GPU engine; on this CPU engine kvpool's variant of it
    config = {
        "kv_connector_extra_config": {
            "spec_name": "KVPoolCPUTieringSpec",
            "spec_module_path": "kvpool.vllm",
            "secondary_tiers": [tier],
        }
    }
    extra = [
        "--kv-offloading-backend",
        "native",
        "--kv-offloading-size",
        "0.0625",
        "--kv-transfer-config",
        json.dumps(config),
    ]

    def start(run: str) -> Engine:
        return Engine(work, f"tier-{run}", MODEL, extra)

    cold, warm, _ = run_twice("tier", start, cluster, client, "e2e-tier/", text)
    # vLLM's own account of the tier: the bytes its load jobs reported moving into the
    # primary tier (the tier sums what kvpool's gets wrote into the slots)
    read = metric(warm["metrics"], "vllm:kv_offload_tiering_read_bytes_total")
    blocks = (warm["prompt_tokens"] - 1) // BLOCK
    check(
        read > 0 and read % blocks == 0,
        f"tier: vLLM counted {read:.0f} bytes read from the kvpool tier "
        f"({blocks} chunks of {read / blocks:.0f} bytes)",
    )
    return cold


def lmcache_way(work: Path, cluster: LocalCluster, client: Client, text: list[int]) -> dict:
    credentials = cluster.client_credentials()
    adapter = {
        "type": "plugin",
        "module_path": "kvpool.lmcache",
        "class_name": "KVPoolL2Adapter",
        "adapter_params": {
            "master": cluster.master_address,
            "token": credentials["token"],
            "tls_ca": credentials["tls_ca"],
            "key_prefix": "e2e-lmcache/",
        },
    }
    port = free_port()
    servers: list[Process] = []

    def start(run: str) -> Engine:
        for server in servers:
            server.stop()  # its L1 goes with it
        argv = [
            str(LMCACHE),
            "server",
            "--host",
            "localhost",
            "--port",
            str(port),
            "--chunk-size",
            str(BLOCK),
            "--eviction-policy",
            "LRU",
            # vLLM's connector on a CPU engine copies KV itself (engine-driven transfers);
            # the server's default accepts only transfers it drives
            "--supported-transfer-mode",
            "auto",
            "--l1-size-gb",
            "1",
            "--l1-init-size-gb",
            "1",
            "--l2-adapter",
            json.dumps(adapter),
            "--http-port",
            str(free_port()),
            "--prometheus-port",
            str(free_port()),
        ]
        env = {**os.environ, "LMCACHE_DISABLE_BANNER": "1"}
        server = Process(f"lmcache-{run}", argv, work / f"lmcache-{run}.log", env)
        servers.append(server)
        server.wait_port(port)
        connector = {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "lmcache.mp.host": "tcp://localhost",
                "lmcache.mp.port": port,
            },
        }
        extra = ["--kv-transfer-config", json.dumps(connector)]
        return Engine(work, f"lmcache-engine-{run}", MODEL, extra)

    try:
        cold, _, _ = run_twice("lmcache", start, cluster, client, "e2e-lmcache/", text)
        l2 = re.findall(r"\((\d+) L1, (\d+) L2\)", servers[-1].text())
        check(
            any(int(m[1]) > 0 for m in l2),
            f"lmcache: the restarted server prefetched from L2 (kvpool): {l2}",
        )
    finally:
        for server in servers:
            server.stop()
    return cold


def main() -> int:
    global MODEL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--ways", default="tier,lmcache")
    args = parser.parse_args()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    MODEL = build(work / "model")
    text = prompt_ids(PROMPT_TOKENS, seed=3)
    colds = []
    shutil.rmtree(work / "cluster", ignore_errors=True)  # (a rerun in the same folder)
    try:
        with (
            LocalCluster(2, "256MiB", run_dir=work / "cluster") as cluster,
            Client(cluster.master_address, **cluster.client_credentials()) as client,
        ):
            for way in args.ways.split(","):
                run = {"tier": tier_way, "lmcache": lmcache_way}[way]
                colds.append(run(work, cluster, client, text))
    finally:
        for process in reversed(Process.started):
            process.stop()
    if len(colds) == 2:
        check(colds[0]["output"] == colds[1]["output"], "both ways' uncached runs agree")
    print(f"E2E OK ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
