"""Capabilities: what the master signs, a node accepts exactly that, and nothing else.

The rule lives in security/capabilities.py; nodes run the same rule in C on their UCX
progress thread (transport/ucp_helpers.c). Generated cases hold the two to the same answer.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvpool.security import capabilities as caps
from kvpool.transport.ucp import ffi, lib  # (loads libucp first)

KEY = bytes(range(32))
OLD_KEY = bytes(range(32, 64))
SEGMENT = "node-1/dram-0"
DIGEST = caps.segment_digest(SEGMENT)
NOW = 1_800_000_000_000
U64 = st.integers(0, caps.MAX_U64)


def ring() -> caps.KeyRing:
    return caps.KeyRing([(1, OLD_KEY), (2, KEY)], current=2)


def grant(
    offset: int = 4096,
    length: int = 8192,
    rights: caps.Rights = caps.Rights.WRITE,
    expiry_ms: int = NOW + 3000,
    term: int = 7,
    keys: caps.KeyRing | None = None,
) -> bytes:
    return (keys or ring()).grant(
        segment_id=SEGMENT,
        offset=offset,
        length=length,
        rights=rights,
        expiry_ms=expiry_ms,
        term=term,
        tenant="acme",
        grant_id=99,
    )


def verify(
    blob: bytes,
    offset: int = 4096,
    length: int = 8192,
    rights: caps.Rights = caps.Rights.WRITE,
    now_ms: int = NOW,
    min_term: int = 7,
    segment: bytes = DIGEST,
    keys: caps.KeyRing | None = None,
) -> caps.Capability:
    return (keys or ring()).verify(
        blob,
        now_ms=now_ms,
        segment=segment,
        offset=offset,
        length=length,
        rights=rights,
        min_term=min_term,
        max_skew_ms=1000,
    )


def test_a_granted_capability_verifies_with_every_field_it_was_granted_with() -> None:
    blob = grant()
    assert len(blob) == caps.SIZE
    capability = verify(blob)
    assert (capability.offset, capability.length, capability.rights) == (4096, 8192, 2)
    assert (capability.expiry_ms, capability.term, capability.grant_id) == (NOW + 3000, 7, 99)
    assert capability.segment == DIGEST and capability.tenant == caps.tenant_digest("acme")
    assert capability.key_id == 2


def test_every_single_bit_flip_is_refused() -> None:
    blob = grant()
    for bit in range(caps.SIZE * 8):
        flipped = bytearray(blob)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(caps.CapabilityError):
            verify(bytes(flipped))


FIELDS = [
    "rights",
    "key_id",
    "tenant",
    "segment",
    "offset",
    "length",
    "expiry_ms",
    "term",
    "grant_id",
]


@given(field=st.sampled_from(FIELDS), data=st.data())
def test_a_changed_field_under_the_old_tag_is_refused_as_forged(
    field: str, data: st.DataObject
) -> None:
    blob = grant()
    original = caps.parse(blob)
    values = {name: getattr(original, name) for name in FIELDS}
    if field == "rights":
        values[field] = caps.Rights(data.draw(st.sampled_from([1, 3])))
    elif field == "key_id":
        values[field] = 1  # another key the node holds: the tag no longer matches
    elif field in ("tenant", "segment"):
        values[field] = data.draw(
            st.binary(min_size=len(values[field]), max_size=len(values[field]))
        )
    elif field in ("offset", "length"):
        values[field] = data.draw(st.integers(1, 2**40))
    else:
        values[field] = data.draw(U64)
    changed = caps.Capability(**values)
    assume(changed != original)
    forged = changed.signed_bytes() + blob[caps.SIGNED_SIZE :]
    with pytest.raises(caps.Forged):
        verify(
            forged,
            offset=changed.offset,
            length=changed.length,
            rights=changed.rights,
            now_ms=0,
            min_term=0,
            segment=changed.segment,
        )


@given(
    offset=st.integers(0, 2**20),
    length=st.integers(1, 2**20),
    at=st.integers(0, 2**21),
    size=st.integers(0, 2**21),
)
def test_a_transfer_is_served_exactly_when_its_bytes_lie_inside_the_range(
    offset: int, length: int, at: int, size: int
) -> None:
    blob = grant(offset, length)
    inside = size > 0 and offset <= at and at + size <= offset + length
    if inside:
        assert verify(blob, at, size).covers(at, size)
    else:
        with pytest.raises(caps.OutOfRange):
            verify(blob, at, size)


def test_a_capability_lives_until_its_expiry_plus_the_skew_allowance() -> None:
    blob = grant(expiry_ms=NOW)
    verify(blob, now_ms=NOW + 1000)
    with pytest.raises(caps.Expired):
        verify(blob, now_ms=NOW + 1001)


def test_rights_term_segment_and_key_are_each_checked() -> None:
    with pytest.raises(caps.WrongRights):
        verify(grant(rights=caps.Rights.READ), rights=caps.Rights.WRITE)
    both = grant(rights=caps.Rights.READ | caps.Rights.WRITE)
    verify(both, rights=caps.Rights.READ)
    verify(both, rights=caps.Rights.WRITE)
    with pytest.raises(caps.StaleTerm):
        verify(grant(term=6), min_term=7)
    with pytest.raises(caps.OutOfRange):
        verify(grant(), segment=caps.segment_digest("node-1/dram-1"))
    stranger = caps.KeyRing([(9, bytes(32))], current=9)
    with pytest.raises(caps.UnknownKey):
        verify(grant(keys=stranger))


def test_rotation_accepts_the_previous_key_until_it_is_retired() -> None:
    keys = ring()
    old = caps.KeyRing([(1, OLD_KEY)], current=1)
    blob = grant(keys=old)
    assert verify(blob, keys=keys).key_id == 1
    with pytest.raises(ValueError, match="signs new grants"):
        keys.retire(2)
    keys.retire(1)
    with pytest.raises(caps.UnknownKey):
        verify(blob, keys=keys)
    assert verify(grant(keys=keys), keys=keys).key_id == 2


def test_a_key_ring_is_bounded_and_takes_only_well_formed_keys() -> None:
    keys = caps.KeyRing()
    with pytest.raises(caps.UnknownKey):
        keys.grant(
            segment_id="s",
            offset=0,
            length=1,
            rights=caps.Rights.READ,
            expiry_ms=1,
            term=1,
            tenant="t",
        )
    for key_id in range(caps.MAX_KEYS):
        keys.add(key_id, caps.KeyRing.new_secret())
    with pytest.raises(ValueError, match="at most"):
        keys.add(99, caps.KeyRing.new_secret())
    for bad in (b"", bytes(31), bytes(33)):
        with pytest.raises(ValueError, match="exactly 32"):
            caps.KeyRing([(1, bad)])
    with pytest.raises(ValueError, match="key id"):
        caps.KeyRing([(70000, KEY)])
    with pytest.raises(ValueError, match="other bytes"):
        caps.KeyRing([(1, KEY), (1, OLD_KEY)])


def test_parsing_is_strict() -> None:
    blob = grant()
    for size in (0, 1, caps.SIZE - 1, caps.SIZE + 1, 2 * caps.SIZE):
        with pytest.raises(caps.Malformed, match="exactly 84 bytes"):
            caps.parse((blob * 3)[:size])
    for version in (0, 2, 255):
        with pytest.raises(caps.Malformed, match="version"):
            caps.parse(bytes([version]) + blob[1:])
    for rights in (0, 4, 5, 0x80):
        with pytest.raises(caps.Malformed, match="rights"):
            caps.parse(blob[:1] + bytes([rights]) + blob[2:])
    empty = caps.Capability(2, caps.Rights.READ, bytes(8), DIGEST, 0, 0, NOW, 7, 0)
    wraps = caps.Capability(2, caps.Rights.READ, bytes(8), DIGEST, caps.MAX_U64, 1, NOW, 7, 0)
    for capability in (empty, wraps):
        with pytest.raises(caps.Malformed, match="not a range"):
            caps.parse(capability.signed_bytes() + bytes(caps.TAG_SIZE))
    with pytest.raises(caps.Malformed):
        ring().grant(
            segment_id=SEGMENT,
            offset=2**64 - 10,
            length=20,
            rights=caps.Rights.READ,
            expiry_ms=NOW,
            term=1,
            tenant="t",
        )


# ---------------------------------------------------------------- the C check agrees


def c_check(
    blob: bytes,
    keys: caps.KeyRing,
    *,
    min_term: int,
    now_ms: int,
    skew_ms: int,
    segment: bytes,
    offset: int,
    length: int,
    rights: int,
) -> int:
    ids = keys.key_ids()
    secrets = b"".join(keys.secret(key_id) for key_id in ids)
    return int(
        lib.kv_cap_check(
            blob,
            len(blob),
            ffi.new("uint16_t[]", ids or [0]),
            secrets or bytes(32),
            len(ids),
            min_term,
            now_ms,
            skew_ms,
            segment,
            offset,
            length,
            rights,
        )
    )


def python_code(
    blob: bytes,
    keys: caps.KeyRing,
    *,
    min_term: int,
    now_ms: int,
    skew_ms: int,
    segment: bytes,
    offset: int,
    length: int,
    rights: int,
) -> int:
    try:
        keys.verify(
            blob,
            now_ms=now_ms,
            segment=segment,
            offset=offset,
            length=length,
            rights=caps.Rights(rights),
            min_term=min_term,
            max_skew_ms=skew_ms,
        )
    except caps.CapabilityError as error:
        return int(error.refusal)
    return 0


@settings(max_examples=400)
@given(
    offset=st.integers(0, 2**63),
    length=st.integers(1, 2**62),
    rights=st.sampled_from([1, 2, 3]),
    expiry=U64,
    term=st.integers(0, 10),
    min_term=st.integers(0, 10),
    now=U64,
    skew=st.integers(0, 10**6),
    at=U64,
    size=U64,
    wanted=st.sampled_from([1, 2, 3]),
    other_segment=st.booleans(),
    mutate=st.integers(-1, caps.SIZE * 8 - 1),
    truncate=st.booleans(),
)
def test_the_node_check_in_c_gives_the_same_answer_as_the_reference(
    offset: int,
    length: int,
    rights: int,
    expiry: int,
    term: int,
    min_term: int,
    now: int,
    skew: int,
    at: int,
    size: int,
    wanted: int,
    other_segment: bool,
    mutate: int,
    truncate: bool,
) -> None:
    keys = ring()
    blob = bytearray(
        keys.grant(
            segment_id=SEGMENT,
            offset=offset,
            length=length,
            rights=caps.Rights(rights),
            expiry_ms=expiry,
            term=term,
            tenant="t",
        )
    )
    if mutate >= 0:
        blob[mutate // 8] ^= 1 << (mutate % 8)
    data = bytes(blob[:-1] if truncate else blob)
    if at % 3 == 0:  # often ask for a range near the granted one
        at, size = offset + at % 97, max(1, length - at % 89)
    args = dict(
        min_term=min_term,
        now_ms=now,
        skew_ms=skew,
        segment=caps.segment_digest("elsewhere") if other_segment else DIGEST,
        offset=at,
        length=size,
        rights=wanted,
    )
    assert c_check(data, keys, **args) == python_code(data, keys, **args)


@given(key=st.binary(max_size=100), message=st.binary(max_size=300))
def test_the_c_hmac_is_hmac_sha256(key: bytes, message: bytes) -> None:
    out = ffi.new("uint8_t[32]")
    lib.kv_hmac_sha256(key, len(key), message, len(message), out)
    assert bytes(out) == hmac.new(key, message, hashlib.sha256).digest()
