"""etcd over TLS: aetcd's client on a secure channel, and endpoints that say which they are.

aetcd (1.0) always opens an insecure channel. ``TlsEtcdClient`` opens a TLS one (with a
client certificate, for an etcd started with ``--client-cert-auth``) and is otherwise
aetcd's client. An endpoint says whether it is TLS (``https://``) or not (``http://``);
a bare ``host:port`` is TLS when TLS files are given. A mismatch is refused with a message,
never connected as plain text: a cluster configured for TLS does not quietly run without it.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
from typing import Any

import aetcd
from aetcd import exceptions, rpc, watcher

from kvpool.security.tls import TlsFiles, grpc_channel_credentials

#: The schemes of etcd endpoints: what ``etcd --listen-client-urls`` takes.
SCHEMES = ("http", "https")


class EtcdEndpointError(ValueError):
    """An etcd endpoint that cannot be used as given; the message says what to write."""


class _NotGiven(enum.Enum):
    NOT_GIVEN = enum.auto()


#: ``parse_etcd_endpoint`` without ``tls``: parse only.
NOT_GIVEN = _NotGiven.NOT_GIVEN


def parse_etcd_endpoint(
    text: str, tls: TlsFiles | _NotGiven | None = NOT_GIVEN
) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of ``http://HOST:PORT``, ``https://HOST:PORT`` or
    ``HOST:PORT`` (``[ADDRESS]:PORT`` for IPv6).

    Given ``tls`` (the etcd TLS files, or None for none), the endpoint must fit them:
    ``https`` needs a CA, ``http`` refuses TLS files (it would connect without them), and a
    bare endpoint is ``https`` with TLS files, ``http`` without. Without ``tls``: the text
    is parsed only, a bare endpoint being ``http``."""
    given = text.strip()
    scheme, separator, rest = given.partition("://")
    with_tls = isinstance(tls, TlsFiles) and tls.enabled
    if not separator:
        scheme, rest = ("https" if with_tls else "http"), given
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise EtcdEndpointError(
            f"etcd endpoint {text!r} has scheme {scheme!r}: write http://HOST:PORT, "
            "https://HOST:PORT or HOST:PORT"
        )
    rest = rest.rstrip("/")
    host, colon, port_text = rest.rpartition(":")
    if not colon or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise EtcdEndpointError(
            f"etcd endpoint {text!r} has no port: write HOST:PORT (etcd's client port is "
            "usually 2379)"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise EtcdEndpointError(
                f"etcd endpoint {text!r}: {host!r} is no IPv6 address"
            ) from None
    elif ":" in host or "/" in host:
        raise EtcdEndpointError(
            f"etcd endpoint {text!r} does not parse: write HOST:PORT, with an IPv6 address "
            "in brackets ([::1]:2379)"
        )
    if tls is NOT_GIVEN:
        return scheme, host, int(port_text)
    if scheme == "https" and not (isinstance(tls, TlsFiles) and tls.ca is not None):
        raise EtcdEndpointError(
            f"etcd endpoint {text!r} is https:// but no --etcd-ca given: give the CA that "
            "signed etcd's certificate (and --etcd-cert/--etcd-key if etcd asks for a client "
            "certificate)"
        )
    if scheme == "http" and with_tls:
        raise EtcdEndpointError(
            f"etcd endpoint {text!r} is http:// (plain text) but TLS files for etcd are given: "
            "write https:// (or HOST:PORT), or leave the TLS files out"
        )
    return scheme, host, int(port_text)


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class TlsEtcdClient(aetcd.Client):
    """aetcd's client, over TLS when ``tls`` is given (its CA checks etcd's certificate; its
    certificate and key, when given, are the client certificate). Without ``tls``: aetcd's
    own insecure client."""

    # Set by aetcd's ``Client.__init__`` (aetcd has no type information).
    _connected: asyncio.Event
    _is_connecting: bool

    def __init__(
        self,
        host: str = "localhost",
        port: int = 2379,
        *,
        tls: TlsFiles | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(host, port, **kwargs)
        self._tls = tls
        # Read (and checked) now: a wrong file is an error at start, not at the first call.
        self._credentials = grpc_channel_credentials(tls) if tls is not None else None

    @property
    def tls(self) -> TlsFiles | None:
        """The TLS files this client connects with; None: plain text."""
        return self._tls

    async def connect(self) -> None:
        """Opens the channel; aetcd's ``connect`` (1.0) but for the channel's credentials."""
        if self._credentials is None:
            await super().connect()
            return
        try:
            await self._connect_securely()
        except rpc.AioRpcError as error:
            exceptions._handle_exception(error)

    async def _connect_securely(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # another task is connecting: wait for it
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            self.channel = rpc.secure_channel(
                _target(self._host, self._port),
                self._credentials,
                options=list(self._options.items()),
            )
            if self._username is not None and self._password is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                response = await self.auth_stub.Authenticate(
                    rpc.AuthenticateRequest(name=self._username, password=self._password),
                    timeout=self._timeout,
                )
                self.metadata = (("token", response.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


def etcd_client(endpoint: str, tls: TlsFiles | None = None, **kwargs: Any) -> TlsEtcdClient:
    """A client of ``endpoint`` (see ``parse_etcd_endpoint``): over TLS when it is https."""
    scheme, host, port = parse_etcd_endpoint(endpoint, tls)
    return TlsEtcdClient(host, port, tls=tls if scheme == "https" else None, **kwargs)
