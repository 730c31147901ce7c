"""Capabilities: the master's signed permission to touch one range of one segment.

The data path must not trust whoever talks to it. With each reservation (``PutStart``) and
each read lease (``GetReplicas``) the master grants a capability for exactly that range:
segment, offset, length, rights (read or write), expiry, the master's term and the tenant,
signed with a key that masters and nodes share (delivered to nodes over their authenticated
session). A node serves a transfer only under a valid capability that covers every byte it
touches, and only until the capability expires. This module is the whole rule, sans-IO: the
master grants with it; a node checks with it, or with the same rule in C on its UCX progress
thread (``transport/ucp_helpers.c``, ``kv_cap_check_core``: the unit tests hold the two to
the same answers).

**The encoding** is fixed-size, big-endian, ``SIZE`` bytes: version, rights, key id, tenant
digest, segment digest, offset, length, expiry, term, grant id, then a tag: HMAC-SHA256 over
``DOMAIN`` and every other byte, truncated to 128 bits. Segments and tenants travel as
digests (SHA-256 of their names, truncated) so that the capability stays small and of one
size whatever the names; a node knows its segments' names and compares digests. Parsing is
strict: the exact size, a known version, no unknown rights bit, a non-empty range that does
not wrap.

**Expiry and clocks.** The expiry is an absolute time on the master's wall clock, in
milliseconds since the Unix epoch. A node compares it with its estimate of the master's
clock (its own wall clock plus an offset it may learn over its session) and accepts a
capability up to ``max_skew_ms`` after its expiry: that allowance covers how far the node's
estimate may lag the master's clock. A time-to-live that the node would anchor when it first
sees a capability is not used: whoever holds a capability could present it late and stretch
its life at will. The price of wall-clock expiry is the allowance, and the master pays it:
it must not hand a granted range to anyone else before the capability's expiry plus
``max_skew_ms`` plus the longest a transfer that started in time may still run (the write
timeout for writes). A node whose clock is off by more than the allowance refuses valid
capabilities (or accepts expired ones for longer): keep node clocks synchronised.

**Keys** are 32 random bytes with a 16-bit id; a ``KeyRing`` holds at most ``MAX_KEYS`` of
them. Rotation: add the new key on every node, then make it current on the masters (grants
use it from then on), then retire the old key once the last capability it signed has
expired (plus the skew allowance). Masters hold the keys; each node holds keys derived from
them for its own node id (``node_purpose``), and a master signs for a segment with its node's
keys: what one node's keys sign, every other node refuses.

**What a capability does not do**: it is a bearer token for its range and lifetime, not
bound to the client that received it (UCX connections are not authenticated); anyone who
observes it on the network may use it for that range until it expires. Transfers over UCX's
TCP transport are not encrypted either.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Any, ClassVar

VERSION = 1
#: Size of an encoded capability, tag included.
SIZE = 84
#: Bytes of HMAC-SHA256 kept in the tag.
TAG_SIZE = 16
#: What the tag covers, after ``DOMAIN``: every byte but the tag.
SIGNED_SIZE = SIZE - TAG_SIZE
#: Separates capability tags from any other MAC made with the same key.
DOMAIN = b"kvpool capability v1"
KEY_SIZE = 32
MAX_KEYS = 4
MAX_KEY_ID = 0xFFFF
MAX_U64 = 2**64 - 1
TENANT_DIGEST_SIZE = 8
SEGMENT_DIGEST_SIZE = 16
#: Default allowance for the node's estimate of the master's clock lagging behind it.
DEFAULT_MAX_SKEW_MS = 1000

_LAYOUT = struct.Struct(">BBH8s16sQQQQQ")  # everything the tag covers
assert _LAYOUT.size == SIGNED_SIZE


class Rights(IntFlag):
    READ = 1
    WRITE = 2


_ALL_RIGHTS = int(Rights.READ | Rights.WRITE)


class Refusal(IntEnum):
    """Why a capability was refused; the same numbers as the C check's codes."""

    MALFORMED = 1
    UNKNOWN_KEY = 2
    FORGED = 3
    STALE_TERM = 4
    EXPIRED = 5
    OUT_OF_RANGE = 6
    WRONG_RIGHTS = 7


class CapabilityError(Exception):
    """A capability was refused; ``refusal`` says why."""

    refusal: ClassVar[Refusal]


class Malformed(CapabilityError):
    refusal = Refusal.MALFORMED


class UnknownKey(CapabilityError):
    refusal = Refusal.UNKNOWN_KEY


class Forged(CapabilityError):
    refusal = Refusal.FORGED


class StaleTerm(CapabilityError):
    refusal = Refusal.STALE_TERM


class Expired(CapabilityError):
    refusal = Refusal.EXPIRED


class OutOfRange(CapabilityError):
    refusal = Refusal.OUT_OF_RANGE


class WrongRights(CapabilityError):
    refusal = Refusal.WRONG_RIGHTS


ERRORS: dict[Refusal, type[CapabilityError]] = {
    error.refusal: error
    for error in (Malformed, UnknownKey, Forged, StaleTerm, Expired, OutOfRange, WrongRights)
}


@functools.lru_cache(maxsize=4096)  # (a master grants for its few segments many times)
def segment_digest(segment_id: str) -> bytes:
    """How a capability names a segment."""
    return hashlib.sha256(b"kvpool segment\0" + segment_id.encode()).digest()[:SEGMENT_DIGEST_SIZE]


@functools.lru_cache(maxsize=4096)
def tenant_digest(tenant: str) -> bytes:
    """How a capability names a tenant (for the node's logs and counters)."""
    return hashlib.sha256(b"kvpool tenant\0" + tenant.encode()).digest()[:TENANT_DIGEST_SIZE]


@dataclass(frozen=True, slots=True)
class Capability:
    """The fields of a capability (``parse`` and ``KeyRing.verify`` make them)."""

    key_id: int
    rights: Rights
    tenant: bytes
    segment: bytes
    offset: int
    length: int
    expiry_ms: int
    term: int
    grant_id: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    def covers(self, offset: int, length: int) -> bool:
        """Whether ``length`` bytes at ``offset`` lie inside this capability's range."""
        return length > 0 and self.offset <= offset and offset + length <= self.end

    def signed_bytes(self) -> bytes:
        """The encoding without its tag (what the tag covers, after ``DOMAIN``)."""
        return _LAYOUT.pack(
            VERSION,
            int(self.rights),
            self.key_id,
            self.tenant,
            self.segment,
            self.offset,
            self.length,
            self.expiry_ms,
            self.term,
            self.grant_id,
        )


def _check_range(offset: int, length: int, what: str) -> None:
    if not 0 <= offset <= MAX_U64 or not 0 < length <= MAX_U64 or offset + length > MAX_U64:
        raise Malformed(f"{what}: {length} bytes at offset {offset} is not a range of a segment")


def parse(blob: bytes) -> Capability:
    """The fields of an encoded capability, checked for form only (not for its tag)."""
    if not isinstance(blob, bytes | bytearray | memoryview) or len(blob) != SIZE:
        size = len(blob) if isinstance(blob, bytes | bytearray | memoryview) else "no"
        raise Malformed(f"a capability is exactly {SIZE} bytes, got {size}")
    fields = _LAYOUT.unpack_from(blob)
    version, rights, key_id, tenant, segment, offset, length, expiry_ms, term, grant_id = fields
    if version != VERSION:
        raise Malformed(f"capability version {version}, this node knows version {VERSION}")
    if rights == 0 or rights & ~_ALL_RIGHTS:  # (an int: ~ on an IntFlag stays in it)
        raise Malformed(f"capability rights {rights:#x} are not read and/or write")
    _check_range(offset, length, "capability")
    return Capability(
        key_id, Rights(rights), tenant, segment, offset, length, expiry_ms, term, grant_id
    )


def _tag(secret: bytes, signed: bytes | memoryview) -> bytes:
    """HMAC-SHA256 of ``DOMAIN + signed`` under ``secret``, cut to ``TAG_SIZE``: from the
    key's inner and outer hash states, made once (copies of them cost a fraction of a new
    HMAC, and of ``hmac.HMAC.copy``: a node verifies one per transfer)."""
    inner_state, outer_state = _keyed(secret)
    inner = inner_state.copy()
    inner.update(signed)
    outer = outer_state.copy()
    outer.update(inner.digest())
    return outer.digest()[:TAG_SIZE]


def node_purpose(node_id: str) -> bytes:
    """What a node's keys are derived for (``KeyRing.derived``): its node id."""
    return b"kvpool node keys\0" + node_id.encode()


@functools.lru_cache(maxsize=4096)  # (a master signs with every node's keys)
def _keyed(secret: bytes) -> tuple[Any, Any]:
    """The HMAC-SHA256 states of ``secret`` (RFC 2104): inner after ``DOMAIN``, outer."""
    block = secret.ljust(hashlib.sha256().block_size, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in block) + DOMAIN)
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
    return inner, outer


class KeyRing:
    """The signing keys a master grants with and a node checks with (at most ``MAX_KEYS``).

    ``current`` is the key new grants use; the others are still accepted, so that a key can
    be rotated without refusing capabilities granted just before."""

    def __init__(self, keys: Iterable[tuple[int, bytes]] = (), current: int | None = None):
        self._keys: dict[int, bytes] = {}
        self._current: int | None = None
        for key_id, secret in keys:
            self.add(key_id, secret)
        if current is not None:
            self.activate(current)

    def derived(self, purpose: bytes) -> KeyRing:
        """The same key ids with secrets derived for ``purpose`` (HMAC-SHA256 of it under
        each secret): what one purpose signs, another's check refuses as forged (a grant to
        map a whole segment is never a transfer capability, nor the other way round)."""
        return KeyRing(
            (
                (key_id, hmac.new(secret, purpose, hashlib.sha256).digest())
                for key_id, secret in self._keys.items()
            ),
            current=self._current,
        )

    @staticmethod
    def new_secret() -> bytes:
        return os.urandom(KEY_SIZE)

    @property
    def current(self) -> int | None:
        return self._current

    def key_ids(self) -> list[int]:
        return sorted(self._keys)

    def secret(self, key_id: int) -> bytes:
        """A key's bytes, to hand to a node over its authenticated session."""
        try:
            return self._keys[key_id]
        except KeyError:
            raise UnknownKey(f"no key {key_id} in this key ring") from None

    def add(self, key_id: int, secret: bytes) -> None:
        if not isinstance(key_id, int) or not 0 <= key_id <= MAX_KEY_ID:
            raise ValueError(f"a key id is an integer from 0 to {MAX_KEY_ID}, got {key_id!r}")
        if not isinstance(secret, bytes) or len(secret) != KEY_SIZE:
            raise ValueError(f"a capability key is exactly {KEY_SIZE} bytes")
        if key_id not in self._keys and len(self._keys) >= MAX_KEYS:
            raise ValueError(
                f"a key ring holds at most {MAX_KEYS} keys: retire one (keys "
                f"{self.key_ids()}) before adding key {key_id}"
            )
        if key_id in self._keys and self._keys[key_id] != secret:
            raise ValueError(f"key {key_id} is already held with other bytes: use a new id")
        self._keys[key_id] = secret

    def activate(self, key_id: int) -> None:
        """Makes ``key_id`` the key new grants are signed with."""
        self.secret(key_id)
        self._current = key_id

    def retire(self, key_id: int) -> None:
        """Stops accepting ``key_id`` (wait until what it signed has expired)."""
        if key_id == self._current:
            raise ValueError(f"key {key_id} signs new grants: activate another one first")
        self._keys.pop(key_id, None)

    def grant(
        self,
        *,
        segment_id: str,
        offset: int,
        length: int,
        rights: Rights,
        expiry_ms: int,
        term: int,
        tenant: str,
        grant_id: int = 0,
    ) -> bytes:
        """An encoded capability for ``length`` bytes at ``offset`` of ``segment_id``,
        valid until ``expiry_ms`` on the master's wall clock."""
        signed = self.granter(rights=rights, expiry_ms=expiry_ms, term=term, tenant=tenant)
        return signed(segment_id, offset, length, grant_id)

    def granter(
        self, *, rights: Rights, expiry_ms: int, term: int, tenant: str
    ) -> Callable[[str, int, int, int], bytes]:
        """``grant`` for many ranges of one call: what they share (key, rights, expiry,
        term, tenant) checked and packed once; the result takes ``(segment_id, offset,
        length, grant_id)`` and returns the same bytes ``grant`` would."""
        if self._current is None:
            raise UnknownKey("this key ring has no current key to grant with")
        if not isinstance(rights, Rights) or not rights:
            raise ValueError(f"rights must be Rights.READ and/or Rights.WRITE, got {rights!r}")
        for name, value in (("expiry_ms", expiry_ms), ("term", term)):
            if not isinstance(value, int) or not 0 <= value <= MAX_U64:
                raise ValueError(f"{name} must be an integer from 0 to 2**64-1, got {value!r}")
        key_id, rights_value, tenant_bytes = self._current, int(rights), tenant_digest(tenant)
        inner_state, outer_state = _keyed(self._keys[key_id])
        pack = _LAYOUT.pack

        def grant(segment_id: str, offset: int, length: int, grant_id: int) -> bytes:
            _check_range(offset, length, "grant")
            if not isinstance(grant_id, int) or not 0 <= grant_id <= MAX_U64:
                raise ValueError(f"grant_id must be from 0 to 2**64-1, got {grant_id!r}")
            signed = pack(
                VERSION,
                rights_value,
                key_id,
                tenant_bytes,
                segment_digest(segment_id),
                offset,
                length,
                expiry_ms,
                term,
                grant_id,
            )
            inner = inner_state.copy()
            inner.update(signed)
            outer = outer_state.copy()
            outer.update(inner.digest())
            return signed + outer.digest()[:TAG_SIZE]

        return grant

    def check(
        self,
        blob: bytes,
        now_ms: int,
        offset: int,
        length: int,
        rights: int,
        min_term: int,
        max_skew_ms: int,
    ) -> tuple[bytes, int, int, int] | None:
        """``verify``'s fast path for a node's every transfer: (segment digest, offset,
        expiry_ms, grant id) of the capability in ``blob`` if it lets its holder touch
        ``length`` bytes at ``offset`` of the segment it names with ``rights`` now; None
        when ``verify`` would refuse it (call it then, for the reason). No object made."""
        if len(blob) != SIZE:
            return None
        version, granted, key_id, _, segment, start, size, expiry_ms, term, grant_id = (
            _LAYOUT.unpack_from(blob)
        )
        states = _keyed(secret) if (secret := self._keys.get(key_id)) is not None else None
        if (
            states is None
            or version != VERSION
            or granted & rights != rights
            or granted & ~_ALL_RIGHTS
            or term < min_term
            or now_ms > expiry_ms + max_skew_ms
            or length <= 0
            or offset < start
            or offset + length > start + size
            or start + size > MAX_U64
        ):
            return None
        inner = states[0].copy()  # (``_tag``, inline: one call less per transfer)
        inner.update(blob[:SIGNED_SIZE])
        outer = states[1].copy()
        outer.update(inner.digest())
        if not hmac.compare_digest(outer.digest()[:TAG_SIZE], blob[SIGNED_SIZE:]):
            return None
        return segment, start, expiry_ms, grant_id

    def verify(
        self,
        blob: bytes,
        *,
        now_ms: int,
        segment: bytes,
        offset: int,
        length: int,
        rights: Rights,
        min_term: int = 0,
        max_skew_ms: int = DEFAULT_MAX_SKEW_MS,
    ) -> Capability:
        """The capability in ``blob`` if it lets its holder touch ``length`` bytes at
        ``offset`` of the segment with digest ``segment`` with ``rights``, now (``now_ms``:
        the master's wall clock as the caller estimates it); raises the ``CapabilityError``
        of the first check that fails, in the order of ``Refusal``."""
        capability = parse(blob)
        secret = self._keys.get(capability.key_id)
        if secret is None:
            raise UnknownKey(
                f"capability signed with key {capability.key_id}, which this node does not "
                f"hold (it holds {self.key_ids()}): its key ring is behind the master's"
            )
        if not hmac.compare_digest(_tag(secret, bytes(blob[:SIGNED_SIZE])), blob[SIGNED_SIZE:]):
            raise Forged("capability tag does not match its contents: altered or forged")
        if capability.term < min_term:
            raise StaleTerm(
                f"capability of master term {capability.term}, older than term {min_term}"
            )
        if now_ms > capability.expiry_ms + max_skew_ms:
            raise Expired(
                f"capability expired at {capability.expiry_ms} ms, now {now_ms} ms "
                f"(allowance {max_skew_ms} ms): ask the master again"
            )
        if capability.segment != segment:
            raise OutOfRange("capability is for another segment")
        if not capability.covers(offset, length):
            raise OutOfRange(
                f"{length} bytes at offset {offset} are not inside the capability's range "
                f"[{capability.offset}, {capability.end})"
            )
        if capability.rights & rights != rights:
            raise WrongRights(
                f"capability grants {capability.rights!r}, the transfer needs {rights!r}"
            )
        return capability
