"""The metadata lane's wire format: length-prefixed frames carrying the gRPC service's own
protobuf messages (sans-IO: bytes in, frames out).

Why a second protocol: a put or get of small objects is a chain of metadata calls, and a
Python gRPC unary call costs several times a framed request on a kept-open TCP connection
before any handler runs (a poller thread hands every message to the event loop and back;
docs/benchmarks.md has the figures). The lane carries only the hot calls (``LANE_METHODS``)
and the storage nodes' command streams; everything else, and every client or node that
cannot reach the lane, uses gRPC with the same semantics: the same messages, status codes
and leader hints.

A frame is ``HEADER`` (body length, call id, method, status) then the body. A request has
status 0 and the request message as body; its answer carries the same call id and either
status 0 and the response message, or a gRPC status code and ``details NUL leader`` in UTF-8
(``leader``: where a standby says the leader is, else empty). On a node session the first
frame (method ``NodeSession``) holds the node's hello and every later frame one
``NodeReport`` (node to master) or ``NodeCommand`` (master to node).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpool.common.limits import MESSAGE_LIMIT
from kvpool.proto import master_pb2 as pb

if TYPE_CHECKING:
    from google.protobuf.message import Message

#: A frame's body holds at most MESSAGE_LIMIT bytes, as a gRPC message does.
HEADER = struct.Struct("<IIBB")  # body length, call id, method, status

#: The methods the lane carries, by wire number: (name, request type, response type).
LANE_METHODS: dict[int, tuple[str, type[Message], type[Message]]] = {
    1: ("PutStart", pb.PutStartRequest, pb.PutStartResponse),
    2: ("PutEnd", pb.PutEndRequest, pb.PutEndResponse),
    3: ("PutRevoke", pb.PutRevokeRequest, pb.PutRevokeResponse),
    4: ("GetReplicas", pb.GetReplicasRequest, pb.GetReplicasResponse),
    5: ("Exists", pb.ExistsRequest, pb.ExistsResponse),
    6: ("Remove", pb.RemoveRequest, pb.RemoveResponse),
}
NODE_SESSION = 100
METHOD_IDS = {name: number for number, (name, _, _) in LANE_METHODS.items()}

#: gRPC status codes by number (``grpc.StatusCode.X.value[0]``), without importing grpc.
OK = 0
CANCELLED = 1
DEADLINE_EXCEEDED = 4
FAILED_PRECONDITION = 9
RESOURCE_EXHAUSTED = 8
INVALID_ARGUMENT = 3
UNAVAILABLE = 14
INTERNAL = 13
UNIMPLEMENTED = 12


class LaneProtocolError(Exception):
    """The peer sent something that is not a lane frame: the connection must be dropped."""


class LaneUnreachable(Exception):
    """No connection to the lane could be made (refused, timed out): the caller, a client or a
    storage node, uses gRPC instead."""


@dataclass(frozen=True, slots=True)
class Frame:
    call_id: int
    method: int
    status: int
    body: bytes

    def error(self) -> tuple[str, str]:
        """(details, leader hint) of an error frame."""
        details, _, leader = self.body.decode("utf-8", "replace").partition("\0")
        return details, leader


def encode(call_id: int, method: int, body: bytes, status: int = OK) -> bytes:
    if len(body) > MESSAGE_LIMIT:
        raise ValueError(f"a lane frame holds at most {MESSAGE_LIMIT} bytes, got {len(body)}")
    return HEADER.pack(len(body), call_id, method, status) + body


def encode_error(call_id: int, method: int, status: int, details: str, leader: str = "") -> bytes:
    return encode(call_id, method, f"{details}\0{leader}".encode(), status)


class FrameDecoder:
    """Turns a byte stream into frames, whatever the chunking."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        buffer = self._buffer
        buffer += data
        frames = []
        position = 0
        while len(buffer) - position >= HEADER.size:
            length, call_id, method, status = HEADER.unpack_from(buffer, position)
            if length > MESSAGE_LIMIT:
                raise LaneProtocolError(f"frame of {length} bytes exceeds {MESSAGE_LIMIT}")
            end = position + HEADER.size + length
            if len(buffer) < end:
                break
            frames.append(Frame(call_id, method, status, bytes(buffer[end - length : end])))
            position = end
        if position:
            del buffer[:position]
        return frames
