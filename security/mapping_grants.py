"""Same-host mapping: who may map a storage node's segment, and the grant a node checks.

A client on a storage node's host can map the node's DRAM segment and copy with plain loads
and stores (``transport/shared_memory.py``): the fastest path kvpool has, and one the node
cannot check byte by byte. So it is given only where nothing it reaches belongs to someone
else, and only to identities the operator named:

* **Per identity.** A master maps nobody's unless its ``--same-host-clients`` names the
  client identity (token name or certificate name; ``*``: every client identity). An
  insecure cluster maps for everyone, as before.
* **One tenant's memory.** Only a segment that holds one tenant's objects alone (its node's
  ``--tenant``; the master places no other tenant's objects there) is mapped, and only by
  clients of that tenant. A segment shared by tenants is never mapped: its clients use the
  checked stream.
* **Handed over, not opened.** With the segment's descriptor the master sends a *map grant*:
  a capability (``security/capabilities.py``) for the whole segment, signed with keys
  derived for this purpose only (``PURPOSE``), so that it is never a transfer capability
  nor the other way round. The client presents it at the node's mapping socket
  (``storage_node/mapping_server.py``), which checks it (key, tag, term, expiry, segment,
  whole range, tenant, rights) and hands over the segment's file: read-only for
  ``Rights.READ`` (the client maps gets through that), read-write for ``Rights.WRITE``.
  The client checks that the socket's peer is the process the descriptor names and that the
  file is the inode it names; the node is not dumpable, so no process of its user opens its
  memory through ``/proc`` instead.

This module is the rule, sans-IO; the master grants with ``grant`` and a node checks with
``check``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvpool.security import capabilities as caps
from kvpool.security.identity import Identity, Role

#: What map grants' keys are derived for (``KeyRing.derived``).
PURPOSE = b"kvpool map grant v1"
#: How long a map grant stays good for handing over a file (a mapping, once made, lives on:
#: the grant is checked when the file is handed over, not at each copy).
GRANT_TTL_MS = 60_000
#: ``--same-host-clients`` value for every client identity.
EVERY_CLIENT = "*"
#: The request a client sends the mapping socket: magic, mode (``r`` or ``w``), the grant.
REQUEST_MAGIC = b"KVM1"
REQUEST_SIZE = len(REQUEST_MAGIC) + 1 + caps.SIZE
#: Longest refusal reason a node sends back, bytes.
MAX_REASON = 200
#: Answer status bytes.
HANDED_OVER, REFUSED = 0, 1


class MapRefused(Exception):
    """The node will not hand over the segment; the message says why."""


@dataclass(frozen=True, slots=True)
class SameHostPolicy:
    """Which client identities a master gives map grants to."""

    names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, value: str | Iterable[str]) -> SameHostPolicy:
        """From ``--same-host-clients`` (comma-separated names, or ``*``)."""
        items = value.split(",") if isinstance(value, str) else value
        return cls(frozenset(name.strip() for name in items if name.strip()))

    def allows(self, identity: Identity, segment_tenant: str) -> bool:
        """Whether ``identity`` may map a segment of ``segment_tenant`` ("" for a segment
        shared by tenants)."""
        if identity.insecure:
            return True  # (an insecure cluster has one tenant and checks nobody)
        return (
            identity.role is Role.CLIENT
            and bool(segment_tenant)
            and identity.tenant == segment_tenant
            and (EVERY_CLIENT in self.names or identity.name in self.names)
        )


def grant(
    ring: caps.KeyRing, *, segment_id: str, size: int, tenant: str, term: int, expiry_ms: int
) -> bytes:
    """A map grant for the whole of ``segment_id``, read and write, for ``tenant``."""
    return ring.derived(PURPOSE).grant(
        segment_id=segment_id,
        offset=0,
        length=size,
        rights=caps.Rights.READ | caps.Rights.WRITE,
        expiry_ms=expiry_ms,
        term=term,
        tenant=tenant,
    )


#: A segment's digest, as grants name it.
segment_digest = caps.segment_digest


def grant_segment(map_grant: bytes) -> bytes:
    """The digest of the segment ``map_grant`` names (its form checked, not its tag)."""
    try:
        return caps.parse(map_grant).segment
    except caps.CapabilityError as error:
        raise MapRefused(f"map grant refused: {error}") from None


def request(writable: bool, map_grant: bytes) -> bytes:
    """What a client sends the mapping socket for a read-only or read-write file."""
    return REQUEST_MAGIC + (b"w" if writable else b"r") + map_grant


def parse_request(message: bytes) -> tuple[bool, bytes]:
    """(writable, grant) of a request; MapRefused when it is not one."""
    if len(message) != REQUEST_SIZE or not message.startswith(REQUEST_MAGIC):
        raise MapRefused(
            f"a map request is exactly {REQUEST_SIZE} bytes, starting {REQUEST_MAGIC!r}"
        )
    mode = message[len(REQUEST_MAGIC)]
    if mode not in b"rw":
        raise MapRefused("a map request's mode is 'r' or 'w'")
    return mode == ord("w"), bytes(message[len(REQUEST_MAGIC) + 1 :])


def check(
    ring: caps.KeyRing | None,
    map_grant: bytes,
    *,
    writable: bool,
    segment_id: str,
    size: int,
    tenant: str,
    now_ms: int,
    min_term: int,
    max_skew_ms: int,
) -> None:
    """Raises MapRefused unless ``map_grant`` lets its holder map all of ``segment_id``
    (``size`` bytes, a segment of ``tenant``), read-write if ``writable``, now."""
    if ring is None:
        raise MapRefused("the node has no capability keys from its master yet: try again")
    if not tenant:
        raise MapRefused("this node's segments are shared by tenants: none is mapped")
    rights = caps.Rights.WRITE if writable else caps.Rights.READ
    try:
        capability = ring.derived(PURPOSE).verify(
            map_grant,
            now_ms=now_ms,
            segment=caps.segment_digest(segment_id),
            offset=0,
            length=size,
            rights=rights,
            min_term=min_term,
            max_skew_ms=max_skew_ms,
        )
    except caps.CapabilityError as error:
        raise MapRefused(f"map grant refused: {error}") from None
    if capability.offset != 0 or capability.length != size:
        raise MapRefused("a map grant covers a whole segment")
    if capability.tenant != caps.tenant_digest(tenant):
        raise MapRefused("the map grant is for another tenant than the segment's")
