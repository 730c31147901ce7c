"""The system under test, each process in its own namespace: etcd (TLS, client
certificates), masters electing a leader through it, storage nodes (the last one with a
persistent NVMe segment on a file system of its own, so that disk faults hit only it), and
client workers. ``ChaosCluster`` starts them and stops them, and always cleans up: the disk
is unmounted and its loop device detached even when a start fails halfway.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos.topology import OBSERVER, Network
from kvpool.etcd_process import etcd_binary
from kvpool.local_cluster import LocalCluster, ManagedProcess, Site, _die_with_parent

ETCD_PORT = 2379
#: The persistent node's file system: small, so that a fault can fill it.
DISK_BYTES = 96 << 20
NVME_SEGMENT = "32MiB"


@dataclass
class Layout:
    masters: int = 3
    nodes: int = 3  # the last one has the persistent segment
    clients: int = 2
    #: Two nodes alone must hold every live object and the space of removed ones still
    #: leased (docs/reliability.md, "What is checked"): nothing is ever evicted.
    dram: str = "384MiB"
    client_threads: int = 3
    timeout: float = 8.0  # each client call's deadline
    live_keys: int = 120
    #: (a story of 20,000 events: a full ring of the default 300,000 holds about 55 MiB, a
    #: bounded buffer that would hide a leak from the verdict's memory check)
    master_args: tuple[str, ...] = ("--story-events", "20000")
    node_args: tuple[str, ...] = ()  # e.g. ("--data-port", "0"): the checked stream

    def site_names(self) -> list[str]:
        return [
            "etcd",
            *(f"master{i}" for i in range(self.masters)),
            *(f"node{i}" for i in range(self.nodes)),
            *(f"client{i}" for i in range(self.clients)),
        ]


@dataclass
class Disk:
    """A loop-mounted ext4 file system: where the persistent node keeps its segment."""

    image: Path
    mount: Path
    device: str = ""

    def create(self) -> None:
        with self.image.open("wb") as out:
            out.truncate(DISK_BYTES)
        self.device = _run("losetup", "--find", "--show", str(self.image)).strip()
        _run("mkfs.ext4", "-q", "-F", "-m", "0", self.device)
        self.mount.mkdir(parents=True, exist_ok=True)
        _run("mount", self.device, str(self.mount))

    @property
    def major_minor(self) -> str:
        rdev = os.stat(self.device).st_rdev
        return f"{os.major(rdev)}:{os.minor(rdev)}"

    def destroy(self) -> None:
        if not self.device:
            return
        subprocess.run(["chattr", "-R", "-i", str(self.mount)], capture_output=True, check=False)
        for _ in range(20):
            if subprocess.run(["umount", str(self.mount)], capture_output=True).returncode == 0:
                break
            time.sleep(0.25)
        subprocess.run(["losetup", "-d", self.device], capture_output=True, check=False)
        self.device = ""
        self.image.unlink(missing_ok=True)


@dataclass
class Etcd:
    network: Network
    pki: object
    data_dir: Path
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.network.sites['etcd']}:{ETCD_PORT}"

    def start(self, timeout: float = 30.0) -> None:
        pki = self.pki
        url = f"https://{self.endpoint}"
        peer = "http://127.0.0.1:2380"
        log = (self.data_dir.parent / "etcd.log").open("ab")
        self.process = subprocess.Popen(
            [
                *self.network.prefix("etcd"),
                etcd_binary(),
                "--name",
                "kvc",
                "--data-dir",
                str(self.data_dir),
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"kvc={peer}",
                "--cert-file",
                str(pki.server_cert),
                "--key-file",
                str(pki.server_key),  # type: ignore[attr-defined]
                "--client-cert-auth",
                "--trusted-ca-file",
                str(pki.ca),  # type: ignore[attr-defined]
                # (old revisions of the rewritten tombstone records compacted away, as the
                # chart's etcd and local clusters' do: else etcd's memory grows all run long)
                "--auto-compaction-mode",
                "periodic",
                "--auto-compaction-retention",
                "5m",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        from kvpool.security.tls import client_ssl_context

        cert, key = pki.client_certificate("kvpool://admin/etcd-health", "etcd-health")  # type: ignore[attr-defined]
        context = client_ssl_context(pki.client_files(cert, key))  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1, context=context) as r:
                    if b"true" in r.read():
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("etcd did not start in its namespace")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, 18)  # SIGCONT: a stalled etcd must hear the SIGTERM
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Worker:
    name: str
    popen: subprocess.Popen
    history: Path

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass
class ChaosCluster:
    network: Network
    run_dir: Path
    layout: Layout
    seed: int
    etcd: Etcd | None = None
    cluster: LocalCluster | None = None
    disk: Disk | None = None
    workers: list[Worker] = field(default_factory=list)

    def start(self) -> ChaosCluster:
        from kvpool.security.dev_pki import LOCAL_HOSTS, make_dev_pki

        try:
            hosts = (*LOCAL_HOSTS, *self.network.sites.values())
            pki = make_dev_pki(self.run_dir / "pki", hosts=hosts)
            self.etcd = Etcd(self.network, pki, self.run_dir / "etcd")
            self.etcd.start()
            self.disk = Disk(self.run_dir / "disk.img", self.run_dir / "nvme")
            self.disk.create()
            self.cluster = LocalCluster(
                0,
                self.layout.dram,
                masters=self.layout.masters,
                etcd=self.etcd.endpoint,
                etcd_tls=True,
                name="chaos",
                run_dir=self.run_dir / "cluster",
                pki=pki,
                env={"UCX_TLS": "tcp"},
                master_args=self.layout.master_args,
                sites=self._site,
            ).start(timeout=120)
            for i in range(self.layout.nodes):
                # (UCX_TLS=tcp above: UCX over TCP asked for in so many words, as a node
                # serving the checked stream requires)
                extra: tuple[str, ...] = ("--ucx-tcp", *self.layout.node_args)
                if i == self.layout.nodes - 1:
                    extra += ("--nvme", str(self.disk.mount), "--nvme-size", NVME_SEGMENT)
                self.cluster.add_node(extra=extra, deadline=time.monotonic() + 120)
            for i in range(self.layout.clients):
                self.workers.append(self._start_worker(f"client{i}"))
        except BaseException:
            self.stop()
            raise
        return self

    def _site(self, name: str) -> Site:
        return self.network.site(name)

    def _start_worker(self, name: str) -> Worker:
        assert self.cluster is not None and self.cluster.pki is not None
        history = self.run_dir / f"{name}.history.jsonl"
        config = {
            "name": name,
            "master": self.cluster.master_address,
            "tls_ca": str(self.cluster.pki.ca),
            "seed": self.seed * 10 + int(name[-1]),
            "threads": self.layout.client_threads,
            "timeout": self.layout.timeout,
            "history": str(history),
            "live_keys": self.layout.live_keys,
        }
        env = {**os.environ, "UCX_TLS": "tcp", **self.cluster.client_env()}
        log = (self.run_dir / f"{name}.log").open("ab")
        popen = subprocess.Popen(
            [
                *self.network.prefix(name),
                sys.executable,
                "-m",
                "bench.chaos.worker",
                json.dumps(config),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        log.close()
        assert popen.stdout is not None
        if '"ready"' not in popen.stdout.readline():
            raise RuntimeError(f"client {name} did not start: see {self.run_dir / (name + '.log')}")
        return Worker(name, popen, history)

    # ---- who is who

    def processes(self) -> dict[str, int]:
        """Every long-lived process of the system under test, by name: its pid."""
        found: dict[str, int] = {}
        if self.etcd is not None and self.etcd.process is not None:
            found["etcd"] = self.etcd.pid
        if self.cluster is not None:
            for process in [*self.cluster.masters, *self.cluster.nodes]:
                found[process.name] = process.pid
        for worker in self.workers:
            found[worker.name] = worker.pid
        return found

    def managed(self, name: str) -> ManagedProcess:
        assert self.cluster is not None
        for process in [*self.cluster.masters, *self.cluster.nodes]:
            if process.name == name:
                return process
        raise KeyError(name)

    def observer_client(self, admin: bool = False, timeout: float = 10.0):
        """A client in this process's namespace (the observer's link, which no fault cuts)."""
        from kvpool import Client

        assert self.cluster is not None and self.cluster.pki is not None
        token = self.cluster.admin_token if admin else self.cluster.tenant_tokens["default"]
        return Client(
            self.cluster.master_address,
            token=token,
            tls_ca=str(self.cluster.pki.ca),
            timeout=timeout,
            # only the switch's device: UCX would otherwise also send from this namespace's
            # other interfaces, whose addresses no site can answer (a connect then hangs)
            ucx_config={"TLS": "tcp", "NET_DEVICES": self.network.devices[OBSERVER]},
            same_host_mapping=False,
        )

    def histories(self) -> list[Path]:
        return [worker.history for worker in self.workers]

    # ---- stopping

    def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.popen.poll() is None:
                os.kill(worker.pid, 18)  # SIGCONT first: a stalled client must hear it
                worker.popen.terminate()
        for worker in self.workers:
            try:
                worker.popen.wait(self.layout.timeout * 4)
            except subprocess.TimeoutExpired:
                worker.popen.kill()
                worker.popen.wait()

    def stop(self) -> None:
        try:
            self.stop_workers()
            if self.cluster is not None:
                for process in [*self.cluster.masters, *self.cluster.nodes]:
                    process.signal(18)  # SIGCONT
                self.cluster.stop()
            if self.etcd is not None:
                self.etcd.stop()
        finally:
            if self.disk is not None:
                self.disk.destroy()

    def observer_address(self) -> str:
        return self.network.sites[OBSERVER]


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
