"""A whole kvpool cluster on this machine: one master and N storage nodes as child processes.

Used by ``kvpool up``, ``kvpool bench`` and the test suite. Every process is a real
``kvpool master`` / ``kvpool node``; readiness is learned from the ready files they write.

Secure unless told otherwise: the cluster makes a throwaway CA (the master serves TLS with
a certificate it signs), a credentials file with an admin token, a client token per tenant
asked for and a token per node, bound to its node id. ``client_env()`` is what a client of
the cluster needs in its environment; ``secure=False`` runs everything ``--insecure``.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from kvpool.security.dev_pki import DevPki
    from kvpool.security.tokens import CredentialStore, TokenRecord

#: The tenant of the client token every secure local cluster makes.
DEFAULT_TENANT = "default"


class ClusterError(RuntimeError):
    pass


def _die_with_parent() -> None:
    """In the child: ask Linux for SIGTERM when the process that started us dies, so that a
    test run killed midway leaves no masters or nodes behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Site:
    """Where one process of a cluster runs: ``prefix`` starts it there (``nsenter
    --net=/run/netns/NAME``: a network namespace of its own), ``host`` is the address it
    listens on and is reached at. A site with a prefix has its network to itself, so a
    master there takes kvpool's default ports and advertises ``host`` (its peers' hints must
    name an address they can reach, not the machine's host name)."""

    host: str = "127.0.0.1"
    prefix: tuple[str, ...] = ()


def _all_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T or t), or the process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = [
            Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0]
            for task in tasks
        ]
    except (OSError, IndexError):
        return True
    return all(state in ("T", "t") for state in states)


class ManagedProcess:
    """A child process with its log file and ready file."""

    #: The address it listens on (its ``Site``'s host).
    host: str = "127.0.0.1"

    def __init__(self, name: str, argv: list[str], run_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.ready: dict = {}
        self.ready_file = run_dir / f"{name}.ready.json"
        self.log_path = run_dir / f"{name}.log"
        self.ready_file.unlink(missing_ok=True)
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            [*argv, "--ready-file", str(self.ready_file)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_ready(self, deadline: float) -> dict:
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                return json.loads(self.ready_file.read_text())
            if not self.alive():
                raise ClusterError(
                    f"{self.name} exited with {self.popen.returncode} before it was ready:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.02)
        raise ClusterError(f"{self.name} not ready in time:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, sig: int, timeout: float = 5.0) -> None:
        """Sends ``sig``. A SIGSTOP returns once every thread of the process has stopped
        (each stops on its own next way back to user space): a test that stops a node and
        then calls it must not race the stop."""
        if not self.alive():
            return
        os.kill(self.popen.pid, sig)
        if sig == signal.SIGSTOP:
            deadline = time.monotonic() + timeout
            while not _all_stopped(self.popen.pid) and time.monotonic() < deadline:
                time.sleep(0.001)

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up (a crash)."""
        if self.alive():
            self.popen.kill()
            self.popen.wait()
        self._log.close()

    def restart(self, deadline: float | None = None) -> dict:
        """Starts the same command again (after ``kill`` or ``stop``); waits until ready."""
        self.__init__(self.name, self.argv, self.ready_file.parent, self.env)  # type: ignore[misc]
        self.ready = self.wait_ready(deadline or time.monotonic() + 60)
        return self.ready


class LocalCluster:
    """Master plus ``nodes`` storage nodes on 127.0.0.1; a context manager.

    With ``etcd`` (an etcd HOST:PORT), ``masters`` masters elect a leader through it, and
    nodes and clients find the leader with ``etcd://HOST:PORT/<cluster name>``; with
    ``etcd_tls`` (etcd serves https and asks for client certificates) they are given the
    masters' addresses and follow the leader's hints.
    """

    #: A CA and tokens every secure cluster this process starts shares, when set (the test
    #: session sets them, so that the one client token and CA in its environment reach every
    #: cluster it starts).
    shared_pki: ClassVar[DevPki | None] = None
    shared_tokens: ClassVar[tuple[TokenRecord, ...]] = ()

    def __init__(
        self,
        nodes: int = 2,
        dram: str = "1GiB",
        *,
        master_args: Sequence[str] = (),
        node_args: Sequence[str] = (),
        run_dir: str | Path | None = None,
        port: int = 0,
        env: dict[str, str] | None = None,
        log_format: str = "json",
        masters: int = 1,
        etcd: str | None = None,
        name: str = "kvpool",
        secure: bool = True,
        pki: DevPki | None = None,
        tenants: Sequence[str] = (DEFAULT_TENANT,),
        tokens: Sequence[TokenRecord] = (),
        etcd_tls: bool = False,
        sites: Callable[[str], Site] | None = None,
        same_host: bool = True,
    ) -> None:
        if masters > 1 and not etcd:
            raise ValueError("several masters need etcd to elect a leader")
        self.master_count = masters
        self.etcd = etcd
        self.name = name
        self.masters: list[ManagedProcess] = []
        self.node_count = nodes
        self.dram = dram
        self.master_args = list(master_args)
        self.node_args = list(node_args)
        self.port = port
        self._own_run_dir = run_dir is None
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="kvpool-"))
        # (private when made here: the logs may name keys, which are as sensitive as prompts)
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.env = {**os.environ, **(env or {})}
        self.log_format = log_format
        self.master: ManagedProcess | None = None
        self.nodes: list[ManagedProcess] = []
        self.master_address = ""
        self.master_http_port = 0
        self.lane_port = 0
        self.secure = secure
        #: The throwaway CA and the master's certificate (secure clusters).
        self.pki = pki or LocalCluster.shared_pki
        self._tenants = tuple(tenants)
        self._extra_tokens = (*LocalCluster.shared_tokens, *tokens)
        #: etcd serves https with client certificates (given ``etcd``): masters use the CA's
        #: server certificate, which is also a client certificate.
        self.etcd_tls = etcd_tls
        self._credentials: CredentialStore | None = None
        #: Tokens made for this cluster: "admin", and one per tenant asked for.
        self.admin_token = ""
        self.tenant_tokens: dict[str, str] = {}
        #: Where each process runs, by name (``master0``, ``node1``...): loopback by default.
        self.sites = sites or (lambda name: Site())
        #: Clients on this host map the nodes' memory where a secure cluster has one client
        #: tenant (see ``mapping_tenant``); insecure clusters map for everyone.
        self.same_host = same_host

    # ---- credentials

    def _prepare_credentials(self) -> None:
        if not self.secure or self._credentials is not None:
            return
        from kvpool.security.dev_pki import make_dev_pki
        from kvpool.security.identity import Role
        from kvpool.security.tokens import CredentialStore, new_token

        if self.pki is None:
            self.pki = make_dev_pki(self.run_dir / "pki")
        self._credentials = CredentialStore.create(self.run_dir / "credentials.json")
        for record in self._extra_tokens:
            self._credentials.add(record)
        self.admin_token, record = new_token("admin", Role.ADMIN)
        self._credentials.add(record)
        for tenant in self._tenants:
            token, record = new_token(f"{tenant}-client", Role.CLIENT, tenant=tenant)
            self._credentials.add(record)
            self.tenant_tokens[tenant] = token

    def _node_token(self, node_id: str) -> str:
        from kvpool.security.identity import Role
        from kvpool.security.tokens import new_token

        assert self._credentials is not None
        token, record = new_token(node_id, Role.NODE, node_id=node_id)
        self._credentials.add(record)
        return token

    def client_env(self, tenant: str = DEFAULT_TENANT) -> dict[str, str]:
        """The environment a client of this cluster needs (empty for an insecure one)."""
        if not self.secure:
            return {}
        assert self.pki is not None
        return {"KVPOOL_TOKEN": self.tenant_tokens[tenant], "KVPOOL_TLS_CA": str(self.pki.ca)}

    def export_client_env(self, tenant: str = DEFAULT_TENANT) -> None:
        """Makes this process (and the processes it starts) a client of ``tenant`` of this
        cluster: what a user's shell does with ``source client.env``."""
        os.environ.update(self.client_env(tenant))
        os.environ.pop("KVPOOL_TOKEN_FILE", None)

    def admin_env(self) -> dict[str, str]:
        """The environment of an admin of this cluster (`kvpool status`, across tenants)."""
        if not self.secure:
            return {}
        assert self.pki is not None
        return {"KVPOOL_TOKEN": self.admin_token, "KVPOOL_TLS_CA": str(self.pki.ca)}

    def client_credentials(self, tenant: str = DEFAULT_TENANT) -> dict[str, str]:
        """``Client(...)`` keyword arguments of a client of ``tenant``."""
        env = self.client_env(tenant)
        return {"token": env["KVPOOL_TOKEN"], "tls_ca": env["KVPOOL_TLS_CA"]} if env else {}

    @property
    def mapping_tenant(self) -> str:
        """The tenant whose objects alone the nodes hold (``--tenant``), so that its clients
        on this host map them (the master's ``--same-host-clients *``): the one client
        tenant of a secure cluster that has one and ``same_host``; else "" (nobody maps)."""
        if not self.secure or not self.same_host:
            return ""
        from kvpool.security.identity import Role

        tenants = set(self._tenants)
        tenants.update(r.tenant for r in self._extra_tokens if r.role is Role.CLIENT)
        return tenants.pop() if len(tenants) == 1 else ""

    def _master_security_args(self) -> list[str]:
        if not self.secure:
            return ["--insecure"]
        assert self.pki is not None
        mapping = ["--same-host-clients", "*"] if self.mapping_tenant else []
        return [
            *mapping,
            "--tls-cert",
            str(self.pki.server_cert),
            "--tls-key",
            str(self.pki.server_key),
            "--tls-client-ca",
            str(self.pki.ca),
            "--credentials",
            str(self.run_dir / "credentials.json"),
            # (HA masters share it, as they share the credentials: capabilities one signs,
            # nodes check with the keys another delivered)
            "--capability-key-file",
            str(self.run_dir / "capability-keys.json"),
        ]

    def _tombstone_file_args(self) -> list[str]:
        """A lone master keeps its tombstone records in the run directory (as the chart's
        does on an emptyDir): a restarted one, same directory, reads them back."""
        if self.etcd is not None or "--tombstone-file" in self.master_args:
            return []
        return ["--tombstone-file", str(self.run_dir / "master-tombstones.json")]

    def _etcd_args(self) -> list[str]:
        if not self.etcd_tls:
            return ["--etcd", f"http://{self.etcd}"]
        assert self.pki is not None
        return [
            "--etcd",
            f"https://{self.etcd}",
            "--etcd-ca",
            str(self.pki.ca),
            "--etcd-cert",
            str(self.pki.server_cert),
            "--etcd-key",
            str(self.pki.server_key),
        ]

    def _kvpool(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "kvpool.cli.main", *args]

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Starts the cluster (once: ``with LocalCluster(...)`` already does)."""
        if self.master is not None or self.masters:
            return self
        deadline = time.monotonic() + timeout
        self._prepare_credentials()
        if self.etcd:
            for _ in range(self.master_count):
                self.add_master(deadline)
            if self.etcd_tls:  # (clients read etcd's gateway without certificates: see
                # docs/security.md; they follow the masters' leader hints instead)
                self.master_address = ",".join(
                    f"{m.host}:{m.ready['grpc_port']}" for m in self.masters
                )
            else:
                self.master_address = f"etcd://{self.etcd}/{self.name}"
            self.wait_for_leader(deadline - time.monotonic())
        else:
            self.start_master(deadline)
        for _ in range(self.node_count):
            self.add_node(deadline=deadline)
        return self

    def start_master(self, deadline: float | None = None) -> None:
        deadline = deadline or time.monotonic() + 60
        argv = self._kvpool(
            "master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--lane-port",
            str(self.lane_port),
            "--http-port",
            "0",
            "--log-format",
            self.log_format,
            *self._master_security_args(),
            *self._tombstone_file_args(),
            *self.master_args,
        )
        self.master = ManagedProcess("master", argv, self.run_dir, self.env)
        ready = self.master.wait_ready(deadline)
        self.port = ready["grpc_port"]  # a restarted master comes back on the same ports
        self.lane_port = ready["lane_port"]
        self.master_address = f"127.0.0.1:{self.port}"
        self.master_http_port = ready["http_port"]

    def add_master(self, deadline: float | None = None) -> ManagedProcess:
        """Starts one more master that campaigns for leadership through etcd."""
        name = f"master{len(self.masters)}"
        site = self.sites(name)
        ports = ("50051", "50052", "9090") if site.prefix else ("0", "0", "0")
        argv = self._kvpool(
            "master",
            "--host",
            site.host,
            "--port",
            ports[0],
            "--lane-port",
            ports[1],
            "--http-port",
            ports[2],
            *(("--advertise", f"{site.host}:{ports[0]}") if site.prefix else ()),
            *self._etcd_args(),
            "--cluster",
            self.name,
            "--log-format",
            self.log_format,
            *self._master_security_args(),
            *self.master_args,
        )
        master = ManagedProcess(name, [*site.prefix, *argv], self.run_dir, self.env)
        master.host = site.host
        master.ready = master.wait_ready(deadline or time.monotonic() + 60)
        self.masters.append(master)
        return master

    def leader(self) -> ManagedProcess | None:
        """The master that says it leads (its /readyz answers 200), if any."""
        for master in self.masters:
            if not master.alive():
                continue
            url = f"http://{master.host}:{master.ready['http_port']}/readyz"
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return master
            except OSError:
                continue
        return None

    def wait_for_leader(self, timeout: float = 30.0) -> ManagedProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                self.master = leader
                self.master_http_port = leader.ready["http_port"]
                return leader
            time.sleep(0.05)
        raise ClusterError(f"no master became leader in {timeout:.0f}s:\n{self.logs()}")

    def add_node(
        self, dram: str | None = None, extra: Sequence[str] = (), deadline: float | None = None
    ) -> ManagedProcess:
        deadline = deadline or time.monotonic() + 60
        name = f"node{len(self.nodes)}"
        site = self.sites(name)
        argv = self._kvpool(
            "node",
            "--master",
            self.master_address,
            "--dram",
            dram or self.dram,
            "--listen",
            site.host,
            "--http-port",
            "0",
            "--node-id",
            name,
            "--drain-timeout",
            "2",
            "--log-format",
            self.log_format,
            *(["--tenant", self.mapping_tenant] if self.mapping_tenant else []),
            *self.node_args,
            *extra,
        )
        env = dict(self.env)
        if self.secure:
            assert self.pki is not None
            # (argparse takes the last --node-id: a test's own wins over the name)
            node_id = argv[len(argv) - 1 - argv[::-1].index("--node-id") + 1]
            env.update(KVPOOL_TOKEN=self._node_token(node_id), KVPOOL_TLS_CA=str(self.pki.ca))
            env.pop("KVPOOL_TOKEN_FILE", None)
        else:
            argv.append("--insecure")
        node = ManagedProcess(name, [*site.prefix, *argv], self.run_dir, env)
        node.host = site.host
        node.ready = node.wait_ready(deadline)
        self.nodes.append(node)
        return node

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        for master in self.masters or ([self.master] if self.master else []):
            master.stop()
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def logs(self) -> str:
        parts = []
        masters = self.masters or ([self.master] if self.master else [])
        for process in [*masters, *self.nodes]:
            parts.append(f"--- {process.name} ---\n{process.log_tail()}")
        return "\n".join(parts)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
