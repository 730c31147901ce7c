"""Who is calling: the identity a call proves, by bearer token or client certificate.

gRPC calls carry ``authorization: Bearer <token>`` in their metadata (or a client
certificate with a kvpool URI, under mutual TLS); a lane connection proves itself once, in
its first frame (or by its certificate). A cluster started with ``--insecure`` takes every
caller as ``INSECURE``. Refusals are UNAUTHENTICATED with what is missing, counted by reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from kvpool.master import metrics
from kvpool.master.driver import CallRefused
from kvpool.security.certificates import identity_from_certificate
from kvpool.security.identity import INSECURE, Identity
from kvpool.security.tokens import CredentialStore, token_problem

#: gRPC metadata key of the bearer token (lowercase: gRPC metadata keys are).
AUTHORIZATION = "authorization"
BEARER = "Bearer "
#: Client certificates whose identity is remembered (parsing one costs ~100 us).
MAX_CACHED_CERTIFICATES = 1024


class Authenticator:
    def __init__(self, credentials: CredentialStore | None, *, insecure: bool = False) -> None:
        if credentials is None and not insecure:
            raise ValueError("an Authenticator needs credentials unless it is insecure")
        self.credentials = credentials
        self.insecure = insecure
        self._certificates: dict[bytes, Identity | None] = {}

    def from_token(self, token: str | None, certificate: bytes | None = None) -> Identity:
        """The identity a bearer token (else a client certificate) proves; CallRefused
        UNAUTHENTICATED when neither proves one."""
        if self.insecure:
            return INSECURE
        if token:
            problem = token_problem(token)
            identity = None
            if problem is None:
                assert self.credentials is not None
                identity = self.credentials.authenticate(token)
            if identity is None:
                raise _refused(
                    "bad_token",
                    problem
                    or "the token is not one this cluster knows (revoked, or of another "
                    "cluster): create one with `kvpool token create`",
                )
            return identity
        if certificate:
            identity = self._certificate_identity(certificate)
            if identity is not None:
                return identity
            raise _refused(
                "bad_certificate",
                "the client certificate names no kvpool identity (a URI like "
                "kvpool://client/TENANT/NAME): present a token or such a certificate",
            )
        raise _refused(
            "missing",
            "no credentials: no token was given and no client certificate was received. Pass "
            "a token (KVPOOL_TOKEN, --token, or Client(token=...)); a client certificate "
            "proves an identity only where the master runs with --require-client-cert",
        )

    def revoked(self, token: str) -> bool:
        """Whether a token that proved an identity no longer does: checked on every frame
        of a lane connection (a dict lookup while the credentials file is unchanged)."""
        return self.credentials is not None and self.credentials.authenticate(token) is None

    def refusal_revoked(self) -> CallRefused:
        return _refused(
            "bad_token",
            "the connection's token was revoked (or the credentials changed): get a new one",
        )

    def refusal_before_auth(self) -> CallRefused:
        """The answer to a lane frame sent before the connection's credentials."""
        return _refused(
            "missing",
            "this master checks credentials: a lane connection's first frame is AUTH with a "
            "token (the client does this when given one: KVPOOL_TOKEN, or Client(token=...))",
        )

    def from_grpc(self, context: grpc.aio.ServicerContext) -> Identity:
        """The identity of a gRPC call: its bearer token, else its client certificate."""
        if self.insecure:
            return INSECURE
        return self.from_token(
            bearer(context.invocation_metadata() or ()), _peer_certificate(context)
        )

    def _certificate_identity(self, certificate: bytes) -> Identity | None:
        if certificate in self._certificates:
            return self._certificates[certificate]
        identity = identity_from_certificate(certificate)
        if len(self._certificates) >= MAX_CACHED_CERTIFICATES:
            self._certificates.clear()
        self._certificates[certificate] = identity
        return identity


def _refused(reason: str, details: str) -> CallRefused:
    metrics.labelled(metrics.AUTH_REFUSED, reason).inc()
    return CallRefused(grpc.StatusCode.UNAUTHENTICATED, details)


def bearer(metadata: Iterable[Any]) -> str | None:
    for key, value in metadata:
        if key == AUTHORIZATION:
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            if not text.startswith(BEARER):
                return text  # (token_problem says what is wrong with it)
            return text[len(BEARER) :].strip()
    return None


def _peer_certificate(context: grpc.aio.ServicerContext) -> bytes | None:
    pem = context.auth_context().get("x509_pem_cert")
    return pem[0] if pem else None
