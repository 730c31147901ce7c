"""A storage node reads another node's object into its own memory: re-replication and drains.

The master never carries payload bytes. To give an object a new replica on this node, it
reserves space here and sends a Copy naming the source segment of another node with what a
client would need to reach it; this node then reads the bytes straight into the reserved
range, as a client's get would, checks them against the object's checksum, and records the
copy. When the source node serves the checked stream, the Copy carries the master's READ
capability for exactly the source's range and the bytes come over that stream (the source
node checks it; nothing reaches its UCX worker). Otherwise (a cluster without capability
keys, or a source node with the stream off) a one-sided UCX get reads them:

One UCX worker of its own (the node's main worker is progressed by another thread, and a
worker is not thread-safe), used by one command at a time: the node runs its commands in
order. Endpoints are kept per peer worker, a bounded number, and dropped after a failure;
a peer on this host is reached over CMA (the kernel copies, the peer need not progress),
others with force-closable endpoints, so that a copy past its deadline is cancelled. A worker
whose transfer could be neither cancelled nor drained is given up, never progressed again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from prometheus_client import Counter

from kvpool.proto import master_pb2 as pb
from kvpool.transport import ucp
from kvpool.transport.checked_stream import CheckedStreams, Job, Outcome

#: Seconds one copy may take: below the master's wait for a command's answer (5 s), so that
#: the node answers before the master gives up on it.
COPY_TIMEOUT = 4.0
#: Peer workers this node keeps an endpoint to at most (the oldest goes first).
MAX_PEERS = 64
#: Remote keys kept per peer at most (one per segment it mounts: a handful).
MAX_RKEYS = 64

PEER_COPIED_BYTES = Counter(
    "kvpool_node_peer_copied_bytes_total",
    "Bytes this node read from other nodes into its own segments (re-replication, drains), "
    "by path: checked (the source node's checked stream) or ucx.",
    ["path"],
)
PEER_COPY_FAILURES = Counter(
    "kvpool_node_peer_copy_failures_total",
    "Copies from other nodes that failed (the peer unreachable, the deadline passed, the "
    "bytes did not match the object's checksum).",
)


class PeerCopyFailed(RuntimeError):
    """The bytes could not be read from the peer: nothing was recorded."""


class SourceCorrupt(PeerCopyFailed):
    """The bytes read from the peer do not match the object's checksum: nothing was recorded,
    and the master is told (``CommandResult.source_corrupt``)."""


@dataclass
class _Peer:
    endpoint: ucp.Endpoint
    rkeys: dict[bytes, ucp.RemoteKey] = field(default_factory=dict)

    def rkey(self, packed: bytes) -> ucp.RemoteKey:
        rkey = self.rkeys.get(packed)
        if rkey is None:
            if len(self.rkeys) >= MAX_RKEYS:  # (Endpoint destroys the old ones as it closes)
                raise PeerCopyFailed("too many segments of one peer: reconnecting")
            rkey = self.rkeys[packed] = self.endpoint.unpack_rkey(packed)
        return rkey


class PeerCopier:
    def __init__(self, context: ucp.Context) -> None:
        self._context = context
        self._streams: CheckedStreams | None = None
        self._worker: ucp.Worker | None = None
        #: Workers given up after a transfer they could not stop (never used again).
        self._abandoned: list[ucp.Worker] = []
        self._peers: OrderedDict[bytes, _Peer] = OrderedDict()

    def read(
        self,
        source: pb.Segment,
        offset: int,
        length: int,
        local_address: int,
        memh: object,
        timeout: float = COPY_TIMEOUT,
        capability: bytes = b"",
    ) -> None:
        """Reads ``length`` bytes at ``offset`` of segment ``source`` (another node's) into
        local memory at ``local_address`` (registered with this node's context: ``memh``),
        over the source's checked stream when ``capability`` is given. Raises
        PeerCopyFailed; when it returns or raises, nothing touches the memory any more."""
        if offset < 0 or length < 0 or offset + length > source.size:
            raise PeerCopyFailed(
                f"{offset}+{length} lies outside segment {source.segment_id} of {source.size} bytes"
            )
        if length == 0:
            return
        if capability and source.checked_address:
            self._read_checked(source, offset, length, local_address, timeout, capability)
            return
        if self._worker is None:
            self._worker = self._context.create_worker()
        worker = self._worker
        try:
            peer = self._peer(source.worker_address)
            rkey = peer.rkey(source.rkey)
        except (ucp.UcxError, PeerCopyFailed) as error:
            self._drop(source.worker_address)
            PEER_COPY_FAILURES.inc()
            raise PeerCopyFailed(f"cannot reach node {source.node_id}: {error}") from None
        op = ucp.Op(
            peer.endpoint,
            rkey,
            local_address,
            source.base_address + offset,
            length,
            memh,
        )
        [status] = worker.transfer([op], is_get=True, timeout=timeout)
        if status == ucp.UCS_OK:
            PEER_COPIED_BYTES.labels("ucx").inc(length)
            return
        PEER_COPY_FAILURES.inc()
        if worker.tainted:
            self._abandoned.append(worker)
            self._worker = None
            self._peers.clear()
        else:
            self._drop(source.worker_address)
        raise PeerCopyFailed(
            f"reading {length} bytes from node {source.node_id} (segment "
            f"{source.segment_id}) failed: {ucp.status_string(status)}"
        )

    def _read_checked(
        self,
        source: pb.Segment,
        offset: int,
        length: int,
        local_address: int,
        timeout: float,
        capability: bytes,
    ) -> None:
        if self._streams is None:
            self._streams = CheckedStreams(per_node=2, threads=1)
        job = Job(source.checked_address, capability, offset, length, local_address)
        [result] = self._streams.run([job], is_get=True, deadline=time.monotonic() + timeout)
        if result.outcome is Outcome.OK:
            PEER_COPIED_BYTES.labels("checked").inc(length)
            return
        PEER_COPY_FAILURES.inc()
        raise PeerCopyFailed(
            f"reading {length} bytes from node {source.node_id} (segment {source.segment_id}) "
            f"over its checked stream failed: {result.outcome.value}"
            + (f" ({result.message})" if result.message else "")
        )

    def close(self) -> None:
        if self._streams is not None:
            self._streams.close()
            self._streams = None
        for address in list(self._peers):
            self._drop(address)
        if self._worker is not None and not self._abandoned:
            self._worker.close()
        self._worker = None

    def _peer(self, worker_address: bytes) -> _Peer:
        peer = self._peers.get(worker_address)
        if peer is not None and not peer.endpoint.closed:
            self._peers.move_to_end(worker_address)
            return peer
        self._drop(worker_address)
        while len(self._peers) >= MAX_PEERS:
            self._drop(next(iter(self._peers)))
        peer = self._peers[worker_address] = _Peer(self._connect(worker_address))
        return peer

    def _connect(self, worker_address: bytes) -> ucp.Endpoint:
        """CMA when the peer shares this host, else a force-closable endpoint."""
        assert self._worker is not None
        endpoint = self._worker.connect(worker_address)
        if endpoint.uses_transport("cma"):
            return endpoint
        endpoint.close(timeout=0.5)  # unused so far: nothing in flight on it
        return self._worker.connect(worker_address, peer_errors=True)

    def _drop(self, worker_address: bytes) -> None:
        peer = self._peers.pop(worker_address, None)
        if peer is not None:
            peer.endpoint.close(timeout=0.5)
