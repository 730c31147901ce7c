"""A leader named by a standby (its hint) never holds a client for good (client/master_link.py,
common/leader_resolver.py).

Behind one address (a Kubernetes Service in front of every master), a client that met a
standby switched to the leader it named and stayed there: where that address could not be
reached, or the leader's certificate did not name it (masters advertising their pod IP, the
certificate naming the Service), every call retried it until its deadline, for good. Now the
client goes back to the address it was given; and a certificate that does not name the address
dialled is reported as a master that did not prove who it is, not retried in silence.
"""

from __future__ import annotations

import datetime
import socket
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID

from kvpool.client.master_link import (
    CERTIFICATE_DATES,
    HOSTNAME_MISMATCH,
    UNTRUSTED_CA,
    MasterLink,
    _tls_problem,
)
from kvpool.common.leader_resolver import LEADER_METADATA
from kvpool.errors import MasterNotTrusted, MasterUnavailable
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security import dev_pki
from kvpool.security.caller import CallerCredentials
from kvpool.security.dev_pki import DevPki, make_dev_pki
from kvpool.security.tls import TlsFiles


class FakeMaster(master_pb2_grpc.MasterServicer):
    """Answers ClusterStatus; refuses the first ``refusals`` as a standby naming ``leader``."""

    def __init__(self, leader: str = "", refusals: int = 0) -> None:
        self.leader = leader
        self.refusals = refusals
        self.calls = 0

    def ClusterStatus(self, request, context):
        self.calls += 1
        if self.calls <= self.refusals:
            context.set_trailing_metadata(((LEADER_METADATA, self.leader),))
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"not the leader: the leader is {self.leader}"
            )
        return pb.ClusterStatusResponse()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    # the certificate names "localhost" only, as the chart's named the master Service only
    return make_dev_pki(tmp_path_factory.mktemp("pki"), hosts=("localhost",))


@pytest.fixture
def serve(pki: DevPki) -> Iterator:
    servers: list[grpc.Server] = []

    def start(servicer: master_pb2_grpc.MasterServicer) -> int:
        server = grpc.server(futures.ThreadPoolExecutor(2))
        master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
        key, cert = Path(pki.server_key).read_bytes(), Path(pki.server_cert).read_bytes()
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
        server.start()
        servers.append(server)
        return port

    yield start
    for server in servers:
        server.stop(0)


def link(pki: DevPki, address: str) -> MasterLink:
    credentials = CallerCredentials(token=None, tls=TlsFiles(ca=str(pki.ca)))
    return MasterLink(address, use_lane=False, credentials=credentials)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_hinted_leader_whose_certificate_does_not_name_it_sends_the_client_back(pki, serve):
    leader = serve(FakeMaster())  # reached at 127.0.0.1, which its certificate does not name
    service = FakeMaster(leader=f"127.0.0.1:{leader}", refusals=1)  # a standby, then the leader
    client = link(pki, f"localhost:{serve(service)}")
    try:
        start = time.monotonic()
        client.call("ClusterStatus", pb.ClusterStatusRequest(), time.monotonic() + 10)
        assert time.monotonic() - start < 3, "went back to the address given at once"
        assert service.calls == 2
    finally:
        client.close()


def test_a_hinted_leader_that_cannot_be_reached_sends_the_client_back(pki, serve):
    service = FakeMaster(leader=f"localhost:{free_port()}", refusals=1)  # nothing listens there
    client = link(pki, f"localhost:{serve(service)}")
    try:
        client.call("ClusterStatus", pb.ClusterStatusRequest(), time.monotonic() + 10)
        assert service.calls == 2
    finally:
        client.close()


def test_a_hint_that_never_proves_itself_is_named_at_the_deadline(pki, serve):
    leader = serve(FakeMaster())
    service = FakeMaster(leader=f"127.0.0.1:{leader}", refusals=10**6)  # always a standby
    client = link(pki, f"localhost:{serve(service)}")
    try:
        with pytest.raises(MasterUnavailable) as raised:
            client.call("ClusterStatus", pb.ClusterStatusRequest(), time.monotonic() + 1.5)
        message = str(raised.value)
        assert f"master 127.0.0.1:{leader} did not prove who it is" in message
        assert "does not name 127.0.0.1" in message
        assert service.calls > 1, "the address given was tried again"
    finally:
        client.close()


def test_a_certificate_that_does_not_name_the_address_given_fails_at_once(pki, serve):
    port = serve(FakeMaster())
    client = link(pki, f"127.0.0.1:{port}")
    try:
        start = time.monotonic()
        with pytest.raises(MasterNotTrusted, match=r"does not name 127\.0\.0\.1") as raised:
            client.call("ClusterStatus", pb.ClusterStatusRequest(), time.monotonic() + 10)
        assert time.monotonic() - start < 3, "no retry fixes a certificate"
        assert isinstance(raised.value, MasterUnavailable) and not raised.value.retryable
    finally:
        client.close()


def expired_certificate(pki: DevPki) -> tuple[bytes, bytes]:
    """A key and a certificate for localhost, signed by ``pki``'s CA, that expired yesterday."""
    ca_cert, ca_key = pki._ca()
    key = dev_pki._new_key()
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvpool master")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=10))
        .not_valid_after(now - datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(dev_pki._subject_names(["localhost"])), False)
        .sign(ca_key, hashes.SHA256())
    )
    return dev_pki._key_pem(key), dev_pki._certificate_pem(certificate)


def test_an_expired_master_certificate_is_told_as_such_and_not_as_another_ca(pki):
    """Signed by the right CA: a renewal (or a clock put right) fixes it, so it is a plain
    MasterUnavailable, raised at once, that says so (not MasterNotTrusted, which engines'
    adapters take for a configuration to fix before they start)."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    master_pb2_grpc.add_MasterServicer_to_server(FakeMaster(), server)
    port = server.add_secure_port(
        "127.0.0.1:0", grpc.ssl_server_credentials([expired_certificate(pki)])
    )
    server.start()
    client = link(pki, f"localhost:{port}")
    try:
        start = time.monotonic()
        with pytest.raises(MasterUnavailable) as raised:
            client.call("ClusterStatus", pb.ClusterStatusRequest(), time.monotonic() + 10)
        assert time.monotonic() - start < 3
        assert not isinstance(raised.value, MasterNotTrusted)
        assert "), has expired as this host's clock reads it" in str(raised.value), raised.value
        assert "renew the master's certificate" in str(raised.value)
    finally:
        client.close()
        server.stop(0)


@pytest.mark.parametrize(
    ("details", "problem"),
    [
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Custom "
            "verification check failed with error: UNAUTHENTICATED: Hostname Verification "
            "Check failed.",
            HOSTNAME_MISMATCH,
        ),
        (
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, "
            "certificate is not valid for '10.0.0.1'. (_ssl.c:1006)",
            HOSTNAME_MISMATCH,
        ),
        (
            "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
            "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer",
            UNTRUSTED_CA,
        ),
        (
            "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
            "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired",
            CERTIFICATE_DATES,
        ),
        (
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate is not "
            "yet valid (_ssl.c:1006)",
            CERTIFICATE_DATES,
        ),
        ("failed to connect to all addresses; last error: connection refused", ""),
    ],
    ids=["grpc hostname", "ssl hostname", "untrusted CA", "grpc expired", "ssl not yet", "refused"],
)
def test_tls_failures_are_told_apart(details, problem):
    assert _tls_problem(details) == problem
