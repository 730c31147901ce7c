"""kvpool's side of ``kvpool bench --compare``: its servers, and its client as a runner.

``KvpoolServers`` starts a master and one storage node on the server side of a placement;
``client_argv`` is the command of a client runner on the client side. Run as a script, this
file is that runner: ``kvpool.Client`` with one registered arena, put/get/exists as an
inference engine would call them (single keys through ``put``/``get_into``, batches through
``put_many``/``get_into_many``/``exists_many``).

Placements that must not share memory (``tcp_only``) force UCX onto TCP in both the node
(``UCX_TLS`` in its environment) and the client (``ucx_config``), and keep the client from
mapping the node's memory (``same_host_mapping=False``): two namespaces of one machine still
share its memory, two hosts would not.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class KvpoolServers:
    """A kvpool master and one storage node of ``dram`` bytes; a context manager."""

    def __init__(self, placement: Any, run_dir: Path, dram: str, env: dict[str, str]) -> None:
        self.placement = placement
        self.run_dir = run_dir
        self.dram = dram
        self.env = {**env, "UCX_TLS": "tcp"} if placement.tcp_only else dict(env)
        self.master: Any = None
        self.node: Any = None
        self.address = ""

    def __enter__(self) -> KvpoolServers:
        from kvpool.local_cluster import ManagedProcess

        ip = self.placement.server_ip
        kvpool = [*self.placement.server_prefix, sys.executable, "-m", "kvpool.cli.main"]
        try:
            self.master = ManagedProcess(
                "kvpool-master",
                [*kvpool, "master", "--host", ip, "--port", "0", "--lane-port", "0",
                 "--http-port", "0", "--log-format", "json"],
                self.run_dir,
                self.env,
            )  # fmt: skip
            port = self.master.wait_ready(_deadline(60))["grpc_port"]
            self.address = f"{ip}:{port}"
            self.node = ManagedProcess(
                "kvpool-node",
                [*kvpool, "node", "--master", self.address, "--dram", self.dram,
                 "--listen", ip, "--http-port", "0", "--node-id", "bench-node",
                 "--drain-timeout", "1", "--log-format", "json"],
                self.run_dir,
                self.env,
            )  # fmt: skip
            self.node.wait_ready(_deadline(120))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for process in (self.node, self.master):
            if process is not None:
                process.stop()

    @property
    def pids(self) -> dict[str, int]:
        return {"master": self.master.pid, "node": self.node.pid}

    def client_argv(self, lease_ttl: float = 0.0) -> list[str]:
        config = {"master": self.address, "tcp_only": self.placement.tcp_only}
        config["lease_ttl"] = lease_ttl  # 0: the master's default (10 s)
        return [
            *self.placement.client_prefix,
            sys.executable,
            str(HERE / "kvpool_runner.py"),
            json.dumps(config),
        ]


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds


class KvpoolStore:
    """The runner's store: one ``kvpool.Client``."""

    def __init__(self, config: dict) -> None:
        from kvpool import Client

        ucx = {"TLS": "tcp"} if config.get("tcp_only") else None
        self.client = Client(
            config["master"],
            replicas=1,
            timeout=60,
            lease_ttl=config.get("lease_ttl", 0.0),
            ucx_config=ucx,
            same_host_mapping=not config.get("tcp_only"),
        )
        self.region: Any = None

    def register(self, arena: Any) -> None:
        self.region = self.client.register_buffer(arena)

    def put(self, keys: list[str], views: list[Any], addresses: list[int]) -> None:
        if len(keys) == 1:
            self.client.put(keys[0], views[0])
        else:
            _raise_first(self.client.put_many(list(zip(keys, views, strict=True))))

    def get(self, keys: list[str], views: list[Any], addresses: list[int]) -> None:
        if len(keys) == 1:
            self.client.get_into(keys[0], views[0])
        else:
            _raise_first(self.client.get_into_many(keys, views))

    def exists(self, keys: list[str]) -> int:
        # a pure existence check, as Mooncake's batch_is_exist: no read lease
        return sum(1 for found in self.client.exists_many(keys, lease=False) if found is True)

    def remove(self, keys: list[str]) -> None:
        self.client.remove_many(keys, force=True)

    def close(self) -> None:
        if self.region is not None:
            self.client.unregister_buffer(self.region)
        self.client.close()


def _raise_first(results: list[Any]) -> None:
    for result in results:
        if isinstance(result, Exception):
            raise result


def main() -> int:
    import kvpool

    kvpool.tune_grpc()  # as a serving process would (and kvpool's own processes do)
    sys.path.insert(0, str(HERE))
    import workloads

    config = workloads.config_from_argv()
    return workloads.serve(lambda: KvpoolStore(config))


if __name__ == "__main__":
    sys.exit(main())
