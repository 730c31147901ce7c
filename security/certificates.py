"""Identities from client certificates: who a caller is, read from its certificate's URI.

A kvpool client certificate names its identity in a URI subject alternative name, so one CA
(the cluster's own, or an organisation's) can issue them beside its other certificates:

- ``kvpool://node/<node_id>``: the storage node ``node_id``;
- ``kvpool://client/<tenant>/<name>``: client ``name`` of ``tenant``;
- ``kvpool://admin/<name>``: administrator ``name``.

Parts are percent-encoded where they must be (a node id may hold any character). A
certificate without such a URI, with one that does not parse, or with two that disagree,
gives no identity: the caller is then asked for a token, never guessed at.
"""

from __future__ import annotations

from urllib.parse import quote, unquote, urlsplit

from kvpool.common.keys import key_problem
from kvpool.security.identity import Identity, Role, name_problem, tenant_problem

#: The URI scheme of identities in certificates.
SCHEME = "kvpool"


def node_uri(node_id: str) -> str:
    return f"{SCHEME}://node/{quote(node_id, safe='')}"


def client_uri(tenant: str, name: str) -> str:
    return f"{SCHEME}://client/{quote(tenant, safe='')}/{quote(name, safe='')}"


def admin_uri(name: str) -> str:
    return f"{SCHEME}://admin/{quote(name, safe='')}"


def uri_of(identity: Identity) -> str:
    """The URI that names ``identity`` in a certificate."""
    if identity.role is Role.NODE:
        return node_uri(identity.node_id)
    if identity.role is Role.CLIENT:
        return client_uri(identity.tenant, identity.name)
    return admin_uri(identity.name)


def identity_from_uri(uri: str) -> Identity | None:
    """The identity a ``kvpool://`` URI names, or None when it names none (another scheme, a
    role that does not exist, a part that is missing or not valid)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return None
    if parts.scheme != SCHEME or parts.query or parts.fragment or "?" in uri or "#" in uri:
        return None
    role = parts.netloc
    segments = [unquote(segment) for segment in parts.path.split("/")[1:]]
    if role == Role.NODE and len(segments) == 1:
        (node_id,) = segments
        if key_problem(node_id) is not None:
            return None
        return Identity(name=node_id, role=Role.NODE, node_id=node_id)
    if role == Role.CLIENT and len(segments) == 2:
        tenant, name = segments
        if tenant_problem(tenant) is not None or name_problem(name) is not None:
            return None
        return Identity(name=name, role=Role.CLIENT, tenant=tenant)
    if role == Role.ADMIN and len(segments) == 1:
        (name,) = segments
        if name_problem(name) is not None:
            return None
        return Identity(name=name, role=Role.ADMIN)
    return None


def identity_from_certificate(der_or_pem: bytes) -> Identity | None:
    """The identity of a client certificate (DER, as ``getpeercert(binary_form=True)`` gives
    it, or PEM, as gRPC's auth context does), or None when it names none or the bytes are no
    certificate. The certificate is taken as already checked by the TLS handshake."""
    from cryptography import x509

    try:
        if der_or_pem.lstrip().startswith(b"-----BEGIN"):
            certificate = x509.load_pem_x509_certificate(der_or_pem)
        else:
            certificate = x509.load_der_x509_certificate(der_or_pem)
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, x509.ExtensionNotFound):
        return None
    named = {
        identity_from_uri(uri)
        for uri in names.value.get_values_for_type(x509.UniformResourceIdentifier)
        if uri.lower().startswith(f"{SCHEME}:")
    }
    # None, a URI that does not parse, or a certificate that says two things: no identity.
    if len(named) != 1 or None in named:
        return None
    return named.pop()
