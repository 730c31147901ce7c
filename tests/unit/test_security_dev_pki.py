"""The throwaway CA of local clusters and tests, and the identities client certificates
carry in their ``kvpool://`` URIs."""

from __future__ import annotations

import ipaddress
import stat
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from kvpool.security.certificates import (
    admin_uri,
    client_uri,
    identity_from_certificate,
    identity_from_uri,
    node_uri,
    uri_of,
)
from kvpool.security.dev_pki import DevPki, make_dev_pki
from kvpool.security.identity import Identity, Role
from kvpool.security.tls import TlsFiles


@pytest.fixture
def pki(tmp_path: Path) -> DevPki:
    return make_dev_pki(tmp_path / "pki")


def certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_a_ca_and_a_server_certificate_take_milliseconds(tmp_path):
    started = time.perf_counter()
    make_dev_pki(tmp_path / "pki")
    assert time.perf_counter() - started < 0.2


def test_the_server_certificate_names_every_host_and_serves_and_connects(pki):
    server = certificate(pki.server_cert)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    usages = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert server.issuer == certificate(pki.ca).subject
    server.verify_directly_issued_by(certificate(pki.ca))
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_keys_are_readable_by_their_owner_only(pki):
    cert, key = pki.client_certificate("kvpool://admin/root", "root")
    for path in (pki.ca_key, pki.server_key, key):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(cert.stat().st_mode) == 0o644


def test_the_files_go_together_as_tls_files(pki):
    assert pki.server_files() == TlsFiles(pki.server_cert, pki.server_key, pki.ca)
    assert pki.client_files() == TlsFiles(ca=pki.ca)
    pki.server_files().check(server=True)
    cert, key = pki.client_certificate("kvpool://node/node-0", "node-0")
    pki.client_files(cert, key).check()


def test_a_client_certificate_carries_its_identity_and_is_for_clients_only(pki):
    cert, key = pki.client_certificate("kvpool://client/acme/alice", "alice")
    assert (cert.name, key.name) == ("alice.crt", "alice.key")
    issued = certificate(cert)
    issued.verify_directly_issued_by(certificate(pki.ca))
    usages = issued.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    expected = Identity(name="alice", role=Role.CLIENT, tenant="acme")
    assert identity_from_certificate(cert.read_bytes()) == expected
    der = issued.public_bytes(serialization.Encoding.DER)
    assert identity_from_certificate(der) == expected


def test_reissuing_the_server_certificate_rotates_key_and_certificate_in_place(pki):
    before_cert, before_key = pki.server_cert.read_bytes(), pki.server_key.read_bytes()
    pki.reissue_server()
    assert pki.server_cert.read_bytes() != before_cert
    assert pki.server_key.read_bytes() != before_key
    certificate(pki.server_cert).verify_directly_issued_by(certificate(pki.ca))
    pki.server_files().check(server=True)  # the new key is the new certificate's


def test_nonsense_is_refused(tmp_path, pki):
    with pytest.raises(ValueError, match="at least a day"):
        make_dev_pki(tmp_path / "x", days=0)
    with pytest.raises(ValueError, match="at least one host"):
        make_dev_pki(tmp_path / "x", hosts=())
    with pytest.raises(ValueError, match="file name"):
        pki.client_certificate("kvpool://admin/root", "../escape")


# --- identities in certificates -------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "identity"),
    [
        ("kvpool://node/node-0", Identity(name="node-0", role=Role.NODE, node_id="node-0")),
        (
            "kvpool://client/acme/alice",
            Identity(name="alice", role=Role.CLIENT, tenant="acme"),
        ),
        ("kvpool://admin/root", Identity(name="root", role=Role.ADMIN)),
        (
            "kvpool://node/rack%2F7%20gpu",  # a node id may hold any character
            Identity(name="rack/7 gpu", role=Role.NODE, node_id="rack/7 gpu"),
        ),
    ],
)
def test_a_kvpool_uri_names_an_identity(uri, identity):
    assert identity_from_uri(uri) == identity
    assert uri_of(identity) == uri


@pytest.mark.parametrize(
    "uri",
    [
        "https://node/node-0",  # another scheme
        "kvpool://root/alice",  # no such role
        "kvpool://node/",  # no node id
        "kvpool://node/a/b",  # too many parts
        "kvpool://client/acme",  # no name
        "kvpool://client/Not A Tenant/alice",
        "kvpool://client/acme/has space",
        "kvpool://admin/root?as=node",
        "kvpool://admin/root#x",
        "kvpool://admin",
        "kvpool:",
    ],
)
def test_anything_else_names_nobody(uri):
    assert identity_from_uri(uri) is None


def test_builders_quote_what_they_must():
    assert node_uri("a/b") == "kvpool://node/a%2Fb"
    assert client_uri("acme", "alice@corp") == "kvpool://client/acme/alice%40corp"
    assert identity_from_uri(client_uri("acme", "alice@corp")) == Identity(
        name="alice@corp", role=Role.CLIENT, tenant="acme"
    )
    assert admin_uri("root") == "kvpool://admin/root"


def test_a_certificate_without_a_valid_kvpool_uri_gives_no_identity(pki):
    plain_cert, _ = pki.client_certificate("https://example.com/alice", "plain")
    bad_cert, _ = pki.client_certificate("kvpool://client/NOT_VALID/alice", "bad")
    assert identity_from_certificate(plain_cert.read_bytes()) is None
    assert identity_from_certificate(bad_cert.read_bytes()) is None
    assert identity_from_certificate(pki.server_cert.read_bytes()) is None  # DNS/IP names only
    assert identity_from_certificate(b"not a certificate") is None
    assert identity_from_certificate(b"-----BEGIN CERTIFICATE-----\nbroken\n") is None


def test_a_certificate_that_names_two_identities_names_none(pki):
    from cryptography.hazmat.primitives.asymmetric import ec

    from kvpool.security.dev_pki import _issue

    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    two = _issue(
        common_name="two",
        key=ec.generate_private_key(ec.SECP256R1()),
        ca_certificate=certificate(pki.ca),
        ca_key=ca_key,
        days=1,
        alternative_names=[
            x509.UniformResourceIdentifier("kvpool://client/acme/alice"),
            x509.UniformResourceIdentifier("kvpool://admin/alice"),
        ],
    )
    assert identity_from_certificate(two.public_bytes(serialization.Encoding.DER)) is None
