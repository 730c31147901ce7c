"""Secure unless told otherwise, and kept secure without restarts.

The rules, for real ``kvpool master`` and ``kvpool node`` processes:

- a master asked to listen beyond loopback (``--host 0.0.0.0``) without credentials refuses
  to start, and says what to do: ``--credentials``, or ``--insecure``;
- with ``--credentials`` but no TLS it refuses too: tokens would cross the network readable;
- with ``--insecure`` it starts (its /healthz answers) and its log says, loudly, INSECURE;
- a node without a token (and without ``--insecure``) exits 2 and names
  ``kvpool token create``;
- a rotated server certificate is served to new gRPC channels and new lane connections
  within a couple of seconds, by the same master process, and calls keep succeeding;
- a token revoked with ``kvpool token revoke`` stops working within about two seconds,
  without a restart, over gRPC, on new lane connections and on those it opened before.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from helpers import bearer, wait_until

from kvpool.common import lane_protocol as lp
from kvpool.common.status import KeyStatus
from kvpool.local_cluster import LocalCluster
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security.dev_pki import make_dev_pki
from kvpool.security.identity import Role
from kvpool.security.tls import TlsFiles, client_ssl_context
from kvpool.security.tokens import CredentialStore, new_token

KVPOOL = [sys.executable, "-m", "kvpool.cli.main"]
#: A master beyond loopback, on ports of the system's choosing.
EXPOSED_MASTER = [
    *KVPOOL, "master", "--host", "0.0.0.0", "--port", "0", "--lane-port", "0",
    "--http-port", "0", "--log-format", "json",
]  # fmt: skip


def bare_env() -> dict[str, str]:
    """The environment of a user who has set up no credentials."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("KVPOOL_TOKEN", "KVPOOL_TLS", "KVPOOL_CREDENTIALS"))
    }


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, env=bare_env(), timeout=timeout, check=False
    )


# ---- starting


def test_a_master_beyond_loopback_without_credentials_refuses_and_says_what_to_do():
    done = run(EXPOSED_MASTER)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "--credentials" in output and "--insecure" in output, output
    assert "kvpool token create" in output, output
    assert "Traceback" not in output


def test_a_master_beyond_loopback_with_credentials_but_no_tls_refuses(tmp_path):
    store = CredentialStore.create(tmp_path / "credentials.json")
    store.add(new_token("admin", Role.ADMIN)[1])
    done = run([*EXPOSED_MASTER, "--credentials", str(store.path)])
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "plaintext" in output and "--tls-cert" in output and "--insecure" in output, output
    assert "Traceback" not in output


def test_an_insecure_master_beyond_loopback_starts_and_says_it_is_insecure(tmp_path):
    ready = tmp_path / "master.ready.json"
    log = tmp_path / "master.log"
    with log.open("wb") as out:
        master = subprocess.Popen(
            [*EXPOSED_MASTER, "--insecure", "--ready-file", str(ready)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=bare_env(),
        )
    try:
        assert wait_until(lambda: ready.exists() or master.poll() is not None, 30)
        assert master.poll() is None, log.read_text()
        port = json.loads(ready.read_text())["http_port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200
        assert "INSECURE" in log.read_text(), log.read_text()
    finally:
        master.terminate()
        master.wait(10)


def test_a_node_without_a_token_exits_2_naming_kvpool_token_create():
    done = run([*KVPOOL, "node", "--master", "127.0.0.1:50051", "--dram", "16MiB"])
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "kvpool token create" in output and "--insecure" in output, output
    assert "Traceback" not in output


# ---- rotation and revocation, on a running cluster with its own CA


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("rotation")
    with LocalCluster(1, "32MiB", run_dir=root / "cluster", pki=make_dev_pki(root / "pki")) as c:
        yield c


def served_certificate(port: int, ca: Path, alpn: str | None = None) -> bytes:
    """The certificate (DER) a new TLS connection to ``port`` is served, checked against
    ``ca``."""
    context = client_ssl_context(TlsFiles(ca=ca))
    if alpn:
        context.set_alpn_protocols([alpn])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        certificate = sock.getpeercert(binary_form=True)
    assert certificate
    return certificate


@contextlib.contextmanager
def new_stub(cluster) -> Iterator[master_pb2_grpc.MasterStub]:
    assert cluster.pki is not None
    credentials = grpc.ssl_channel_credentials(root_certificates=cluster.pki.ca.read_bytes())
    with grpc.secure_channel(cluster.master_address, credentials) as channel:
        yield master_pb2_grpc.MasterStub(channel)


@contextlib.contextmanager
def lane(cluster, token: str) -> Iterator[ssl.SSLSocket]:
    """A new lane connection, its AUTH frame sent."""
    assert cluster.pki is not None
    context = client_ssl_context(TlsFiles(ca=cluster.pki.ca))
    raw = socket.create_connection(("127.0.0.1", cluster.lane_port), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(lp.encode(1, lp.AUTH, token.encode()))
        yield sock


def lane_exists(sock: ssl.SSLSocket, key: str) -> lp.Frame:
    """One Exists on the connection: its answer (or the AUTH frame's refusal)."""
    request = pb.ExistsRequest(client_id="c", keys=[key], no_lease=True)
    sock.sendall(lp.encode(2, lp.METHOD_IDS["Exists"], request.SerializeToString()))
    decoder = lp.FrameDecoder()
    while True:
        data = sock.recv(65536)
        assert data, "the master closed the connection without an answer"
        for frame in decoder.feed(data):
            if frame.status != lp.OK or frame.method != lp.AUTH:
                return frame


def create_client_token(credentials: str, name: str) -> list[str]:
    """`kvpool token create` of a client token of tenant ``default``."""
    return [*KVPOOL, "token", "create", "--credentials", credentials, "--name", name,
            "--role", "client", "--tenant", "default"]  # fmt: skip


def test_a_rotated_server_certificate_is_served_without_a_restart(cluster):
    assert cluster.pki is not None and cluster.master is not None
    pid = cluster.master.pid
    ca = cluster.pki.ca
    old = served_certificate(cluster.port, ca, "h2"), served_certificate(cluster.lane_port, ca)
    assert old[0] == old[1] == ssl.PEM_cert_to_DER_cert(cluster.pki.server_cert.read_text())

    cluster.pki.reissue_server()
    new = ssl.PEM_cert_to_DER_cert(cluster.pki.server_cert.read_text())
    assert new not in old
    time.sleep(1.5)
    assert wait_until(lambda: served_certificate(cluster.port, ca, "h2") == new, 5), "gRPC"
    assert wait_until(lambda: served_certificate(cluster.lane_port, ca) == new, 5), "lane"

    with new_stub(cluster) as stub:
        status = stub.ClusterStatus(
            pb.ClusterStatusRequest(), metadata=bearer(cluster.admin_token), timeout=10
        )
        assert status.nodes == 1
    with lane(cluster, cluster.tenant_tokens["default"]) as sock:
        answer = lane_exists(sock, "no-such-key")
        assert answer.status == lp.OK, answer.error()
        assert list(pb.ExistsResponse.FromString(answer.body).statuses) == [KeyStatus.NOT_FOUND]
    assert cluster.master.pid == pid and cluster.master.alive(), "the same master process"


def test_a_revoked_token_stops_working_within_two_seconds_without_a_restart(cluster):
    assert cluster.master is not None
    pid = cluster.master.pid
    credentials = str(cluster.run_dir / "credentials.json")
    created = run(create_client_token(credentials, "soon-revoked"))
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()

    with new_stub(cluster) as stub:

        def works() -> bool:
            try:
                stub.ListKeys(pb.ListKeysRequest(), metadata=bearer(token), timeout=10)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error.details()
                return False
            return True

        assert wait_until(works, 3), "a new token works within a couple of seconds"
        with lane(cluster, token) as sock:
            assert lane_exists(sock, "k").status == lp.OK

        revoked = run([*KVPOOL, "token", "revoke", "--credentials", credentials, "soon-revoked"])
        assert revoked.returncode == 0, revoked.stderr
        started = time.monotonic()
        assert wait_until(lambda: not works(), 2.5), "still accepted 2.5 s after revocation"
        assert time.monotonic() - started < 2.5
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListKeys(pb.ListKeysRequest(), metadata=bearer(token), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED

    with lane(cluster, token) as sock:
        refusal = lane_exists(sock, "k")
        assert refusal.method == lp.AUTH and refusal.status == lp.UNAUTHENTICATED
    with lane(cluster, cluster.tenant_tokens["default"]) as sock:
        assert lane_exists(sock, "k").status == lp.OK, "other tokens are unaffected"
    assert cluster.master.pid == pid and cluster.master.alive()


def test_a_revoked_token_stops_working_on_a_lane_connection_opened_before(cluster):
    credentials = str(cluster.run_dir / "credentials.json")
    created = run(create_client_token(credentials, "revoked-while-connected"))
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    time.sleep(1.2)  # (the master reads the file again within a second)
    with lane(cluster, token) as sock:
        assert lane_exists(sock, "k").status == lp.OK
        revoked = run(
            [*KVPOOL, "token", "revoke", "--credentials", credentials, "revoked-while-connected"]
        )
        assert revoked.returncode == 0, revoked.stderr
        time.sleep(2.0)
        try:
            answer = lane_exists(sock, "k")
        except (AssertionError, ConnectionError, ssl.SSLError):
            return  # closed: refused
        assert answer.status == lp.UNAUTHENTICATED, "a revoked token still calls on its lane"
