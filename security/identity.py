"""Identities: who made a call, proven by a bearer token or a client certificate.

Three roles. A ``node`` is bound to one node id: only it may mount that node's segments,
heartbeat for it and hold its command stream. A ``client`` belongs to one tenant and reaches
that tenant's objects only. An ``admin`` sees the whole cluster (status, every tenant's keys)
and manages quotas; it puts and gets nothing. With ``--insecure`` every caller is
``INSECURE``: no checks, the ``default`` tenant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    NODE = "node"
    CLIENT = "client"
    ADMIN = "admin"


#: Tenant names: short, lowercase, no separator of the master's internal keys (``/``).
TENANT_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
#: The tenant of every call on a cluster started with ``--insecure``.
DEFAULT_TENANT = "default"
#: Between a tenant and a key in the master's (and the nodes') key space.
TENANT_SEPARATOR = "/"
#: Names of identities (token names, certificate subjects): what logs and refusals show.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}")


def tenant_problem(tenant: object) -> str | None:
    """Why ``tenant`` is not a valid tenant name, or None when it is."""
    if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
        return (
            f"tenant {tenant!r} is not a valid tenant name: 1 to 63 characters of a-z, 0-9, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    return None


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid identity name, or None when it is."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        return (
            f"name {name!r} is not a valid identity name: 1 to 128 characters of letters, "
            "digits, '.', '_', '@', ':' and '-'"
        )
    return None


@dataclass(frozen=True, slots=True)
class Identity:
    """A proven caller. ``tenant`` is set for clients, ``node_id`` for nodes."""

    name: str
    role: Role
    tenant: str = ""
    node_id: str = ""
    #: True only for the identity of every caller of an ``--insecure`` cluster.
    insecure: bool = False

    def __post_init__(self) -> None:
        if self.role is Role.CLIENT and not self.tenant:
            raise ValueError(f"client identity {self.name!r} has no tenant")
        if self.role is Role.NODE and not self.node_id:
            raise ValueError(f"node identity {self.name!r} has no node id")

    def describe(self) -> str:
        """How refusals and logs name this caller."""
        if self.role is Role.CLIENT:
            return f"client {self.name!r} of tenant {self.tenant!r}"
        if self.role is Role.NODE:
            return f"node {self.name!r} (node id {self.node_id!r})"
        return f"admin {self.name!r}"


#: Every caller of a cluster started with ``--insecure``: may do everything, in one tenant.
INSECURE = Identity(
    name="insecure", role=Role.ADMIN, tenant=DEFAULT_TENANT, node_id="", insecure=True
)


def internal_key(tenant: str, key: str) -> str:
    """The master's key for ``key`` of ``tenant``: tenants never share a key."""
    return tenant + TENANT_SEPARATOR + key


def split_key(internal: str) -> tuple[str, str]:
    """``internal`` as (tenant, key as the tenant's clients name it); ('', ``internal``)
    for a key without a tenant."""
    tenant, separator, key = internal.partition(TENANT_SEPARATOR)
    return (tenant, key) if separator else ("", internal)


def tenant_of(internal: str) -> str:
    """The tenant an internal key belongs to ('' for a key without one)."""
    tenant, separator, _ = internal.partition(TENANT_SEPARATOR)
    return tenant if separator else ""
