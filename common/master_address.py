"""Where the master is: ``--master`` (or ``$KVPOOL_MASTER``) in one of three forms.

* ``HOST:PORT``: one master;
* ``HOST:PORT,HOST:PORT,...``: several masters, one of them the leader;
* ``etcd://HOST:PORT[,HOST:PORT...]/CLUSTER``: ask etcd which master leads cluster CLUSTER.

Refused at once, not after a call's whole timeout: a URL (``http://HOST:PORT``: the master
speaks gRPC, not HTTP, and gRPC would look ``http://HOST`` up as a host name) and a port that
is not a number from 1 to 65535 in ASCII digits (``str.isdigit`` takes ``"²"`` and Arabic
digits, which gRPC cannot parse).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_VAR = "KVPOOL_MASTER"
ETCD_SCHEME = "etcd://"
#: gRPC's own name-resolver schemes, which it takes in a target as is ("dns:///HOST:PORT").
GRPC_SCHEMES = ("dns",)
#: The largest TCP port.
MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class MasterTarget:
    masters: tuple[str, ...] = ()  # HOST:PORT of each master, when given directly
    etcd: tuple[str, ...] = ()  # HOST:PORT of each etcd endpoint, when asking etcd
    cluster: str = ""

    def __str__(self) -> str:
        if self.etcd:
            return f"{ETCD_SCHEME}{','.join(self.etcd)}/{self.cluster}"
        return ",".join(self.masters)


def resolve_master(explicit: str | None) -> str:
    """The master address as given (validated); ValueError says how to give one."""
    return str(parse_master(explicit))


def parse_master(explicit: str | None) -> MasterTarget:
    if explicit is not None and not isinstance(explicit, str):
        raise ValueError(
            f"the master address must be a str such as 'HOST:PORT', not "
            f"{type(explicit).__name__} ({explicit!r})"
        )
    address = (explicit or os.environ.get(ENV_VAR, "")).strip()
    if not address:
        raise ValueError(
            f"no master address: pass --master HOST:PORT (or master='HOST:PORT' in Python) "
            f"or set {ENV_VAR}=HOST:PORT; with several masters, HOST:PORT,HOST:PORT or "
            "etcd://ETCD_HOST:2379/CLUSTER"
        )
    if address.startswith(ETCD_SCHEME):
        rest = address[len(ETCD_SCHEME) :]
        endpoints, _, cluster = rest.partition("/")
        if not cluster or "/" in cluster:
            raise ValueError(
                f"master address {address!r} names no cluster: use etcd://HOST:2379/CLUSTER"
            )
        return MasterTarget(etcd=_host_ports(endpoints, address), cluster=cluster)
    scheme, sep, rest = address.partition("://")
    if sep and scheme not in GRPC_SCHEMES:
        # (gRPC would take "http://HOST:PORT" for a host name, and every call would wait out
        # its whole timeout to fail with "Misformatted domain name")
        if scheme.lower() + sep == ETCD_SCHEME:
            raise ValueError(f"master address {address!r}: write {ETCD_SCHEME} in lower case")
        example = rest.partition("/")[0] or "127.0.0.1:50051"
        raise ValueError(
            f"master address {address!r}: the master is not reached by a {scheme}:// URL; "
            f"drop the {scheme}:// and give HOST:PORT (e.g. {example}), or "
            "etcd://ETCD_HOST:2379/CLUSTER to ask etcd which master leads"
        )
    return MasterTarget(masters=_host_ports(address, address))


def _host_ports(text: str, whole: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    for part in parts:
        host, sep, port = part.rpartition(":")
        if not sep or not host:
            raise ValueError(
                f"master address {whole!r}: {part!r} is not HOST:PORT (e.g. 127.0.0.1:50051)"
            )
        # (ASCII only: str.isdigit takes "²" and other scripts' digits, which int() refuses
        # or gRPC cannot parse, after a whole timeout)
        if not (port.isascii() and port.isdigit()) or not 0 < int(port) <= MAX_PORT:
            raise ValueError(
                f"master address {whole!r}: {part!r} is not HOST:PORT: the port must be a "
                f"number from 1 to {MAX_PORT} in ASCII digits (e.g. 127.0.0.1:50051)"
            )
    if not parts:
        raise ValueError(f"master address {whole!r} holds no HOST:PORT")
    return parts


def host_of(address: str) -> str:
    """The host part of ``HOST:PORT`` (``[v6]:PORT`` too): where a master's other ports are."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host
