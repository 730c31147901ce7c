"""kvpool's side of ``kvpool bench --compare``: its servers, and its client as a runner.

``KvpoolServers`` starts a master and one storage node on the server side of a placement;
``client_argv`` is the command of a client runner on the client side. Run as a script, this
file is that runner: ``kvpool.Client`` with one registered arena, put/get/exists as an
inference engine would call them (single keys through ``put``/``get_into``, batches through
``put_many``/``get_into_many``/``exists_many``). Calls in flight (bench/workloads.py) share
that one ``Client`` from several threads, or go through one ``kvpool.aio.AsyncClient`` (made
on first use, with the same settings and the arena registered with it too).

Placements that must not share memory (``tcp_only``) force UCX onto TCP in both the node
(``UCX_TLS`` in its environment) and the client (``ucx_config``), and keep the client from
mapping the node's memory (``same_host_mapping=False``): two namespaces of one machine still
share its memory, two hosts would not.

Secure by default, as kvpool runs by default: TLS on the master's gRPC port and lane, a token
for the node and one for the clients (``KvpoolServers(secure=False)``: everything
``--insecure``, for ``kvpool bench --compare --security insecure|both``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


#: What a process of the benchmark may inherit that would make it someone else's caller (the
#: test session exports a client's token and CA): every kvpool process gets its own, or none.
CALLER_ENV = (
    "KVPOOL_TOKEN",
    "KVPOOL_TOKEN_FILE",
    "KVPOOL_TLS_CA",
    "KVPOOL_TLS_CERT",
    "KVPOOL_TLS_KEY",
)
NODE_ID = "bench-node"
SECURITY_MODES = ("secure", "insecure")
#: The clients' identity and tenant on a secure cluster.
CLIENT_NAME, TENANT = "bench-client", "bench"


def _without_callers(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in CALLER_ENV}


class KvpoolServers:
    """A kvpool master and one storage node of ``dram`` bytes; a context manager.

    Secure (the default, as a deployment runs): a throwaway CA whose server certificate names
    every address of the placement, a credentials file with a token for the node (bound to
    its node id) and one for the clients; the master serves TLS and checks tokens on gRPC and
    the lane, the node and the clients present their token over TLS. ``secure=False`` starts
    master and node ``--insecure`` and gives clients no credentials.
    """

    def __init__(
        self,
        placement: Any,
        run_dir: Path,
        dram: str,
        env: dict[str, str],
        *,
        secure: bool = True,
        name: str = "kvpool",
    ) -> None:
        self.placement = placement
        self.run_dir = run_dir
        self.dram = dram
        self.secure = secure
        self.name = name
        self.base_env = _without_callers(env)
        self.env = {**self.base_env, "UCX_TLS": "tcp"} if placement.tcp_only else self.base_env
        self.master: Any = None
        self.node: Any = None
        self.address = ""
        self._secrets: tempfile.TemporaryDirectory[str] | None = None
        self.pki: Any = None
        self.credentials = Path()
        self.ca = ""
        self.node_token = ""
        self.client_token = ""

    @property
    def security(self) -> str:
        return "secure" if self.secure else "insecure"

    def _prepare_credentials(self) -> None:
        """The CA, the master's certificate and the tokens, in a private folder (removed on
        exit); namespaces share the file system, so every side reads the same files."""
        from kvpool.security.dev_pki import make_dev_pki
        from kvpool.security.identity import Role
        from kvpool.security.tokens import CredentialStore, new_token

        self._secrets = tempfile.TemporaryDirectory(prefix=f"{self.name}-secrets-")
        folder = Path(self._secrets.name)
        hosts = dict.fromkeys(
            (self.placement.server_ip, self.placement.client_ip, "127.0.0.1", "localhost")
        )
        self.pki = make_dev_pki(folder / "pki", hosts=tuple(hosts))
        self.ca = str(self.pki.ca)
        self.credentials = folder / "credentials.json"
        store = CredentialStore.create(self.credentials)
        self.node_token, record = new_token(NODE_ID, Role.NODE, node_id=NODE_ID)
        store.add(record)
        self.client_token, record = new_token(CLIENT_NAME, Role.CLIENT, tenant=TENANT)
        store.add(record)

    def _master_security_args(self) -> list[str]:
        if not self.secure:
            return ["--insecure"]
        return [
            "--tls-cert", str(self.pki.server_cert), "--tls-key", str(self.pki.server_key),
            "--tls-client-ca", self.ca, "--credentials", str(self.credentials),
            # (the clients may map the node's memory where they share its host: it holds
            # their tenant's objects alone, see the node's --tenant)
            "--same-host-clients", CLIENT_NAME,
        ]  # fmt: skip

    def _node_env(self) -> dict[str, str]:
        if not self.secure:
            return self.env
        return {**self.env, "KVPOOL_TOKEN": self.node_token, "KVPOOL_TLS_CA": self.ca}

    def __enter__(self) -> KvpoolServers:
        from kvpool.local_cluster import ManagedProcess

        ip = self.placement.server_ip
        kvpool = [*self.placement.server_prefix, sys.executable, "-m", "kvpool.cli.main"]
        try:
            if self.secure:
                self._prepare_credentials()
            self.master = ManagedProcess(
                f"{self.name}-master",
                [*kvpool, "master", "--host", ip, "--port", "0", "--lane-port", "0",
                 "--http-port", "0", "--log-format", "json", *self._master_security_args()],
                self.run_dir,
                self.env,
            )  # fmt: skip
            port = self.master.wait_ready(_deadline(60))["grpc_port"]
            self.address = f"{ip}:{port}"
            self.node = ManagedProcess(
                f"{self.name}-node",
                [*kvpool, "node", "--master", self.address, "--dram", self.dram,
                 "--listen", ip, "--http-port", "0", "--node-id", NODE_ID,
                 "--drain-timeout", "1", "--log-format", "json",
                 *(["--tenant", TENANT] if self.secure else ["--insecure"]),
                 *(["--ucx-tcp"] if self.placement.tcp_only else [])],
                self.run_dir,
                self._node_env(),
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
        if self._secrets is not None:
            self._secrets.cleanup()
            self._secrets = None

    @property
    def pids(self) -> dict[str, int]:
        return {"master": self.master.pid, "node": self.node.pid}

    def client_argv(self, lease_ttl: float = 0.0) -> list[str]:
        config: dict[str, Any] = {"master": self.address, "tcp_only": self.placement.tcp_only}
        config["lease_ttl"] = lease_ttl  # 0: the master's default (10 s)
        config["tls_ca"] = self.ca if self.secure else None
        return [
            *self.placement.client_prefix,
            sys.executable,
            str(HERE / "kvpool_runner.py"),
            json.dumps(config),
        ]

    def client_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` made the environment of this cluster's client runner: the client's token
        (kept out of the command line, which any user may read), or no credentials at all."""
        env = _without_callers(env)
        return {**env, "KVPOOL_TOKEN": self.client_token} if self.secure else env


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds


#: Calls an AsyncClient of the runner runs at once at most (a phase may ask for fewer).
ASYNC_THREADS = 16


class KvpoolStore:
    """The runner's store: one ``kvpool.Client`` (and one ``AsyncClient`` once asked for)."""

    def __init__(self, config: dict) -> None:
        from kvpool import Client

        ucx = {"TLS": "tcp"} if config.get("tcp_only") else None
        # A secure cluster's runner has its token in KVPOOL_TOKEN and the CA in its config;
        # an insecure one has neither.
        self.options: dict[str, Any] = {
            "token": os.environ.get("KVPOOL_TOKEN") or None,
            "tls_ca": config.get("tls_ca"),
            "replicas": 1,
            "timeout": 60,
            "lease_ttl": config.get("lease_ttl", 0.0),
            "ucx_config": ucx,
            "same_host_mapping": not config.get("tcp_only"),
        }
        self.master = config["master"]
        self.client = Client(self.master, **self.options)
        self.region: Any = None
        self.arena: Any = None
        self.aclient: Any = None
        self.aregion: Any = None

    def register(self, arena: Any) -> None:
        self.arena = arena
        self.region = self.client.register_buffer(arena)

    async def aopen(self) -> None:
        if self.aclient is None:
            from kvpool.aio import AsyncClient

            self.aclient = AsyncClient(self.master, threads=ASYNC_THREADS, **self.options)
            self.aregion = await self.aclient.register_buffer(self.arena)

    async def aput(self, keys: list[str], views: list[Any], addresses: list[int]) -> None:
        _raise_first(await self.aclient.put_many(list(zip(keys, views, strict=True))))

    async def aget(self, keys: list[str], views: list[Any], addresses: list[int]) -> None:
        _raise_first(await self.aclient.get_into_many(keys, views))

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
        if self.aclient is not None:
            asyncio.run(self._close_async())
        if self.region is not None:
            self.client.unregister_buffer(self.region)
        self.client.close()

    async def _close_async(self) -> None:
        if self.aregion is not None:
            await self.aclient.unregister_buffer(self.aregion)
        await self.aclient.close()


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
