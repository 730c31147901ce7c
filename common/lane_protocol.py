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
(``leader``: where a standby says the leader is, else empty). A master that checks
credentials reads an ``AUTH`` frame first (a bearer token), no larger than ``AUTH_LIMIT``.
On a node session the next frame (method ``NodeSession``) holds the node's hello and every
later frame one ``NodeReport`` (node to master) or ``NodeCommand`` (master to node).

A frame is refused at its header when it announces more than its reader accepts: the master
reads requests of at most ``REQUEST_LIMIT`` bytes (the largest legal call) and, on a node's
command stream, reports of at most ``REPORT_LIMIT``; clients and nodes read the master's
answers and commands up to ``MESSAGE_LIMIT``, as gRPC does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpool.common.keys import MAX_KEY_BYTES
from kvpool.common.limits import MESSAGE_LIMIT
from kvpool.proto import master_pb2 as pb

if TYPE_CHECKING:
    from google.protobuf.message import Message

HEADER = struct.Struct("<IIBB")  # body length, call id, method, status

#: Keys one call carries at most (the master refuses more: master/handlers.py's MAX_BATCH,
#: which a test holds equal to this). Each call runs on the master's event loop between
#: every other, so this bounds how long one holds the rest; the client cuts larger batches
#: into calls of this size (client/batch_split.py), and a node its mount report.
MAX_BATCH_KEYS = 4096
#: What a request spends per key besides the key itself, at most: the key's tag and length,
#: its size or put id (a varint of up to 10 bytes), and in a PutCommit the message's own tag
#: and length, put id, CRC and one flag per replica.
PER_KEY_OVERHEAD = 64
#: Everything else in a request: the client id, preferred hosts, options.
REQUEST_ENVELOPE = 64 * 1024
#: The largest request body the master reads: a full batch of the longest keys.
REQUEST_LIMIT = MAX_BATCH_KEYS * (MAX_KEY_BYTES + PER_KEY_OVERHEAD) + REQUEST_ENVELOPE


def too_large(method: str, size: int) -> str:
    """What a client says of a request larger than REQUEST_LIMIT, before sending it."""
    return (
        f"the {method} request is {size} bytes, more than the master reads ({REQUEST_LIMIT} "
        f"bytes: {MAX_BATCH_KEYS} keys of up to {MAX_KEY_BYTES} bytes): split the batch"
    )


#: The largest NodeReport body the master reads on a command stream: a command's result holds
#: a CRC (a varint of up to 5 bytes) per object of a full batch, and an error message the
#: node cuts to ``REPORT_ERROR_CHARS``.
REPORT_ERROR_CHARS = 4096
REPORT_LIMIT = MAX_BATCH_KEYS * 8 + REQUEST_ENVELOPE

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
#: The first frame of every connection to a master that checks credentials: its body is
#: the caller's bearer token in UTF-8 (empty when a client certificate proves who it is).
#: Answered with an empty body, or UNAUTHENTICATED (and the connection closed).
AUTH = 99
#: The largest frame the master reads before the caller is authenticated.
AUTH_LIMIT = 8192
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
UNAUTHENTICATED = 16
PERMISSION_DENIED = 7


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
    """Turns a byte stream into frames, whatever the chunking. A header announcing a body of
    more than ``limit`` bytes raises LaneProtocolError before any of that body is kept."""

    def __init__(self, limit: int = MESSAGE_LIMIT) -> None:
        #: The largest body accepted (may be changed between feeds: a node's stream lowers it).
        self.limit = limit
        self._buffer = bytearray()

    @property
    def pending(self) -> bool:
        """Part of a frame has arrived and the rest has not."""
        return bool(self._buffer)

    @property
    def announced(self) -> int:
        """The body length announced by the header of the frame still arriving (0 when no
        whole header is buffered)."""
        buffer = self._buffer
        return HEADER.unpack_from(buffer)[0] if len(buffer) >= HEADER.size else 0

    def feed(self, data: bytes) -> list[Frame]:
        buffer = self._buffer
        buffer += data
        frames = []
        position = 0
        limit = self.limit
        while len(buffer) - position >= HEADER.size:
            length, call_id, method, status = HEADER.unpack_from(buffer, position)
            if length > limit:
                buffer.clear()
                raise LaneProtocolError(f"a frame announcing {length} bytes exceeds {limit}")
            end = position + HEADER.size + length
            if len(buffer) < end:
                break
            frames.append(Frame(call_id, method, status, bytes(buffer[end - length : end])))
            position = end
        if position:
            del buffer[:position]
        return frames
