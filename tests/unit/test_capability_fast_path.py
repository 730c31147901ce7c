"""The node's fast paths agree with the full rules: ``KeyRing.check`` accepts exactly what
``KeyRing.verify`` accepts (and says the same of the capability), and the frames' unpackers
accept exactly what the parsers accept.

A node checks every transfer with ``check`` (no objects made: issue 17's small transfers) and
asks ``verify`` only for a refusal's reason; a disagreement would let through what the rule
refuses. Generated capabilities, requests and their alterations hold the two to one answer.
"""

from __future__ import annotations

import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.security import capabilities as caps
from kvpool.transport import checked_frames as frames

KEY = bytes(range(32))
SEGMENT = "node-1/dram-0"
DIGEST = caps.segment_digest(SEGMENT)
NOW = 1_800_000_000_000
RING = caps.KeyRing([(1, bytes(range(32, 64))), (2, KEY)], current=2)
U64 = st.integers(0, caps.MAX_U64)


def test_the_tag_is_hmac_sha256_of_the_domain_and_the_signed_bytes():
    signed = bytes(range(caps.SIGNED_SIZE))
    expected = hmac.new(KEY, caps.DOMAIN + signed, "sha256").digest()[: caps.TAG_SIZE]
    assert caps._tag(KEY, signed) == expected
    assert caps._tag(KEY, memoryview(signed)) == expected


@settings(max_examples=400, deadline=None)
@given(
    offset=st.integers(0, 1 << 40),
    length=st.integers(1, 1 << 30),
    rights=st.sampled_from(
        [caps.Rights.READ, caps.Rights.WRITE, caps.Rights.READ | caps.Rights.WRITE]
    ),
    expiry=st.integers(NOW - 5_000, NOW + 5_000),
    term=st.integers(0, 3),
    grant_id=U64,
    ask_offset=st.integers(0, 1 << 40),
    ask_length=st.integers(0, 1 << 30),
    ask_rights=st.sampled_from([1, 2, 3]),
    min_term=st.integers(0, 3),
    altered=st.one_of(st.none(), st.tuples(st.integers(0, caps.SIZE - 1), st.integers(1, 255))),
)
def test_check_accepts_exactly_what_verify_accepts(
    offset, length, rights, expiry, term, grant_id, ask_offset, ask_length, ask_rights,
    min_term, altered,
):  # fmt: skip
    blob = RING.grant(
        segment_id=SEGMENT,
        offset=offset,
        length=length,
        rights=rights,
        expiry_ms=expiry,
        term=term,
        tenant="t",
        grant_id=grant_id,
    )
    if altered is not None:
        at, flip = altered
        blob = blob[:at] + bytes([blob[at] ^ flip]) + blob[at + 1 :]
    if ask_offset % 3 == 0:  # (often inside the grant: the interesting side)
        ask_offset = offset + ask_offset % max(1, length)
    checked = RING.check(
        blob,
        now_ms=NOW,
        offset=ask_offset,
        length=ask_length,
        rights=ask_rights,
        min_term=min_term,
        max_skew_ms=1000,
    )
    try:
        capability = caps.parse(blob)
        verified = RING.verify(
            blob,
            now_ms=NOW,
            segment=capability.segment,
            offset=ask_offset,
            length=ask_length,
            rights=caps.Rights(ask_rights),
            min_term=min_term,
            max_skew_ms=1000,
        )
    except caps.CapabilityError:
        assert checked is None
        return
    assert checked == (verified.segment, verified.offset, verified.expiry_ms, verified.grant_id)


@settings(max_examples=300, deadline=None)
@given(
    op=st.integers(0, 3),
    request_id=U64,
    offset=U64,
    length=U64,
    altered=st.one_of(
        st.none(), st.tuples(st.integers(0, frames.REQUEST_SIZE - 1), st.integers(1, 255))
    ),
)
def test_unpack_request_accepts_exactly_what_parse_request_accepts(
    op, request_id, offset, length, altered
):
    header = bytearray(
        frames._REQUEST.pack(
            frames.REQUEST_MAGIC,
            frames.VERSION,
            op,
            0,
            request_id,
            bytes(caps.SIZE),
            offset,
            length,
        )
    )
    if altered is not None:
        header[altered[0]] ^= altered[1]
    buffer = bytearray(7) + header  # (at an offset in a larger buffer, as a node reads it)
    try:
        parsed = frames.parse_request(bytes(header))
    except frames.FrameError:
        try:
            frames.unpack_request(buffer, 7)
        except frames.FrameError:
            return
        raise AssertionError("unpack_request accepted what parse_request refuses") from None
    assert frames.unpack_request(buffer, 7) == (
        int(parsed.op),
        parsed.request_id,
        parsed.capability,
        parsed.offset,
        parsed.length,
    )


@settings(max_examples=300, deadline=None)
@given(
    status=st.integers(0, 40),
    request_id=U64,
    length=U64,
    altered=st.one_of(
        st.none(), st.tuples(st.integers(0, frames.REPLY_SIZE - 1), st.integers(1, 255))
    ),
)
def test_unpack_reply_accepts_exactly_what_parse_reply_accepts(status, request_id, length, altered):
    header = bytearray(
        frames._REPLY.pack(frames.REPLY_MAGIC, frames.VERSION, 0, status, request_id, length)
    )
    if altered is not None:
        header[altered[0]] ^= altered[1]
    try:
        parsed = frames.parse_reply(bytes(header))
    except frames.FrameError:
        try:
            frames.unpack_reply(header, 0)
        except frames.FrameError:
            return
        raise AssertionError("unpack_reply accepted what parse_reply refuses") from None
    assert frames.unpack_reply(header, 0) == (int(parsed.status), parsed.request_id, parsed.length)
