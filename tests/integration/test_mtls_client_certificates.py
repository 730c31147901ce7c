"""Client certificates against a real master: what proves an identity, and what a refused
certificate tells its client.

A certificate proves an identity only on a master started with --require-client-cert (gRPC
asks for none otherwise): on one given --tls-client-ca alone, a client with a certificate
and no token is told that no token was given and no certificate received, and that the
master needs --require-client-cert; not to pass what it passed. On a master that requires
certificates, one expired, not yet valid or of another CA closes the TLS handshake: the
client says the master probably refused its certificate (or, for the dates, refuses it
itself before connecting), at once, instead of waiting out its timeout and blaming an
unreachable master.
"""

from __future__ import annotations

import datetime
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvpool import Client
from kvpool.errors import InvalidArgument, MasterUnavailable, NotAuthenticated
from kvpool.local_cluster import LocalCluster
from kvpool.security.dev_pki import DevPki, make_dev_pki

KVPOOL = [sys.executable, "-m", "kvpool.cli.main"]
IDENTITY = "kvpool://client/default/alice"
#: Far more than any answer here takes: a call that waits it out has failed the test.
TIMEOUT = 20.0
#: How soon a refused certificate must be reported.
PROMPTLY = 8.0


def issue(pki: DevPki, name: str, start: datetime.timedelta, end: datetime.timedelta) -> Path:
    """A client certificate of ``pki``'s CA naming IDENTITY, valid from now + ``start`` to
    now + ``end`` (dev_pki makes only current ones); its path (the key beside it, .key)."""
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(secrets.randbits(100))
        .not_valid_before(now + start)
        .not_valid_after(now + end)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(IDENTITY)]), False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path = pki.directory / f"{name}.crt"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert_path.with_suffix(".key").write_bytes(key_pem)
    cert_path.with_suffix(".key").chmod(0o600)
    return cert_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return make_dev_pki(tmp_path_factory.mktemp("mtls-pki"))


@pytest.fixture(scope="module")
def certificates(pki: DevPki, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Client certificates naming IDENTITY: valid, expired, not yet valid, of another CA."""
    days = datetime.timedelta(days=1)
    stranger = make_dev_pki(tmp_path_factory.mktemp("stranger-pki"))
    return {
        "valid": pki.client_certificate(IDENTITY, "valid")[0],
        "expired": issue(pki, "expired", -10 * days, -5 * days),
        "future": issue(pki, "future", 5 * days, 10 * days),
        "other-ca": stranger.client_certificate(IDENTITY, "other-ca")[0],
    }


@pytest.fixture(scope="module")
def strict(pki: DevPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A master that requires client certificates (no nodes: theirs would be refused)."""
    with LocalCluster(
        0,
        pki=pki,
        master_args=["--require-client-cert"],
        run_dir=tmp_path_factory.mktemp("strict"),
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def lenient(pki: DevPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A master given --tls-client-ca alone (what a LocalCluster passes)."""
    with LocalCluster(0, pki=pki, run_dir=tmp_path_factory.mktemp("lenient")) as cluster:
        yield cluster


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller has no token in its environment: the certificate is all it presents."""
    monkeypatch.delenv("KVPOOL_TOKEN", raising=False)
    monkeypatch.delenv("KVPOOL_TOKEN_FILE", raising=False)


def certificate_client(cluster: LocalCluster, pki: DevPki, cert: Path | None) -> Client:
    key = cert.with_suffix(".key") if cert else None
    return Client(
        cluster.master_address, tls_ca=pki.ca, tls_cert=cert, tls_key=key, timeout=TIMEOUT
    )


def failure_of(cluster: LocalCluster, pki: DevPki, cert: Path | None) -> tuple[Exception, float]:
    """What a call by a client presenting ``cert`` (and no token) raises, and after how long."""
    started = time.monotonic()
    with pytest.raises(Exception) as raised, certificate_client(cluster, pki, cert) as client:
        client.exists("x")
    return raised.value, time.monotonic() - started


def test_a_valid_certificate_proves_its_identity_where_certificates_are_required(
    strict, pki, certificates, no_token
):
    with certificate_client(strict, pki, certificates["valid"]) as client:
        assert client.exists("x") is False
        assert client.list_keys("").keys == []


def test_without_require_client_cert_the_refusal_says_no_certificate_was_received(
    lenient, pki, certificates, no_token
):
    error, _ = failure_of(lenient, pki, certificates["valid"])
    assert isinstance(error, NotAuthenticated), error
    text = str(error)
    assert "no token was given and no client certificate was received" in text, text
    assert "--require-client-cert" in text, text


@pytest.mark.parametrize(
    ("name", "said"), [("expired", "has expired"), ("future", "not valid yet")]
)
def test_a_certificate_out_of_its_dates_is_refused_before_connecting(
    strict, pki, certificates, no_token, name, said
):
    error, took = failure_of(strict, pki, certificates[name])
    assert isinstance(error, InvalidArgument), error
    assert said in str(error) and str(certificates[name]) in str(error), error
    assert took < PROMPTLY, f"{took:.1f}s: {error}"


def test_a_certificate_of_another_ca_is_named_as_the_likely_cause_at_the_deadline(
    strict, pki, certificates, no_token
):
    """(gRPC sees only closed handshakes, which a master at its connection cap or a proxy
    with no master behind it gives too: retried to the deadline, not failed at once.)"""
    cert = certificates["other-ca"]
    client = Client(
        strict.master_address,
        tls_ca=pki.ca,
        tls_cert=cert,
        tls_key=cert.with_suffix(".key"),
        timeout=2,
    )
    with pytest.raises(MasterUnavailable) as raised, client:
        client.exists("x")
    text = str(raised.value)
    assert "probably refused this client's certificate" in text, text
    assert "runs there" not in text, text


def test_no_certificate_where_one_is_required_says_so_at_the_deadline(strict, pki, no_token):
    started = time.monotonic()
    client = Client(strict.master_address, tls_ca=pki.ca, timeout=2)
    with pytest.raises(MasterUnavailable) as raised, client:
        client.exists("x")
    assert time.monotonic() - started < PROMPTLY
    assert "requires a client certificate (--require-client-cert)" in str(raised.value)


@pytest.mark.parametrize(("name", "said"), [("expired", "has expired"), ("other-ca", "refused")])
def test_the_cli_says_a_refused_certificate_on_one_line(strict, pki, certificates, name, said):
    timeout = 2.0 if name == "other-ca" else TIMEOUT  # (retried to the deadline)
    cert = certificates[name]
    env = {k: v for k, v in os.environ.items() if k not in ("KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE")}
    started = time.monotonic()
    done = subprocess.run(
        [*KVPOOL, "status", "--master", strict.master_address, "--tls-ca", str(pki.ca),
         "--tls-cert", str(cert), "--tls-key", str(cert.with_suffix(".key")),
         "--timeout", str(timeout)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and said in errors[0], done.stderr
    assert took < PROMPTLY + 5, f"{took:.1f}s: {done.stderr}"  # (+ the CLI's own start)


def test_a_token_with_a_certificate_the_lane_refuses_is_told_so_promptly(
    lenient, pki, certificates
):
    """(--tls-client-ca alone: the metadata lane checks a certificate it is given, and its
    refusal was retried until the deadline, blamed on the CA of the master's certificate.)"""
    cert = certificates["other-ca"]
    started = time.monotonic()
    client = Client(
        lenient.master_address,
        token=lenient.tenant_tokens["default"],
        tls_ca=pki.ca,
        tls_cert=cert,
        tls_key=cert.with_suffix(".key"),
        timeout=TIMEOUT,
    )
    with pytest.raises(MasterUnavailable) as raised, client:
        client.exists("x")
    assert "probably refused this client's certificate" in str(raised.value), raised.value
    assert time.monotonic() - started < PROMPTLY, raised.value
