"""The checked data path: transfers a storage node serves only under a valid capability.

One-sided RMA lets a peer name any address; over UCX's TCP transport UCP emulates it in
software and copies to or from whatever address it is sent. Here a client instead sends the
node a request (UCX active message: a header with the operation, the segment offset and
length, and the master's capability, ``security/capabilities.py``), and the node checks it
before any byte moves. The bytes still go straight between the client's buffer and the
segment: UCX's rendezvous protocol moves them with zero-copy transport operations once the
node has accepted, into or out of the segment's registered memory. Small transfers go
eagerly (one copy out of UCX's receive buffer, one message instead of a handshake).

The node's check runs in C (``ucp_helpers.c``) inside UCX's active-message handler, on the
thread that progresses the worker, without the GIL: Python only hands it keys, the policy
(the master clock estimate, the skew allowance, the oldest term) and the segment table. A
node whose context has active messages and no RMA (``Context(rma=False,
active_messages=True)``) runs no peer's software RMA at all.

Objects here follow ``ucp.py``'s rules: not thread-safe except where said, created after
``fork()``. ``AmServer``'s key, policy and segment calls may come from any thread while
another progresses the worker (the C side holds a lock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.transport import ucp
from kvpool.transport._ucp_cffi import ffi, lib

#: A status ``AmClient.transfer`` reports as ``REFUSED + code`` for a node's refusal.
REFUSED = lib.KV_AM_REFUSED
#: Put sizes from which the client sends by rendezvous (zero-copy after the node's check);
#: smaller puts go eagerly, answered by the node's reply.
DEFAULT_RNDV_THRESHOLD = 64 * 1024
#: Messages a node keeps in flight at most (replies and transfers); beyond, it answers BUSY.
DEFAULT_MAX_INFLIGHT = 4096
CAPABILITY_SIZE = lib.KV_CAP_LEN
REQUEST_HEADER_SIZE = lib.KV_REQ_LEN
REPLY_HEADER_SIZE = lib.KV_REPLY_LEN
REQUEST_MAGIC = lib.KV_REQ_MAGIC
AM_PUT = lib.KV_AM_ID_PUT
AM_GET = lib.KV_AM_ID_GET
AM_PUT_REPLY = lib.KV_AM_ID_PUT_REPLY
AM_GET_DATA = lib.KV_AM_ID_GET_DATA
#: ``ucp_send_am_flags`` for ``send_raw``.
SEND_REPLY, SEND_EAGER, SEND_RNDV = 1, 2, 4

#: The node's refusal codes: the capability's (``capabilities.Refusal``), then the path's.
REFUSALS: dict[int, str] = {
    1: "malformed capability",
    2: "capability signed with a key the node does not hold",
    3: "forged capability",
    4: "capability of an older master term",
    5: "expired capability",
    6: "outside the capability's range or the segment",
    7: "capability without the rights the transfer needs",
    20: "malformed request",
    21: "no such segment on this node",
    22: "node busy: too many transfers in flight",
    23: "node-side transfer failed",
    24: "malformed reply from the node",
}
BAD_REQUEST, NO_SEGMENT, BUSY, BAD_REPLY = 20, 21, 22, 24


def refusal_of(status: int) -> int | None:
    """The node's refusal code in a transfer status, or None for a UCX status."""
    return status - REFUSED if status >= REFUSED else None


def describe(status: int) -> str:
    code = refusal_of(status)
    if code is None:
        return ucp.status_string(status)
    return f"refused by the node: {REFUSALS.get(code, f'code {code}')}"


@dataclass(slots=True)
class AmCounters:
    """What a node's checked data path did since it started."""

    puts: int
    gets: int
    put_bytes: int
    get_bytes: int
    no_reply_endpoint: int
    completion_errors: int
    replies_dropped: int
    inflight: int
    refusals: dict[int, int] = field(default_factory=dict)


class AmServer:
    """A storage node's end: serves checked puts and gets into registered segments."""

    def __init__(
        self,
        worker: ucp.Worker,
        *,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        rndv_threshold: int = DEFAULT_RNDV_THRESHOLD,
    ) -> None:
        self.worker = worker
        out = ffi.new("kv_am_server_t **")
        ucp._check(
            "kv_am_server_create",
            lib.kv_am_server_create(worker.handle, max_inflight, rndv_threshold, out),
        )
        self._handle: Any = out[0]
        self._regions: dict[bytes, Any] = {}

    def set_key(self, key_id: int, secret: bytes) -> None:
        ucp._check("set key", lib.kv_am_server_set_key(self._handle, key_id, secret, len(secret)))

    def remove_key(self, key_id: int) -> bool:
        return lib.kv_am_server_remove_key(self._handle, key_id) == ucp.UCS_OK

    def set_policy(self, *, clock_offset_ms: int = 0, max_skew_ms: int, min_term: int) -> None:
        """The master's clock as ``local wall clock + clock_offset_ms``; capabilities are
        accepted up to ``max_skew_ms`` past their expiry, and from term ``min_term`` on."""
        lib.kv_am_server_set_policy(self._handle, clock_offset_ms, max_skew_ms, min_term)

    def add_segment(self, digest: bytes, region: ucp.MemoryRegion) -> None:
        """Serves the registered memory of ``region`` as the segment with ``digest``
        (``capabilities.segment_digest`` of its id)."""
        if len(digest) != 16:
            raise ValueError("a segment digest is 16 bytes")
        status = lib.kv_am_server_add_segment(
            self._handle, digest, ffi.cast("void *", region.address), region.length, region.memh
        )
        ucp._check("add segment", status)
        self._regions[bytes(digest)] = region

    def remove_segment(self, digest: bytes) -> int:
        """Stops serving a segment; returns the transfers still in flight on it (its memory
        may go once a later call returns 0), or -1 when it was not served."""
        remaining = int(lib.kv_am_server_remove_segment(self._handle, digest))
        if remaining <= 0:
            self._regions.pop(bytes(digest), None)
        return remaining

    def counters(self) -> AmCounters:
        values = ffi.new("uint64_t[]", lib.KV_AM_NCOUNTERS)
        inflight = ffi.new("uint32_t *")
        lib.kv_am_server_counters(self._handle, values, lib.KV_AM_NCOUNTERS, inflight)
        return AmCounters(
            puts=values[lib.KV_CNT_PUTS],
            gets=values[lib.KV_CNT_GETS],
            put_bytes=values[lib.KV_CNT_PUT_BYTES],
            get_bytes=values[lib.KV_CNT_GET_BYTES],
            no_reply_endpoint=values[lib.KV_CNT_NO_REPLY_EP],
            completion_errors=values[lib.KV_CNT_COMPLETION_ERRORS],
            replies_dropped=values[lib.KV_CNT_REPLIES_DROPPED],
            inflight=inflight[0],
            refusals={code: values[code] for code in range(1, lib.KV_AM_NCODES) if values[code]},
        )

    def close(self) -> int:
        """Removes the handlers (once the worker's progress has stopped); returns the
        messages that were still in flight."""
        if self._handle is None:
            return 0
        left = int(lib.kv_am_server_destroy(self._handle))
        self._handle = None
        return left


@dataclass(slots=True)
class AmOp:
    """One checked transfer: ``length`` bytes between local memory and ``offset`` of the
    segment that ``capability`` names, on the node behind ``endpoint``."""

    endpoint: ucp.Endpoint
    local_address: int
    length: int
    offset: int
    capability: bytes
    memh: Any = None


class AmClient:
    """A client's end on one worker: runs checked transfers to nodes' ``AmServer``s."""

    def __init__(self, worker: ucp.Worker) -> None:
        self.worker = worker
        out = ffi.new("kv_am_client_t **")
        ucp._check("kv_am_client_create", lib.kv_am_client_create(worker.handle, out))
        self._handle: Any = out[0]

    def transfer(
        self,
        ops: Sequence[AmOp],
        *,
        is_get: bool,
        timeout: float,
        grace: float = ucp.DRAIN_GRACE,
        rndv_threshold: int = DEFAULT_RNDV_THRESHOLD,
    ) -> list[int]:
        """Runs ``ops`` (all gets or all puts) until done or ``timeout`` seconds pass;
        returns each one's status: ``UCS_OK``, a UCX error, or ``REFUSED`` + the node's
        refusal code (``describe``). When this returns nothing touches the ops' buffers any
        more, unless the worker is then ``tainted`` (never progress it again)."""
        n = len(ops)
        if n == 0:
            return []
        c_ops = ffi.new("kv_am_op_t[]", n)
        keep = []
        for c_op, op in zip(c_ops, ops, strict=True):
            if len(op.capability) != CAPABILITY_SIZE:
                raise ValueError(f"a capability is {CAPABILITY_SIZE} bytes")
            if op.length <= 0:
                raise ValueError("a checked transfer moves at least one byte")
            cap = ffi.from_buffer(op.capability)
            keep.append(cap)
            c_op.ep = op.endpoint.handle
            c_op.local = ffi.cast("void *", op.local_address)
            c_op.length = op.length
            c_op.offset = op.offset
            c_op.cap = ffi.cast("const uint8_t *", cap)
            c_op.cap_len = len(op.capability)
            if op.memh is not None:
                c_op.memh = op.memh
        statuses = ffi.new("int[]", n)
        tainted = ffi.new("int *")
        lib.kv_am_transfer(
            self._handle,
            self.worker.efd,
            int(is_get),
            c_ops,
            n,
            rndv_threshold,
            timeout,
            grace,
            statuses,
            tainted,
        )
        self.worker.tainted = self.worker.tainted or bool(tainted[0])
        return list(statuses)

    def strays(self) -> tuple[int, int]:
        """Replies that matched no transfer in progress (late, duplicated, not ours), and
        the code the last of them carried."""
        count = ffi.new("uint64_t *")
        code = ffi.new("int *")
        lib.kv_am_client_strays(self._handle, count, code)
        return int(count[0]), int(code[0])

    def close(self) -> None:
        if self._handle is not None:
            lib.kv_am_client_destroy(self._handle)
            self._handle = None


def send_raw(
    worker: ucp.Worker,
    endpoint: ucp.Endpoint,
    am_id: int,
    header: bytes,
    data: bytes = b"",
    *,
    flags: int = SEND_REPLY,
    timeout: float = 5.0,
) -> int:
    """Sends one active message exactly as given (tests: crafted requests); returns the
    status of its local completion."""
    return int(
        lib.kv_am_send_raw(
            worker.handle,
            worker.efd,
            endpoint.handle,
            am_id,
            header,
            len(header),
            data if data else ffi.NULL,
            len(data),
            flags,
            timeout,
        )
    )


def request_header(*, is_get: bool, request_id: int, offset: int, length: int, cap: bytes) -> bytes:
    """A request header as ``AmClient`` builds it (tests craft variants of it)."""
    op = 2 if is_get else 1
    return (
        REQUEST_MAGIC.to_bytes(4, "big")
        + bytes([op, 0, 0, 0])
        + request_id.to_bytes(8, "big")
        + offset.to_bytes(8, "big")
        + length.to_bytes(8, "big")
        + cap
    )


def max_header_size(worker: ucp.Worker) -> int:
    out = ffi.new("size_t *")
    ucp._check("ucp_worker_query", lib.kv_worker_max_am_header(worker.handle, out))
    return int(out[0])
