"""Mooncake Store's side of ``kvpool bench --compare``: its servers, and its client as a runner.

Mooncake lives in its own virtualenv (``bench/setup_mooncake.sh`` makes ``.venv-mooncake``);
nothing here imports it outside that interpreter. The layout mirrors kvpool's:

- ``mooncake_master`` (from the wheel), on the server side;
- a *store peer*: a process whose ``setup()`` mounts a global segment of ``segment_size``
  bytes and lends no local buffer: it holds the memory, like a kvpool storage node;
- client runners: ``setup()`` with no global segment (so nothing is stored in the client's
  own memory), one registered arena, and the zero-copy API: ``put_from``/``get_into`` for
  single keys, ``batch_put_from``/``batch_get_into``/``batch_is_exist`` for batches.

Calls in flight (the ``32x4KiB-inflight`` workload): several threads of the runner share its
one store and call ``batch_put_from``/``batch_get_into`` at once (bench/workloads.py);
Mooncake's Python API has no coroutines.

Metadata through ``P2PHANDSHAKE`` (no etcd or HTTP metadata server), protocol ``tcp``, and
``MC_TCP_BIND_ADDRESS`` set to each process's own address.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOCAL_BUFFER = 16 * 1024 * 1024


def mooncake_python() -> Path:
    venv = os.environ.get("KVPOOL_BENCH_MOONCAKE_VENV") or HERE.parent / ".venv-mooncake"
    return Path(venv) / "bin" / "python"


def mooncake_available() -> str | None:
    """None when Mooncake is installed for the benchmark, else what to do about it."""
    if not mooncake_python().exists():
        return f"no {mooncake_python()}: run bench/setup_mooncake.sh"
    return None


def mooncake_version() -> str:
    import subprocess

    done = subprocess.run(
        [str(mooncake_python()), "-m", "pip", "show", "mooncake-transfer-engine-non-cuda"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


class MooncakeServers:
    """``mooncake_master`` and one store peer; a context manager."""

    def __init__(self, placement: Any, run_dir: Path, segment_size: int, env: dict) -> None:
        self.placement = placement
        self.run_dir = run_dir
        self.segment_size = segment_size
        self.env = env
        self.master: Any = None
        self.peer: Any = None
        self.address = ""

    def __enter__(self) -> MooncakeServers:
        from bench.processes import RunnerProcess, ServerProcess, free_port

        ip = self.placement.server_ip
        rpc_port, metrics_port = free_port(), free_port()
        self.address = f"{ip}:{rpc_port}"
        binary = mooncake_python().parent / "mooncake_master"
        try:
            self.master = ServerProcess(
                "mooncake-master",
                [*self.placement.server_prefix, str(binary), f"--rpc_port={rpc_port}",
                 f"--metrics_port={metrics_port}", "--enable_http_metadata_server=false"],
                self.run_dir / "mooncake-master.log",
                self.env,
            )  # fmt: skip
            config = {
                "role": "peer",
                "master": self.address,
                "hostname": ip,
                "segment_size": self.segment_size,
            }
            self.peer = RunnerProcess(
                "mooncake-peer",
                [*self.placement.server_prefix, *self._script(config)],
                self.run_dir / "mooncake-peer.log",
                {**self.env, "MC_TCP_BIND_ADDRESS": ip},
            )
            self.peer.wait_ready(120)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for process in (self.peer, self.master):
            if process is not None:
                process.stop()

    @property
    def pids(self) -> dict[str, int]:
        return {"master": self.master.pid, "peer": self.peer.pid}

    def client_argv(self) -> list[str]:
        config = {"role": "client", "master": self.address, "hostname": self.placement.client_ip}
        return [*self.placement.client_prefix, *self._script(config)]

    def client_env(self) -> dict[str, str]:
        return {**self.env, "MC_TCP_BIND_ADDRESS": self.placement.client_ip}

    @staticmethod
    def _script(config: dict) -> list[str]:
        return [str(mooncake_python()), str(HERE / "mooncake_runner.py"), json.dumps(config)]


# ---------------------------------------------------------------- inside .venv-mooncake


def _setup(config: dict, segment_size: int, local_buffer: int) -> Any:
    from mooncake.store import MooncakeDistributedStore

    _wait_for_port(config["master"])
    store = MooncakeDistributedStore()
    status = store.setup(
        config["hostname"], "P2PHANDSHAKE", segment_size, local_buffer, "tcp", "", config["master"]
    )
    if status != 0:
        raise RuntimeError(f"MooncakeDistributedStore.setup returned {status}")
    return store


def _wait_for_port(address: str, timeout: float = 60.0) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class MooncakeStore:
    """The runner's store: a ``MooncakeDistributedStore`` that mounts no memory of its own."""

    def __init__(self, config: dict) -> None:
        self.store = _setup(config, 0, LOCAL_BUFFER)

    def register(self, arena: Any) -> None:
        status = self.store.register_buffer(int(arena.ctypes.data), int(arena.nbytes))
        if status != 0:
            raise RuntimeError(f"register_buffer returned {status}")

    def put(self, keys: list[str], views: list[Any], addresses: list[int]) -> None:
        size = views[0].nbytes
        if len(keys) == 1:
            status = self.store.put_from(keys[0], addresses[0], size)
            if status != 0:
                raise RuntimeError(f"put_from({keys[0]!r}) returned {status}")
        else:
            statuses = self.store.batch_put_from(keys, addresses, [size] * len(keys))
            _check(keys, statuses, 0)

    def get(self, keys: list[str], views: list[Any], addresses: list[int]) -> None:
        size = views[0].nbytes
        if len(keys) == 1:
            read = self.store.get_into(keys[0], addresses[0], size)
            if read != size:
                raise RuntimeError(f"get_into({keys[0]!r}) returned {read}, expected {size}")
        else:
            _check(keys, self.store.batch_get_into(keys, addresses, [size] * len(keys)), size)

    def exists(self, keys: list[str]) -> int:
        return sum(1 for found in self.store.batch_is_exist(keys) if found == 1)

    def remove(self, keys: list[str]) -> None:
        self.store.batch_remove(keys, True)

    def close(self) -> None:
        self.store.close()


def _check(keys: list[str], statuses: list[int], expected: int) -> None:
    for key, status in zip(keys, statuses, strict=True):
        if status != expected:
            raise RuntimeError(f"{key!r}: Mooncake returned {status}, expected {expected}")


def _run_peer(config: dict) -> int:
    store = _setup(config, config["segment_size"], 0)
    print("@@ " + json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:  # hold the segment until told to quit or the orchestrator is gone
        if json.loads(line).get("op") == "quit":
            break
    store.close()
    return 0


def main() -> int:
    sys.path.insert(0, str(HERE))
    import workloads

    config = workloads.config_from_argv()
    if config.get("role") == "peer":
        return _run_peer(config)
    return workloads.serve(lambda: MooncakeStore(config))


if __name__ == "__main__":
    sys.exit(main())
