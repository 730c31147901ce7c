"""The checked stream's frames: what encodes parses back, and nothing malformed parses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.security import capabilities as caps
from kvpool.transport import checked_frames as frames

CAPABILITY = bytes(range(caps.SIZE))


def test_a_request_round_trips():
    header = frames.encode_request(frames.Op.WRITE, 7, CAPABILITY, 4096, 8192)
    assert len(header) == frames.REQUEST_SIZE
    assert frames.parse_request(header) == frames.Request(
        frames.Op.WRITE, 7, CAPABILITY, 4096, 8192
    )


def test_a_reply_round_trips():
    header = frames.encode_reply(9, frames.Status.EXPIRED, 0)
    assert len(header) == frames.REPLY_SIZE
    assert frames.parse_reply(header) == frames.Reply(9, frames.Status.EXPIRED, 0)


def test_capability_refusals_keep_their_numbers():
    for refusal in caps.Refusal:
        assert frames.REFUSAL_STATUS[refusal].value == refusal.value


def _with(header: bytes, at: int, value: bytes) -> bytes:
    return header[:at] + value + header[at + len(value) :]


GOOD = frames.encode_request(frames.Op.READ, 1, CAPABILITY, 0, 64)


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (GOOD[:-1], "116 bytes"),
        (GOOD + b"\0", "116 bytes"),
        (_with(GOOD, 0, b"HTTP"), "magic"),
        (_with(GOOD, 4, b"\x02"), "version"),
        (_with(GOOD, 5, b"\x03"), "unknown operation"),
        (_with(GOOD, 5, b"\x00"), "unknown operation"),
        (_with(GOOD, 6, b"\x00\x01"), "reserved"),
        (frames.encode_request(frames.Op.READ, 1, CAPABILITY, 0, 0), "1 to"),
        (frames.encode_request(frames.Op.READ, 1, CAPABILITY, 0, frames.MAX_LENGTH + 1), "1 to"),
        (frames.encode_request(frames.Op.READ, 1, CAPABILITY, caps.MAX_U64, 1), "wrap"),
    ],
)
def test_malformed_requests_are_refused_with_a_reason(header, problem):
    with pytest.raises(frames.FrameError, match=problem):
        frames.parse_request(header)


def test_a_reply_with_an_unknown_status_or_too_long_is_refused():
    with pytest.raises(frames.FrameError, match="unknown reply status"):
        frames.parse_reply(_with(frames.encode_reply(1, frames.Status.OK), 6, b"\x00\x63"))
    with pytest.raises(frames.FrameError, match="more than"):
        frames.parse_reply(frames.encode_reply(1, frames.Status.OK, 1 << 41))


def test_a_capability_of_the_wrong_size_is_not_encoded():
    with pytest.raises(frames.FrameError, match="84 bytes"):
        frames.encode_request(frames.Op.READ, 1, b"short", 0, 1)


@given(st.binary(min_size=frames.REQUEST_SIZE, max_size=frames.REQUEST_SIZE))
def test_any_header_parses_or_raises_frame_error(header):
    try:
        request = frames.parse_request(header)
    except frames.FrameError:
        return
    assert request.op in (frames.Op.READ, frames.Op.WRITE)
    assert 0 < request.length <= frames.MAX_LENGTH
