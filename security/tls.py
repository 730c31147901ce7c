"""TLS material from files, picked up again when the files are replaced (rotated).

Certificates expire and are rotated by replacing their files (cert-manager, a cron job,
``DevPki.reissue_server``). A server reads them again for the next connection, without a
restart: gRPC through dynamic server credentials (whose fetcher gRPC calls before every new
handshake), the metadata lane through an SNI callback that hands each new connection the
context of the files of the moment. A half-done rotation (a new certificate beside the old
key) is never served: material is checked before it replaces what works, and picked up once
the pair matches again.

TLS 1.2 is the oldest version either side speaks. gRPC is imported only by the functions that
build gRPC credentials: a command that only needs an ``ssl`` context does not load it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from stat import S_IMODE
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import UnsupportedAlgorithm

from kvpool.common.logging import get_logger

if TYPE_CHECKING:
    import grpc

log = get_logger(__name__)

#: The oldest protocol version kvpool speaks, on every connection.
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
#: How often (seconds) a server looks at its files again, at most.
CHECK_INTERVAL = 1.0


class TlsConfigError(ValueError):
    """TLS files that cannot be used; the message says which and what to do."""


#: What identifies one version of a file: inode, modification time, size (None: missing).
Signature = tuple[tuple[int, int, int] | None, ...]


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of one side of a connection: its certificate and key (both or neither)
    and the CA that its peer's certificate must chain to. Strings are taken as paths."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    @property
    def enabled(self) -> bool:
        """True when any file is named: the connection is to use TLS."""
        return any(path is not None for path in (self.cert, self.key, self.ca))

    def paths(self) -> tuple[Path, ...]:
        return tuple(path for path in (self.cert, self.key, self.ca) if path is not None)

    def check(self, *, server: bool = False) -> None:
        """Raises TlsConfigError unless every named file is there, readable, and holds what
        its name says (a certificate and the key that matches it, CA certificates). A
        ``server`` needs its certificate and key."""
        if (self.cert is None) != (self.key is None):
            given, missing = ("certificate", "key") if self.key is None else ("key", "certificate")
            raise TlsConfigError(
                f"a TLS {given} was given without its {missing}: give both "
                "(--tls-cert and --tls-key), or neither"
            )
        if server and self.cert is None:
            raise TlsConfigError(
                "a TLS server needs a certificate and its key: give --tls-cert and --tls-key"
            )
        _read_material(self)


@dataclass(frozen=True)
class _Material:
    """The contents of a TlsFiles, checked: the key matches the certificate."""

    cert: bytes | None
    key: bytes | None
    ca: bytes | None


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TlsConfigError(f"the TLS {what} {path} does not exist: check the path") from None
    except OSError as error:
        raise TlsConfigError(
            f"cannot read the TLS {what} {path}: {error.strerror}; check its permissions"
        ) from None
    if not data.strip():
        raise TlsConfigError(f"the TLS {what} {path} is empty: it should hold PEM text")
    return data


def _read_material(files: TlsFiles) -> _Material:
    """Reads and checks the files: the key must be the certificate's, the CA file must hold
    certificates. Raises TlsConfigError saying which file is wrong."""
    cert = _read(files.cert, "certificate") if files.cert else None
    key = _read(files.key, "key") if files.key else None
    ca = _read(files.ca, "CA certificate") if files.ca else None
    if cert is not None and key is not None:
        _check_pair(cert, key, files)
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if ca is not None:
        try:
            probe.load_verify_locations(cadata=ca.decode("ascii", "replace"))
        except ssl.SSLError as error:
            raise TlsConfigError(
                f"the TLS CA file {files.ca} holds no usable PEM certificate: "
                f"{error.reason or error}"
            ) from None
    return _Material(cert=cert, key=key, ca=ca)


def _check_pair(cert: bytes, key: bytes, files: TlsFiles) -> None:
    """The key must be the certificate's: checked on the bytes read, so that a certificate
    and a key read while their files were being replaced are never used together."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        certificate = x509.load_pem_x509_certificate(cert)
    except ValueError:
        raise TlsConfigError(
            f"the TLS certificate {files.cert} holds no PEM certificate: give the PEM file "
            "(-----BEGIN CERTIFICATE-----)"
        ) from None
    try:
        private_key = serialization.load_pem_private_key(key, password=None)
    except TypeError:
        raise TlsConfigError(
            f"the TLS key {files.key} is encrypted: kvpool needs it without a passphrase "
            "(keep it readable by the service's user only)"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsConfigError(
            f"the TLS key {files.key} holds no PEM private key: give the PEM file "
            "(-----BEGIN PRIVATE KEY-----)"
        ) from None

    def public_der(key: Any) -> bytes:
        return bytes(
            key.public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    if public_der(certificate.public_key()) != public_der(private_key.public_key()):
        raise TlsConfigError(
            f"the TLS key {files.key} is not the key of the certificate {files.cert}: give "
            "the key the certificate was issued for"
        )


def signature(files: TlsFiles) -> Signature:
    """What changes when any of the files is replaced or rewritten."""
    found: list[tuple[int, int, int] | None] = []
    for path in files.paths():
        try:
            stat = path.stat()
        except OSError:
            found.append(None)
        else:
            found.append((stat.st_ino, stat.st_mtime_ns, stat.st_size))
    return tuple(found)


class _Reloading:
    """Material that is read again when its files change; the last good material is kept
    while the new files are unusable (a warning says why, once per change)."""

    def __init__(
        self, files: TlsFiles, build: Callable[[_Material], Any], check_interval: float
    ) -> None:
        self.files = files
        self._build = build
        self._check_interval = check_interval
        self._lock = threading.Lock()
        self._signature = signature(files)
        self.value = build(_read_material(files))
        self._refused: Signature | None = None
        self._checked = time.monotonic()

    def changed(self) -> bool:
        """Reads the files again if they changed; True when a new value was built."""
        now = time.monotonic()
        if now - self._checked < self._check_interval:
            return False
        with self._lock:
            self._checked = now
            seen = signature(self.files)
            if seen == self._signature or seen == self._refused:
                return False
            try:
                value = self._build(_read_material(self.files))
            except (TlsConfigError, OSError, ValueError) as error:
                self._refused = seen
                log.warning(
                    "rotated TLS files are not usable yet; still serving the previous ones",
                    error=str(error),
                )
                return False
            self.value, self._signature, self._refused = value, seen, None
            log.info("TLS files reloaded", files=[str(p) for p in self.files.paths()])
            return True


def write_atomically(
    path: Path, data: bytes, mode: int | None = None, *, new_file_mode: int = 0o600
) -> None:
    """Writes ``path`` whole or not at all: a reader sees the old file or the new one, never
    a part (a temporary file in the same folder, flushed to disk, renamed over it). One that
    replaces a file keeps that file's owner and group (``keep_owner_and_mode``): ``sudo
    kvpool token revoke`` must leave the credentials file readable by the service that owns
    it, or that service keeps the tokens it read before. Its mode is ``mode`` where given (a
    private key is never left as readable as the file it replaced), else the old file's; a
    new file gets ``mode``, else ``new_file_mode``."""
    path = Path(path)
    try:
        old: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        old = None
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        if old is None:
            os.fchmod(descriptor, new_file_mode if mode is None else mode)
        else:
            keep_owner_and_mode(descriptor, old, path)
            if mode is not None:
                os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename itself, durable
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def keep_owner_and_mode(descriptor: int, old: os.stat_result, path: Path) -> None:
    """Gives the new copy (``descriptor``) of ``path`` the owner, group and mode of the file it
    replaces (``old``). PermissionError, saying whom to run as, when the owner cannot be
    kept: a copy its owner might not be able to read is never put in place. Its owner writing
    it keeps its own group where the file's is one it is not in (the owner reads it still)."""
    new = os.fstat(descriptor)
    if (new.st_uid, new.st_gid) != (old.st_uid, old.st_gid):
        try:
            os.fchown(descriptor, old.st_uid, old.st_gid)
        except PermissionError:
            if new.st_uid == old.st_uid:  # (the owner itself: only the group could not be)
                os.fchmod(descriptor, S_IMODE(old.st_mode))
                return
            raise PermissionError(
                errno.EPERM,
                f"{path} belongs to uid {old.st_uid} (group {old.st_gid}) and a copy written by "
                f"uid {os.geteuid()} cannot be given to them, so they might not read it: run "
                "this as that user (or root)",
            ) from None
    os.fchmod(descriptor, S_IMODE(old.st_mode))  # (after fchown, which may clear bits)


# --- gRPC ---------------------------------------------------------------------------------


def _grpc_certificate_configuration(material: _Material) -> Any:
    import grpc

    assert material.cert is not None and material.key is not None
    return grpc.ssl_server_certificate_configuration(
        [(material.key, material.cert)], root_certificates=material.ca
    )


def grpc_server_credentials(files: TlsFiles, require_client_cert: bool) -> grpc.ServerCredentials:
    """Credentials for ``server.add_secure_port``: the certificate of ``files``, read again
    for the next connection once its files are replaced. With ``require_client_cert``, a
    client must present a certificate issued by ``files.ca`` (gRPC cannot ask for an optional
    one: without it, callers prove who they are with tokens)."""
    import grpc

    files.check(server=True)
    if require_client_cert and files.ca is None:
        raise TlsConfigError(
            "client certificates are required, but no CA to check them against: give --tls-ca"
        )
    reloading = _Reloading(files, _grpc_certificate_configuration, check_interval=0.0)

    def fetch() -> Any:
        """Called by gRPC before every handshake: a new configuration, or None (no change)."""
        try:
            return reloading.value if reloading.changed() else None
        except Exception as error:  # an exception here would fail the handshake
            log.warning("checking the TLS files failed", error=str(error))
            return None

    return grpc.dynamic_ssl_server_credentials(
        reloading.value, fetch, require_client_authentication=require_client_cert
    )


def grpc_channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Credentials for ``grpc.secure_channel``/``grpc.aio.secure_channel``: the server must
    present a certificate of ``files.ca`` (the system's CAs when None); the client presents
    ``files.cert`` when it has one (mutual TLS)."""
    import grpc

    files.check()
    material = _read_material(files)
    return grpc.ssl_channel_credentials(
        root_certificates=material.ca,
        private_key=material.key,
        certificate_chain=material.cert,
    )


# --- ssl contexts (the metadata lane, etcd's health check) ---------------------------------


def _server_context(
    files: TlsFiles, material: _Material, require_client_cert: bool
) -> ssl.SSLContext:
    assert files.cert is not None and files.key is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    # OpenSSL refuses a key that is not the certificate's: a rotation caught half-way fails
    # here, and is picked up at a later look.
    context.load_cert_chain(files.cert, files.key)
    if material.ca is not None:
        context.load_verify_locations(cadata=material.ca.decode("ascii", "replace"))
        # Without a requirement a certificate is still asked for, and checked when given.
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


class ServerContexts:
    """Server-side ``ssl`` contexts of ``files``, rebuilt when the files change (looked at
    once per ``check_interval`` seconds at most).

    ``current()`` is the context of the files of the moment. asyncio takes a server's context
    once, at ``create_server``: give it ``listening_context()``, which hands every new
    connection the current context as its handshake begins (in its SNI callback).
    """

    def __init__(
        self,
        files: TlsFiles,
        require_client_cert: bool,
        *,
        check_interval: float = CHECK_INTERVAL,
    ) -> None:
        files.check(server=True)
        if require_client_cert and files.ca is None:
            raise TlsConfigError(
                "client certificates are required, but no CA to check them against: give --tls-ca"
            )
        self.files = files
        self.require_client_cert = require_client_cert
        self._reloading = _Reloading(files, self._build, check_interval)

    def _build(self, material: _Material) -> ssl.SSLContext:
        context = _server_context(self.files, material, self.require_client_cert)
        context.sni_callback = self._switch
        return context

    def current(self) -> ssl.SSLContext:
        self._reloading.changed()
        context: ssl.SSLContext = self._reloading.value
        return context

    def listening_context(self) -> ssl.SSLContext:
        """The context to listen with: the handshake of each new connection continues with
        ``current()``, so a rotated certificate is served without restarting the server.
        (Every context made here switches so; this is the one of the moment.)"""
        return self.current()

    def _switch(
        self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: Any
    ) -> int | None:
        try:
            current = self.current()
            if connection.context is not current:
                connection.context = current
        except Exception as error:  # the handshake goes on with the context it has
            log.warning("switching to the current TLS files failed", error=str(error))
        return None


def client_ssl_context(files: TlsFiles, server_hostname_check: bool = True) -> ssl.SSLContext:
    """A client context: TLS 1.2 or later, the server's certificate checked against
    ``files.ca`` (the system's CAs when None) and, unless ``server_hostname_check`` is off, its
    name against the host connected to; ``files.cert`` and ``files.key`` presented when given."""
    files.check()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = MINIMUM_VERSION
    if files.ca is not None:
        context.load_verify_locations(cafile=files.ca)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = server_hostname_check
    if files.cert is not None and files.key is not None:
        context.load_cert_chain(files.cert, files.key)
    return context
