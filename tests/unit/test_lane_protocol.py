"""The metadata lane's frames (common/lane_protocol.py): what goes in comes out, whatever the
chunking; errors carry their details and leader; garbage is refused, never trusted."""

from __future__ import annotations

import grpc
import pytest

from kvpool.common import lane_protocol as lp
from kvpool.common.limits import MESSAGE_LIMIT
from kvpool.proto import master_pb2 as pb


def test_frames_survive_any_chunking_of_the_stream():
    request = pb.ExistsRequest(keys=[f"key-{i}" for i in range(100)], lease_ms=5)
    stream = (
        lp.encode(7, lp.METHOD_IDS["Exists"], request.SerializeToString())
        + lp.encode(8, lp.METHOD_IDS["PutEnd"], b"")
        + lp.encode_error(9, lp.METHOD_IDS["PutStart"], lp.UNAVAILABLE, "busy")
    )
    for chunk in (1, 3, 64, len(stream)):
        decoder = lp.FrameDecoder()
        frames = []
        for start in range(0, len(stream), chunk):
            frames += decoder.feed(stream[start : start + chunk])
        assert [f.call_id for f in frames] == [7, 8, 9]
        assert pb.ExistsRequest.FromString(frames[0].body) == request
        assert frames[1].body == b"" and frames[1].status == lp.OK
        assert frames[2].status == lp.UNAVAILABLE


def test_the_decoder_tells_the_size_the_frame_still_arriving_announced():
    decoder = lp.FrameDecoder()
    frame = lp.encode(1, lp.METHOD_IDS["Exists"], bytes(1000))
    assert decoder.feed(frame[: lp.HEADER.size - 1]) == [] and decoder.announced == 0
    assert decoder.feed(frame[lp.HEADER.size - 1 : 500]) == [] and decoder.announced == 1000
    assert len(decoder.feed(frame[500:] + frame[:3])) == 1 and decoder.announced == 0
    decoder.feed(frame[3:20])
    assert decoder.announced == 1000


def test_an_error_frame_carries_its_details_and_the_leader_hint():
    data = lp.encode_error(1, lp.NODE_SESSION, lp.FAILED_PRECONDITION, "not the leader", "m2:5")
    [frame] = lp.FrameDecoder().feed(data)
    assert frame.error() == ("not the leader", "m2:5")
    [frame] = lp.FrameDecoder().feed(lp.encode_error(1, 1, lp.INTERNAL, "boom"))
    assert frame.error() == ("boom", "")


def test_a_length_beyond_the_limit_is_refused_as_a_foreign_peer():
    header = lp.HEADER.pack(MESSAGE_LIMIT + 1, 1, 1, 0)
    with pytest.raises(lp.LaneProtocolError, match="exceeds"):
        lp.FrameDecoder().feed(header)
    with pytest.raises(lp.LaneProtocolError):
        lp.FrameDecoder().feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # not a lane client


def test_lane_methods_are_master_rpcs_with_the_same_messages():
    service = pb.DESCRIPTOR.services_by_name["Master"]
    for name, request_type, response_type in lp.LANE_METHODS.values():
        method = service.methods_by_name[name]
        assert method.input_type.full_name == request_type.DESCRIPTOR.full_name
        assert method.output_type.full_name == response_type.DESCRIPTOR.full_name
    assert service.methods_by_name["NodeSession"].client_streaming


def test_status_numbers_are_grpcs():
    for name in ("OK", "CANCELLED", "DEADLINE_EXCEEDED", "FAILED_PRECONDITION",
                 "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "UNAVAILABLE", "INTERNAL",
                 "UNIMPLEMENTED"):  # fmt: skip
        assert getattr(lp, name) == getattr(grpc.StatusCode, name).value[0]
