"""A token never goes out in plaintext beyond loopback (docs/security.md): a caller with a
token and no CA is refused, before anything is sent, for a master (or etcd) that is not on
this host's loopback; loopback, a CA, or no token (a master started --insecure) are as
before."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvpool import Client
from kvpool.errors import InvalidArgument
from kvpool.security.caller import CallerCredentials, CredentialsProblem, PlaintextToken
from kvpool.security.identity import Role
from kvpool.security.tls import TlsConfigError, TlsFiles
from kvpool.security.tokens import new_token

TOKEN, _ = new_token("plaintext-test", Role.CLIENT, tenant="t")
REMOTE = "192.0.2.7:50051"  # (TEST-NET-1: never this host's loopback)


def test_a_token_without_a_ca_is_refused_for_a_master_beyond_loopback():
    credentials = CallerCredentials(TOKEN)
    with pytest.raises(PlaintextToken) as refused:
        credentials.refuse_plaintext_token(["127.0.0.1:1", REMOTE])
    message = str(refused.value)
    assert "192.0.2.7:50051" in message and "127.0.0.1" not in message
    assert "--tls-ca / KVPOOL_TLS_CA" in message
    assert TOKEN not in message, "the token itself is never repeated"
    assert isinstance(refused.value, CredentialsProblem | TlsConfigError)
    with pytest.raises(PlaintextToken):
        credentials.channel(REMOTE, options=())  # (no channel is even made)


@pytest.mark.parametrize("address", ["127.0.0.1:1", "127.1.2.3:1", "localhost:1", "[::1]:1"])
def test_loopback_a_ca_or_no_token_are_as_before(address):
    CallerCredentials(TOKEN).refuse_plaintext_token([address])
    CallerCredentials().refuse_plaintext_token([REMOTE])  # (--insecure: nothing to leak)
    with_ca = CallerCredentials(TOKEN, TlsFiles(ca=Path("/nonexistent/ca.pem")))
    with_ca.refuse_plaintext_token([REMOTE])


@pytest.mark.parametrize("master", [REMOTE, f"127.0.0.1:1,{REMOTE}", "etcd://192.0.2.7:2379/c"])
def test_a_client_with_a_token_and_no_ca_for_a_remote_master_is_refused_at_once(
    monkeypatch, master
):
    monkeypatch.delenv("KVPOOL_TLS_CA", raising=False)
    start = time.monotonic()
    with pytest.raises(InvalidArgument, match="KVPOOL_TLS_CA"):
        Client(master, token=TOKEN, timeout=30)
    assert time.monotonic() - start < 5, "refused before any connection is tried"


def _non_loopback_address() -> str | None:
    """An address of this host beyond loopback (where a test server can listen), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # (no packet is sent: it picks a route)
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_kvpool_status_with_a_token_and_no_ca_sends_nothing_to_a_remote_master():
    """The audit's reproduction: `kvpool status` to a plaintext listener beyond loopback
    with $KVPOOL_TOKEN and no CA. It must exit 2 saying what to give, and not connect."""
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this host has no address beyond loopback")
    listener = socket.create_server((address, 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[bytes] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(1)
                try:
                    accepted.append(connection.recv(65536))
                except OSError:
                    accepted.append(b"")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    env = {k: v for k, v in os.environ.items() if k not in ("KVPOOL_TLS_CA", "KVPOOL_TOKEN_FILE")}
    env["KVPOOL_TOKEN"] = TOKEN
    try:
        command = [sys.executable, "-m", "kvpool.cli.main", "status", "--timeout", "3"]
        done_run = subprocess.run(
            [*command, "--master", f"{address}:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        done.set()
        thread.join(timeout=5)
        listener.close()
    assert done_run.returncode == 2, done_run.stderr
    assert done_run.stderr.startswith("error: ") and "KVPOOL_TLS_CA" in done_run.stderr
    assert "Traceback" not in done_run.stderr
    assert accepted == [], "nothing at all went to the master"
