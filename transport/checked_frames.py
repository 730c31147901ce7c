"""The checked stream's frames (sans-IO): what a client and a storage node say on it.

The checked stream is kvpool's own data-path transport for peers that are not on the
node's host: a TCP connection on which every transfer is a request the node checks before
any byte moves (docs/security.md, "The data path, transport by transport"). UCX over TCP
cannot be used against a hostile peer (its software RMA writes wherever the peer names), so
the node reads the request's header, verifies the capability it carries
(security/capabilities.py) and only then moves the bytes straight between the socket and
the segment.

A request is a fixed ``REQUEST_SIZE``-byte header, followed for a write by exactly
``length`` payload bytes::

    magic "KVCQ" | version u8 | op u8 | reserved u16 (0) | request id u64 |
    capability (84 bytes) | offset u64 (from the segment's base) | length u64

A reply is a fixed ``REPLY_SIZE``-byte header, followed for a read answered OK by exactly
``length`` payload bytes::

    magic "KVCR" | version u8 | reserved u8 (0) | status u16 | request id u64 | length u64

The segment is the one the capability names (by digest): a request cannot name another one.
Requests on one connection are answered in order, so a client may send several before it
reads the first answer. Parsing is strict (exact sizes, the magic, a known version and op,
zeroed reserved bits, a non-empty length within ``max_length``): anything else is a
``FrameError``, after which the stream is out of step and the connection is closed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from kvpool.security import capabilities as caps

REQUEST_MAGIC = b"KVCQ"
REPLY_MAGIC = b"KVCR"
VERSION = 1
#: Longest transfer one request may name by default (a node also bounds it by the segment).
MAX_LENGTH = 1 << 40

_REQUEST = struct.Struct(f">4sBBHQ{caps.SIZE}sQQ")
_REPLY = struct.Struct(">4sBBHQQ")
REQUEST_SIZE = _REQUEST.size
REPLY_SIZE = _REPLY.size


class Op(IntEnum):
    WRITE = 1
    READ = 2


class Status(IntEnum):
    """A reply's outcome. 1 to 7 are the capability refusals (``caps.Refusal``), by number."""

    OK = 0
    MALFORMED_CAPABILITY = 1
    UNKNOWN_KEY = 2
    FORGED = 3
    STALE_TERM = 4
    EXPIRED = 5
    OUT_OF_RANGE = 6
    WRONG_RIGHTS = 7
    #: The header could not be parsed (the node closes the connection after saying so).
    BAD_REQUEST = 16
    #: The capability names no segment of this node (it moved, or the node restarted).
    NO_SEGMENT = 17
    #: The node failed to move the bytes (its segment went away meanwhile).
    FAILED = 18
    #: A write grant for an object the node has recorded since: it is published, no more
    #: writes (a retried or late writer).
    SEALED = 19
    #: The node's disk failed to read the bytes (an I/O error): read another replica.
    DISK_ERROR = 20


#: The reply status of each capability refusal.
REFUSAL_STATUS = {refusal: Status(int(refusal)) for refusal in caps.Refusal}


class FrameError(ValueError):
    """A header that is not a well-formed frame: the stream is out of step, close it."""


@dataclass(frozen=True, slots=True)
class Request:
    op: Op
    request_id: int
    capability: bytes
    offset: int
    length: int

    def encode(self) -> bytes:
        return encode_request(self.op, self.request_id, self.capability, self.offset, self.length)


@dataclass(frozen=True, slots=True)
class Reply:
    request_id: int
    status: Status
    length: int

    def encode(self) -> bytes:
        return encode_reply(self.request_id, self.status, self.length)


def encode_request(op: Op, request_id: int, capability: bytes, offset: int, length: int) -> bytes:
    if len(capability) != caps.SIZE:
        raise FrameError(f"a capability is exactly {caps.SIZE} bytes, got {len(capability)}")
    return _REQUEST.pack(REQUEST_MAGIC, VERSION, op, 0, request_id, capability, offset, length)


def encode_reply(request_id: int, status: Status, length: int = 0) -> bytes:
    return _REPLY.pack(REPLY_MAGIC, VERSION, 0, status, request_id, length)


def parse_request(header: bytes | bytearray | memoryview, max_length: int = MAX_LENGTH) -> Request:
    """The request in ``header`` (exactly ``REQUEST_SIZE`` bytes), or ``FrameError``."""
    if len(header) != REQUEST_SIZE:
        raise FrameError(f"a request header is {REQUEST_SIZE} bytes, got {len(header)}")
    magic, version, op, reserved, request_id, capability, offset, length = _REQUEST.unpack(header)
    if magic != REQUEST_MAGIC:
        raise FrameError(f"not a checked-stream request (magic {magic!r})")
    if version != VERSION:
        raise FrameError(f"checked-stream version {version}; this peer speaks {VERSION}")
    if op not in (Op.WRITE, Op.READ):
        raise FrameError(f"unknown operation {op}: 1 (write) or 2 (read)")
    if reserved:
        raise FrameError(f"reserved bits set ({reserved:#x})")
    if not 0 < length <= max_length:
        raise FrameError(f"a transfer moves 1 to {max_length} bytes, got {length}")
    if offset + length > caps.MAX_U64:
        raise FrameError(f"{length} bytes at offset {offset} wrap around")
    return Request(Op(op), request_id, capability, offset, length)


def unpack_request(buffer: bytearray | memoryview, at: int) -> tuple[int, int, bytes, int, int]:
    """``parse_request``'s fast path for a node's every request: (op, request id,
    capability, offset, length) of the header at ``at`` of ``buffer`` (at least
    ``REQUEST_SIZE`` bytes from there), or ``FrameError``. No object made."""
    magic, version, op, reserved, request_id, capability, offset, length = _REQUEST.unpack_from(
        buffer, at
    )
    if (
        magic != REQUEST_MAGIC
        or version != VERSION
        or op not in (1, 2)
        or reserved
        or not 0 < length <= MAX_LENGTH
        or offset + length > caps.MAX_U64
    ):
        parse_request(bytes(buffer[at : at + REQUEST_SIZE]))  # (raises, saying why)
    return op, request_id, capability, offset, length


def unpack_reply(buffer: bytearray | memoryview, at: int) -> tuple[int, int, int]:
    """``parse_reply``'s fast path for a client's every answer: (status, request id,
    length) of the header at ``at`` of ``buffer``, or ``FrameError``."""
    magic, version, reserved, status, request_id, length = _REPLY.unpack_from(buffer, at)
    if magic != REPLY_MAGIC or version != VERSION or reserved or status not in _STATUSES:
        parse_reply(bytes(buffer[at : at + REPLY_SIZE]))  # (raises, saying why)
    if length > MAX_LENGTH:
        raise FrameError(f"a reply announces {length} bytes, more than {MAX_LENGTH}")
    return status, request_id, length


def pack_request_into(
    buffer: bytearray,
    at: int,
    op: int,
    request_id: int,
    capability: bytes,
    offset: int,
    length: int,
) -> None:
    """``encode_request`` into ``buffer`` at ``at`` (``REQUEST_SIZE`` bytes)."""
    if len(capability) != caps.SIZE:
        raise FrameError(f"a capability is exactly {caps.SIZE} bytes, got {len(capability)}")
    _REQUEST.pack_into(
        buffer, at, REQUEST_MAGIC, VERSION, op, 0, request_id, capability, offset, length
    )


_STATUSES = frozenset(int(status) for status in Status)

#: ``encode_reply`` without its call: ``pack_reply(REPLY_MAGIC, VERSION, 0, status,
#: request_id, length)`` (a node's hot path).
pack_reply = _REPLY.pack
#: A request header's fields at an offset of a buffer, unchecked: ``(magic, version, op,
#: reserved, request id, capability, offset, length)`` (a node's hot path, which checks them
#: as ``unpack_request`` does and leaves any it would refuse to it).
unpack_request_fields = _REQUEST.unpack_from
#: A request header's fields packed into a buffer at an offset, unchecked (``pack_request_into``
#: checks the capability's size first; a client's hot path checks it itself).
pack_request_fields_into = _REQUEST.pack_into
#: A capability's size in a request.
CAPABILITY_SIZE = caps.SIZE


def parse_reply(header: bytes | bytearray | memoryview, max_length: int = MAX_LENGTH) -> Reply:
    """The reply in ``header`` (exactly ``REPLY_SIZE`` bytes), or ``FrameError``."""
    if len(header) != REPLY_SIZE:
        raise FrameError(f"a reply header is {REPLY_SIZE} bytes, got {len(header)}")
    magic, version, reserved, status, request_id, length = _REPLY.unpack(header)
    if magic != REPLY_MAGIC:
        raise FrameError(f"not a checked-stream reply (magic {magic!r})")
    if version != VERSION:
        raise FrameError(f"checked-stream version {version}; this peer speaks {VERSION}")
    if reserved:
        raise FrameError(f"reserved bits set ({reserved:#x})")
    try:
        known = Status(status)
    except ValueError:
        raise FrameError(f"unknown reply status {status}") from None
    if length > max_length:
        raise FrameError(f"a reply announces {length} bytes, more than {max_length}")
    return Reply(request_id, known, length)
