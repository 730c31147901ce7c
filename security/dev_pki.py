"""A throwaway certificate authority: TLS for a local cluster and for tests, in milliseconds.

Not for production: the CA's key lies beside the certificates it signs. It makes what a
real deployment gets from its own CA (cert-manager, an organisation's PKI): a CA certificate,
a server certificate for the hosts the services listen on, and client certificates that name
a kvpool identity in a URI (see ``certificates``). Keys are ECDSA P-256 (fast to make, small,
accepted by OpenSSL, gRPC and etcd's Go TLS alike), written readable by their owner only.

The server certificate is good for clients too (both extended key usages): a master is a
client of etcd and of the other masters with the same certificate, and etcd's own gateway
connects to etcd with it.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvpool.security.identity import name_problem
from kvpool.security.tls import TlsFiles, write_atomically

#: Hosts a local cluster is reached at.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
#: Certificates start this long before they are made: clocks of a test machine's processes
#: agree, those of a cluster's machines may not quite.
BACKDATE = datetime.timedelta(minutes=5)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _subject_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _issue(
    *,
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    ca_certificate: x509.Certificate | None,
    ca_key: ec.EllipticCurvePrivateKey,
    days: int,
    alternative_names: Sequence[x509.GeneralName] = (),
    usages: Sequence[x509.ObjectIdentifier] = (),
) -> x509.Certificate:
    """A certificate for ``key``: the CA's own when ``ca_certificate`` is None (self-signed),
    else a leaf signed by ``ca_key``."""
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    is_ca = ca_certificate is None
    issuer = subject if ca_certificate is None else ca_certificate.subject
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(secrets.randbits(127) + 1)
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=0 if is_ca else None), True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if alternative_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alternative_names), False)
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), False)
    return builder.sign(ca_key, hashes.SHA256())


@dataclass(frozen=True)
class DevPki:
    """The files of a throwaway CA, in ``directory``: the CA's certificate and key, the
    server's certificate and key, and client certificates issued later."""

    directory: Path
    ca: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    hosts: tuple[str, ...] = LOCAL_HOSTS
    days: int = 7

    def server_files(self) -> TlsFiles:
        """What a server (master, node, etcd) listens with."""
        return TlsFiles(cert=self.server_cert, key=self.server_key, ca=self.ca)

    def client_files(self, cert: Path | None = None, key: Path | None = None) -> TlsFiles:
        """What a client connects with: the CA, and a client certificate when given."""
        return TlsFiles(cert=cert, key=key, ca=self.ca)

    def _ca(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        certificate = x509.load_pem_x509_certificate(self.ca.read_bytes())
        key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return certificate, key

    def client_certificate(self, uri: str, name: str) -> tuple[Path, Path]:
        """Issues a client certificate naming ``uri`` (``kvpool://node/node-0``, ...) and
        writes it to ``<name>.crt`` and ``<name>.key``; their paths."""
        if (problem := name_problem(name)) is not None:
            raise ValueError(f"client certificate file name: {problem}")
        ca_certificate, ca_key = self._ca()
        key = _new_key()
        certificate = _issue(
            common_name=name,
            key=key,
            ca_certificate=ca_certificate,
            ca_key=ca_key,
            days=self.days,
            alternative_names=[x509.UniformResourceIdentifier(uri)],
            usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        )
        cert_path, key_path = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        write_atomically(key_path, _key_pem(key), 0o600)
        write_atomically(cert_path, _certificate_pem(certificate), 0o644)
        return cert_path, key_path

    def reissue_server(self, hosts: Sequence[str] | None = None, days: int | None = None) -> None:
        """Rotates the server's certificate: a new key and certificate (same CA) replace the
        files in place, as a real rotation does. The key goes first; a server that reads the
        files in between sees a pair that does not match, and keeps the old one meanwhile."""
        ca_certificate, ca_key = self._ca()
        key = _new_key()
        certificate = _issue(
            common_name="kvpool server",
            key=key,
            ca_certificate=ca_certificate,
            ca_key=ca_key,
            days=self.days if days is None else days,
            alternative_names=_subject_names(self.hosts if hosts is None else hosts),
            usages=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        )
        write_atomically(self.server_key, _key_pem(key), 0o600)
        write_atomically(self.server_cert, _certificate_pem(certificate), 0o644)


def make_dev_pki(directory: Path, hosts: Sequence[str] = LOCAL_HOSTS, days: int = 7) -> DevPki:
    """A new CA and a server certificate for ``hosts`` (names and IP addresses), in
    ``directory`` (made if missing): ``ca.crt``, ``ca.key``, ``server.crt``, ``server.key``."""
    if days < 1:
        raise ValueError(f"certificates last at least a day; got days={days}")
    if not hosts:
        raise ValueError("a server certificate needs at least one host name or address")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key()
    ca_certificate = _issue(
        common_name="kvpool development CA",
        key=ca_key,
        ca_certificate=None,
        ca_key=ca_key,
        days=days,
    )
    pki = DevPki(
        directory=directory,
        ca=directory / "ca.crt",
        ca_key=directory / "ca.key",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        hosts=tuple(hosts),
        days=days,
    )
    write_atomically(pki.ca_key, _key_pem(ca_key), 0o600)
    write_atomically(pki.ca, _certificate_pem(ca_certificate), 0o644)
    pki.reissue_server()
    return pki
