"""What a caller of the master presents: a bearer token and the TLS material to reach it.

Clients, storage nodes and the CLI take them the way their users expect: arguments first,
then the environment (``KVPOOL_TOKEN`` or ``KVPOOL_TOKEN_FILE``, ``KVPOOL_TLS_CA``,
``KVPOOL_TLS_CERT``, ``KVPOOL_TLS_KEY``). A CA makes every connection to the master TLS;
without one they are plaintext (a loopback master, or one started ``--insecure``). A token
never goes out in plaintext beyond loopback: a token without a CA, for a master (or etcd)
on another host, is refused (PlaintextToken) before anything is sent.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kvpool.common.loopback import is_loopback
from kvpool.common.master_address import host_of
from kvpool.security.tls import (
    TlsConfigError,
    TlsFiles,
    client_ssl_context,
    grpc_channel_credentials,
)
from kvpool.security.tokens import token_from, token_problem

ENV_TLS_CA = "KVPOOL_TLS_CA"
ENV_TLS_CERT = "KVPOOL_TLS_CERT"
ENV_TLS_KEY = "KVPOOL_TLS_KEY"


class CredentialsProblem(ValueError):
    """The credentials given cannot be used as they are (a malformed token, a missing file)."""


class PlaintextToken(CredentialsProblem, TlsConfigError):
    """A token would cross the network readable: no CA (so no TLS) for a master or etcd
    beyond loopback. (A TlsConfigError too: what a channel that cannot be made raises.)"""


@dataclass(frozen=True)
class CallerCredentials:
    #: Never in ``repr``: configs that hold credentials get printed, logged and dumped.
    token: str | None = field(default=None, repr=False)
    tls: TlsFiles | None = None

    @classmethod
    def resolve(
        cls,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> CallerCredentials:
        """The credentials given, else those of the environment; CredentialsProblem with
        what to fix when they are unusable."""
        env = os.environ
        if token is not None and not isinstance(token, str):
            raise CredentialsProblem(
                f"the kvpool token must be a str (or '@/path/to/file'), not {type(token).__name__}"
            )
        for name, value in (("tls_ca", tls_ca), ("tls_cert", tls_cert), ("tls_key", tls_key)):
            if value is not None and not isinstance(value, str | os.PathLike):
                raise CredentialsProblem(
                    f"{name} must be the path of a PEM file (str or Path), not "
                    f"{type(value).__name__}"
                )
        try:
            token = token_from(token)
        except (OSError, ValueError) as error:
            raise CredentialsProblem(f"cannot read the kvpool token: {error}") from None
        if token is not None:
            problem = token_problem(token)
            if problem is not None:
                raise CredentialsProblem(f"the kvpool token is unusable: {problem}")
        ca = tls_ca or env.get(ENV_TLS_CA) or None
        cert = tls_cert or env.get(ENV_TLS_CERT) or None
        key = tls_key or env.get(ENV_TLS_KEY) or None
        tls = None
        if ca or cert or key:
            if not ca:
                raise CredentialsProblem(
                    "a client certificate without a CA: give tls_ca (KVPOOL_TLS_CA), the CA "
                    "that signed the master's certificate"
                )
            tls = TlsFiles(
                cert=Path(cert) if cert else None,
                key=Path(key) if key else None,
                ca=Path(ca),
            )
            try:
                tls.check()
            except ValueError as error:
                raise CredentialsProblem(str(error)) from None
        return cls(token, tls)

    def refuse_plaintext_token(self, addresses: Iterable[str]) -> None:
        """PlaintextToken when this token would go out unencrypted to one of ``addresses``
        (HOST:PORT) that is not this host's loopback: a token, and no CA. Without a token
        (a master started ``--insecure``), or with a CA, nothing is refused."""
        if self.token is None or self.tls is not None:
            return
        remote = [address for address in addresses if not is_loopback(host_of(address))]
        if remote:
            raise PlaintextToken(
                f"a token but no CA for {', '.join(remote)}, beyond loopback: without TLS "
                "the token would cross the network readable. Give --tls-ca / KVPOOL_TLS_CA "
                "(tls_ca= in Python), the CA of the master's certificate; for a master "
                "started --insecure, give no token"
            )

    def client_arguments(self) -> dict[str, Any]:
        """``kvpool.Client`` keyword arguments that give these same credentials."""
        tls = self.tls
        return {
            "token": self.token,
            "tls_ca": tls.ca if tls else None,
            "tls_cert": tls.cert if tls else None,
            "tls_key": tls.key if tls else None,
        }

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """gRPC metadata that carries the token (none without one)."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def channel(self, target: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
        """A channel to ``target``; PlaintextToken where the token would go out readable."""
        self.refuse_plaintext_token([target])
        if self.tls is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, grpc_channel_credentials(self.tls), options=options)

    def aio_channel(self, target: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
        if self.tls is None:
            return grpc.aio.insecure_channel(target, options=options)
        return grpc.aio.secure_channel(target, grpc_channel_credentials(self.tls), options=options)

    def lane_context(self) -> ssl.SSLContext | None:
        """The TLS context of a lane connection (None: plaintext)."""
        return None if self.tls is None else client_ssl_context(self.tls)

    @property
    def lane_auth(self) -> bytes:
        """The body of the lane's AUTH frame."""
        return (self.token or "").encode()


#: No token, no TLS: what reaches a master started ``--insecure``.
ANONYMOUS = CallerCredentials()
