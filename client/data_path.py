"""The client's side of the data path: mapped segments on this host, UCX to the others (a
few workers, one endpoint per storage node and worker, one rkey per segment and worker).

Routes are learned from the segment descriptors the master sends and cached; an endpoint
whose transfer failed or timed out is dropped (with its rkeys) and rebuilt on next use.

Threads sharing a client transfer at the same time, not one after another. A UCX worker is
single-threaded, so each transfer takes a worker of its own from a small pool (``_Lane``:
the worker, its endpoints and routes), made on first need up to ``MAX_WORKERS`` and shared by
one context (created for workers on several threads); a thread finding them all busy waits
for one within its deadline. The loops themselves run in C without the GIL. ``_lock`` guards
only the tables (descriptors' effects, mappings, registrations, the pool): it is never held
while bytes move. A mapping in use by a copy is pinned, and unmapped only when the last copy
through it is done, whoever let go of it meanwhile (a new descriptor, its node's exit).

A segment the node shares with this host (``Segment.shared_memory``) is mapped into this
process on first use (one mapping per process, shared by its clients), and transfers with it
are plain memory copies (kvpool.transport.shared_memory), shared between ``copy_threads``
threads when large (kvpool.transport.memory_copy): no UCX, no node CPU, no kernel copy. A
copy's pieces each start before the transfer's deadline, and the call returns only when no
thread touches the memory any more. ``same_host_mapping=False`` turns mapping off.

Other endpoints to nodes on this host use CMA (the kernel copies between the two processes,
driven by our own progress, never waiting on the node); all others are created force-closable,
so that a transfer past its deadline is cancelled. Should a timed-out transfer be neither
cancellable nor finished after a grace period, the worker is given up (never progressed again)
and a fresh one takes over: no late byte ever lands in memory a caller moved on from.

**The checked stream.** A segment that is not mapped here and whose node serves the checked
stream (``Segment.checked_address``) is reached over it rather than UCX whenever the master
granted the transfer a capability (``Transfer.capability``; secure masters do): the node
checks every transfer before a byte moves (transport/checked_stream.py). Such transfers are
not merged with one another (each is one grant); requests to one node are pipelined instead.
``checked_stream=False`` (or ``KVPOOL_CHECKED_STREAM=0`` in the environment) keeps UCX for them
(for puts, only into nodes that take the writer's word: of one tenant, or with UCX over TCP;
storage_node/checked_writes.py).

A transfer that fails for another reason than its deadline (the node's process exited, an
endpoint cannot be created, the connection broke) marks its node unreachable for a few
seconds (``unreachable``, client/unreachable_nodes.py): puts are placed elsewhere, reads try
that node last. One that missed its deadline waiting on its node is ``Failure.silent``: a
read that gave it only its share of the time, other replicas left, marks the node too
(client/get_path.py).
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.client.coalescing import coalesce
from kvpool.client.unreachable_nodes import UnreachableNodes
from kvpool.common.logging import get_logger
from kvpool.errors import ClientClosed, InvalidArgument
from kvpool.proto import master_pb2 as pb
from kvpool.transport import ucp, writer_locks
from kvpool.transport.checked_stream import CheckedStreams, Job, Outcome
from kvpool.transport.memory_copy import Copier, Copy
from kvpool.transport.shared_file import SharedFile
from kvpool.transport.shared_memory import (
    HANDOVER_TIMEOUT,
    MAPPINGS,
    MappedSegment,
    MappingRefused,
    Reaper,
    SegmentFile,
    boot_id,
)

log = get_logger("kvpool.client")

_SEGMENT_OF = operator.attrgetter("segment_id")


def _tried(
    mapped: dict[tuple[str, bool], MappedSegment | SharedFile | None],
    segment_id: str,
    writable: bool,
) -> bool:
    """Whether a client with these ``mapped`` segments tried to map ``segment_id`` for puts
    (``writable``) or gets (gets read through the puts' mapping where there is one)."""
    return (segment_id, writable) in mapped or (
        not writable and isinstance(mapped.get((segment_id, True)), MappedSegment)
    )


def _only_the_grant_changed(known: pb.Segment, new: pb.Segment) -> bool:
    """Whether two descriptors of a segment differ in their map grants alone."""
    if known.map_capability == new.map_capability:
        return False
    without = [pb.Segment(), pb.Segment()]
    for copy, descriptor in zip(without, (known, new), strict=True):
        copy.CopyFrom(descriptor)
        copy.ClearField("map_capability")
    return without[0] == without[1]


def segment_file(descriptor: pb.Segment) -> SegmentFile:
    """Where the node's file for the segment ``descriptor`` names is, and how to get it."""
    shared = descriptor.shared_memory
    return SegmentFile(
        shared.pid,
        shared.fd,
        shared.inode,
        shared.device,
        descriptor.size,
        descriptor.base_address,
        shared.socket,
        descriptor.map_capability,
        shared.direct_io,
    )


@dataclass(slots=True)
class Transfer:
    """Move ``length`` bytes between local memory and ``remote_address`` in a segment."""

    segment_id: str
    remote_address: int
    local_address: int
    length: int
    #: The master's grant of the replica's range (empty: none); the checked stream sends it.
    capability: bytes = b""


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one transfer did not complete: it ran out of time (``timed_out``), or its node
    (``node_id``) could not be reached (``unreachable``), or it was cut off on a connection
    that was made (``interrupted``: its replica there removed or moved meanwhile, or the
    node went away mid-answer), or (none of these) it was refused.

    ``silent``: it ran out of time on the wire, its node not answering in time (not waiting
    for a worker of this client, nor copying mapped memory). That alone does not mark the
    node unreachable: the deadline may have been too short for the bytes. A caller that gave
    the transfer only part of its time (a read with other replicas left, client/get_path.py)
    marks it."""

    message: str
    timed_out: bool = False
    node_id: str = ""
    unreachable: bool = False
    interrupted: bool = False
    silent: bool = False

    def __str__(self) -> str:
        return self.message


@dataclass(slots=True)
class _Route:
    descriptor: pb.Segment
    endpoint: ucp.Endpoint
    rkey: ucp.RemoteKey


#: UCX workers a client keeps at most: as many threads transfer over UCX at once, the others
#: wait for one (a worker serves one thread at a time; each has its own endpoints).
MAX_WORKERS = 8
#: Seconds closing an endpoint to a replaced node process may wait for the peer (it is
#: usually gone: the close is forced then).
ENDPOINT_CLOSE_WAIT = 0.1
#: How long closing waits for the transfers other threads still run before it lets go.
CLOSE_WAIT = 30.0
#: Seconds a transfer past its deadline may still drain before its worker is given up (never
#: progressed again, so that nothing it has in flight touches the caller's memory): short,
#: so that a call ends close to its deadline (the chaos suite saw a get end 3.4 s late).
LATE_GRACE = 0.2
#: What a client that opts out of the checked stream is told by a node that serves it.
_STREAM_ONLY = (
    "A node that serves the checked stream takes transfers over it only (its UCX offers no "
    "peer one-sided access): use the checked stream (do not set KVPOOL_CHECKED_STREAM=0), "
    "or start the node with --ucx-tcp"
)


class _NoRemoteKey(Exception):
    """The segment's node hands out no UCX remote key (``MemoryRegion.peer_rkey``)."""


class _Lane:
    """One UCX worker with its endpoints and routes, used by one thread at a time."""

    def __init__(self, worker: ucp.Worker) -> None:
        self.worker = worker
        self.endpoints: dict[bytes, ucp.Endpoint] = {}
        self.routes: dict[str, _Route] = {}
        #: Segments whose routes go before the lane's next use (their descriptor changed).
        self.stale: set[str] = set()
        #: Worker addresses of node processes that were replaced: their endpoints go too.
        self.stale_workers: set[bytes] = set()

    def drop_route(self, segment_id: str) -> None:
        route = self.routes.pop(segment_id, None)
        if route is not None:
            route.rkey.destroy()

    def drop_endpoint(
        self, endpoint: ucp.Endpoint, worker_address: bytes, timeout: float = 1.0
    ) -> None:
        """Closes ``endpoint`` (to ``worker_address``) and forgets every route through it."""
        for segment_id in [s for s, r in self.routes.items() if r.endpoint is endpoint]:
            self.drop_route(segment_id)
        self.endpoints.pop(worker_address, None)
        endpoint.close(timeout=timeout)


class DataPath:
    def __init__(
        self,
        ucx_config: Mapping[str, str] | None = None,
        *,
        same_host_mapping: bool = True,
        copy_threads: int = 2,
        checked_stream: bool | None = None,
    ) -> None:
        context = None
        try:
            context = ucp.Context(ucx_config)
            first_worker = context.create_worker()
        except ucp.UcxError as error:
            if context is not None:  # (a caller that tries again must not leak one each time)
                context.close()
            given = sorted(ucx_config or {}) + sorted(k for k in os.environ if k.startswith("UCX_"))
            raise InvalidArgument(
                f"UCX could not start ({error}) with the settings {given or 'of its defaults'}: "
                "check ucx_config (names without the UCX_ prefix) and the UCX_* environment "
                "variables"
            ) from None
        self.context = context
        if checked_stream is None:  # (KVPOOL_CHECKED_STREAM=0 opts a client out: UCX)
            checked_stream = os.environ.get("KVPOOL_CHECKED_STREAM", "1") != "0"
        #: Connections of the checked stream (None: UCX carries every remote transfer).
        self._streams = CheckedStreams() if checked_stream else None
        self._lock = threading.Lock()
        #: Notified when a lane is given back and when a transfer ends.
        self._changed = threading.Condition(self._lock)
        self._lanes = [_Lane(first_worker)]
        self._idle = list(self._lanes)
        #: Workers given up after a transfer they could not stop: kept (never destroyed, never
        #: progressed) so that UCX can touch nothing through them.
        self._abandoned: list[ucp.Worker] = []
        self._descriptors: dict[str, pb.Segment] = {}
        self._regions: list[ucp.MemoryRegion] = []
        self._closed = False
        #: Transfers running now (``run`` calls between planning and their end), by a number
        #: each takes as it starts.
        self._active: set[int] = set()
        self._transfer_numbers = itertools.count()
        self.same_host_mapping = same_host_mapping
        #: (segment id, writable) -> its mapping, read-write for puts and read-only for
        #: gets (gets use the read-write one where there is one), or None where it cannot be
        #: mapped (the checked stream or UCX carry it).
        self._mapped: dict[tuple[str, bool], MappedSegment | SharedFile | None] = {}
        #: Mappings copies run through now, with how many; and those let go of meanwhile,
        #: released when their last copy ends.
        self._pins: dict[MappedSegment | SharedFile, int] = {}
        # Mappings let go while a copy ran through them, with how many times each was let
        # go (the same mapping may be acquired again and let go again before the copy ends).
        self._release_later: dict[MappedSegment | SharedFile, int] = {}
        self._reaper = Reaper(self._node_exited)
        self._copier = Copier(copy_threads)
        #: Nodes a transfer failed to reach lately (not by a deadline).
        self.unreachable = UnreachableNodes()

    def learn(self, segments: Iterable[pb.Segment]) -> None:
        """Records segment descriptors from a master response (cheap when unchanged)."""
        for segment in segments:
            known = self._descriptors.get(segment.segment_id)
            if known is not None and known == segment:
                continue
            self._descriptors[segment.segment_id] = segment
            if known is not None and _only_the_grant_changed(known, segment):
                # (the master renews map grants now and then: the mapping stands; one that
                # failed is tried again with the new grant)
                with self._lock:
                    for key in ((segment.segment_id, False), (segment.segment_id, True)):
                        if key in self._mapped and self._mapped[key] is None:
                            del self._mapped[key]
                continue
            if known is not None:
                self.unreachable.forget(segment.node_id)  # it mounted again: try it
            with self._lock:
                for lane in self._lanes:  # (dropped by the thread that next takes it)
                    lane.stale.add(segment.segment_id)
                self._unmap(segment.segment_id)
            self._forget_replaced(segment, known)

    def _forget_replaced(self, segment: pb.Segment, known: pb.Segment | None) -> None:
        """A segment from a new process of its node (another worker address): the lanes'
        endpoints to the node's earlier processes, and the routes through them, go before
        their next use, rather than stay open for the client's life with every node restart
        (an endpoint is a connection). A transfer that still names such a segment connects
        again, and fails as any transfer to a dead node does. ``known``: what the segment's
        id described before (a persistent segment keeps its id across restarts)."""
        olders = list(self._descriptors.values())  # (a copy: other threads learn meanwhile)
        if known is not None:
            olders.append(known)
        replaced = [
            old
            for old in olders
            if old.node_id == segment.node_id and old.worker_address != segment.worker_address
        ]
        if not replaced:
            return
        with self._lock:
            for lane in self._lanes:
                for old in replaced:
                    if old.worker_address in lane.endpoints:
                        lane.stale.add(old.segment_id)
                        lane.stale_workers.add(old.worker_address)

    def register(self, buffer: Any) -> ucp.MemoryRegion:
        """Registers caller memory once so transfers from or into it skip registration."""
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed: make a new one")
            region = self.context.register(buffer)
            self._regions.append(region)
            return region

    def unregister(self, region: ucp.MemoryRegion) -> None:
        """Lets go of a registration once the transfers running now (any may use it) have
        ended, within ``CLOSE_WAIT``: transfers that start from now on do not use it. Past
        that wait it is left to the process (destroyed under a transfer, UCX could fault).
        ClientClosed once the data path is closed (which let go of every registration)."""
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed: make a new one")
            self._regions.remove(region)
            running = set(self._active)
            until = time.monotonic() + CLOSE_WAIT
            while running & self._active and (left := until - time.monotonic()) > 0:
                self._changed.wait(left)
            if running & self._active:
                log.warning("a transfer still runs: its buffer's registration is left in place")
                return
            if self._closed:  # (close() ran meanwhile: the context is gone, and UCX with it)
                return
            region.close()

    def mapped_segments(self) -> list[str]:
        """Segments this client reaches by mapping their memory (same host)."""
        return sorted(set(self.mapped_for(writing=False)))

    def mapped_for(self, *, writing: bool) -> list[str]:
        """The segments this client writes (``writing``) or reads through its own mapping
        now: the master grants no capability there (``mapped_segments`` of PutStart and
        GetReplicas), which only the checked stream needs. Reads go through either mapping
        (not through a file held for writes: see ``_mapping``)."""
        with self._lock:
            return [
                segment_id
                for (segment_id, writable), mapped in self._mapped.items()
                if mapped is not None
                and (writable if writing else not isinstance(mapped, SharedFile))
            ]

    def may_write_file(self, segment_id: str) -> bool:
        """Whether a put may write the segment's file itself (an NVMe segment on this host:
        transport/shared_file.py), whose node then records the put's own checksum."""
        descriptor = self._descriptors.get(segment_id)
        return (
            descriptor is not None
            and self.same_host_mapping
            and descriptor.shared_memory.direct_io
            and descriptor.shared_memory.boot_id == boot_id()
        )

    def host_of(self, segment_id: str) -> str:
        descriptor = self._descriptors.get(segment_id)
        return descriptor.host if descriptor is not None else ""

    def node_of(self, segment_id: str) -> str:
        descriptor = self._descriptors.get(segment_id)
        return descriptor.node_id if descriptor is not None else ""

    def run(
        self, transfers: Sequence[Transfer], *, is_get: bool, deadline: float
    ) -> list[Failure | None]:
        """Runs ``transfers`` together until ``deadline`` (time.monotonic); entry i is None on
        success, else why it failed. Time spent waiting for a UCX worker that other threads
        use counts against the deadline. Transfers that continue one another run as one
        (client/coalescing.py); each then shares the outcome of the one it is part of. When
        this returns, none of them touches memory any more."""
        if self.same_host_mapping:
            self._map_ahead(transfers, writable=not is_get, deadline=deadline)
        if self._streams is not None:
            checked = self._checked_segments(transfers, is_get)
            if checked:
                return self._run_split(transfers, checked, is_get=is_get, deadline=deadline)
        merged, members = coalesce(transfers)
        if len(merged) == len(transfers):
            return self._run(transfers, is_get=is_get, deadline=deadline)
        errors: list[Failure | None] = [None] * len(transfers)
        for error, indexes in zip(
            self._run(merged, is_get=is_get, deadline=deadline), members, strict=True
        ):
            for i in indexes:
                errors[i] = error
        return errors

    def _checked_segments(self, transfers: Sequence[Transfer], is_get: bool) -> set[str]:
        """The segments among ``transfers`` that the checked stream carries: those not
        mapped here, whose node serves it, for transfers the master granted."""
        wanted = {t.segment_id for t in transfers if t.capability}
        if not wanted:
            return wanted
        with self._lock:
            return {
                segment_id
                for segment_id in wanted
                if (descriptor := self._descriptors.get(segment_id)) is not None
                and descriptor.checked_address
                and self._mapping(segment_id, writable=not is_get) is None
            }

    def _run_split(
        self, transfers: Sequence[Transfer], checked: set[str], *, is_get: bool, deadline: float
    ) -> list[Failure | None]:
        """Runs the transfers with ``checked`` segments over the checked stream, the others
        as ``run`` does."""
        errors: list[Failure | None] = [None] * len(transfers)
        mine = [i for i, t in enumerate(transfers) if t.segment_id in checked]
        others = [i for i, t in enumerate(transfers) if t.segment_id not in checked]
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed")
            number = next(self._transfer_numbers)
            self._active.add(number)
        try:
            for i, error in zip(
                mine, self._run_checked([transfers[i] for i in mine], is_get, deadline), strict=True
            ):
                errors[i] = error
        finally:
            with self._lock:
                self._active.discard(number)
                self._changed.notify_all()
        if others:
            rest = self.run([transfers[i] for i in others], is_get=is_get, deadline=deadline)
            for i, error in zip(others, rest, strict=True):
                errors[i] = error
        return errors

    def _run_checked(
        self, transfers: Sequence[Transfer], is_get: bool, deadline: float
    ) -> list[Failure | None]:
        assert self._streams is not None
        jobs = []
        for transfer in transfers:
            descriptor = self._descriptors[transfer.segment_id]
            jobs.append(
                Job(
                    descriptor.checked_address,
                    transfer.capability,
                    transfer.remote_address - descriptor.base_address,
                    transfer.length,
                    transfer.local_address,
                )
            )
        results = self._streams.run(jobs, is_get=is_get, deadline=deadline)
        errors: list[Failure | None] = []
        remembered = set(self.unreachable.current())
        ok = Outcome.OK
        for transfer, job, result in zip(transfers, jobs, results, strict=True):
            if result.outcome is ok and not remembered:
                errors.append(None)  # (the rule: nothing more to look at)
                continue
            segment_id = transfer.segment_id
            node_id = self.node_of(segment_id)
            if result.outcome is ok:
                if remembered and node_id in remembered:
                    self.unreachable.forget(node_id)  # it answers again
                    remembered.discard(node_id)
                errors.append(None)
            elif result.outcome is Outcome.TIMED_OUT:
                errors.append(
                    Failure(
                        f"transfer with segment {segment_id} missed its deadline",
                        timed_out=True,
                        node_id=node_id,
                        silent=True,
                    )
                )
            elif result.outcome is Outcome.UNREACHABLE:
                self._streams.forget(job.address)
                errors.append(self._unreachable(segment_id, result.message))
            elif result.outcome is Outcome.INTERRUPTED:
                self._streams.forget(job.address)  # (its idle connections may be dead too)
                errors.append(
                    Failure(
                        f"transfer with segment {segment_id} was cut off: {result.message}",
                        node_id=node_id,
                        interrupted=True,
                    )
                )
            else:
                errors.append(
                    Failure(f"transfer with segment {segment_id} failed: {result.message}")
                )
        return errors

    def _run(
        self, transfers: Sequence[Transfer], *, is_get: bool, deadline: float
    ) -> list[Failure | None]:
        if not transfers:
            return []
        errors: list[Failure | None] = [None] * len(transfers)
        copies: list[Copy] = []
        copied: list[int] = []
        file_writes: list[tuple[int, SharedFile, int]] = []  # (index, file, offset)
        pinned: list[MappedSegment | SharedFile] = []
        remote: list[tuple[int, Any]] = []  # (index, memh) of those UCX carries
        #: A put's ranges in nodes' files, by the lock description of the file's holder: the
        #: locks held while they are written (transport/writer_locks.py).
        locked: dict[int, list[tuple[int, int]]] = {}
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed")
            mapped_here, exited = self._live_mappings(
                {t.segment_id for t in transfers}, writable=not is_get
            )
            for i, transfer in enumerate(transfers):
                if transfer.segment_id in exited:
                    errors[i] = self._unreachable(transfer.segment_id, "its process has exited")
                    continue
                mapped = mapped_here.get(transfer.segment_id)
                if mapped is None:
                    remote.append((i, self._memh_for(transfer.local_address, transfer.length)))
                    continue
                if isinstance(mapped, SharedFile):
                    written = _file_offset(mapped, transfer)
                    if isinstance(written, Failure):
                        errors[i] = written
                    else:
                        file_writes.append((i, mapped, written))
                        if mapped.lock_fd is not None:
                            locked.setdefault(mapped.lock_fd, []).append((written, transfer.length))
                    continue
                copy = self._plan_copy(mapped, transfer, is_get)
                if isinstance(copy, Failure):
                    errors[i] = copy
                else:
                    copies.append(copy)
                    copied.append(i)
                    if not is_get and mapped.lock_fd is not None:
                        locked.setdefault(mapped.lock_fd, []).append(
                            (copy.target - mapped.address, transfer.length)
                        )
            for mapped in mapped_here.values():
                self._pins[mapped] = self._pins.get(mapped, 0) + 1
                pinned.append(mapped)
            number = next(self._transfer_numbers)
            self._active.add(number)
        try:
            for fd, ranges in locked.items():  # (before a piece's deadline check: see there)
                writer_locks.hold(fd, ranges)
            if copies:
                for i, completed in zip(copied, self._copier.run(copies, deadline), strict=True):
                    if not completed:
                        errors[i] = Failure(
                            f"transfer with segment {transfers[i].segment_id} missed its deadline",
                            timed_out=True,
                        )
            for i, file, offset in file_writes:
                errors[i] = _write_file(file, offset, transfers[i], deadline)
            if remote:
                self._run_ucx(transfers, remote, errors, is_get, deadline)
        finally:
            for fd, ranges in locked.items():  # (the mappings are pinned until below)
                writer_locks.let_go(fd, ranges)
            with self._lock:
                for mapped in pinned:
                    self._unpin(mapped)
                self._active.discard(number)
                self._changed.notify_all()
        return errors

    def _run_ucx(
        self,
        transfers: Sequence[Transfer],
        remote: Sequence[tuple[int, Any]],
        errors: list[Failure | None],
        is_get: bool,
        deadline: float,
    ) -> None:
        """Runs ``transfers[i]`` for each (i, memh) of ``remote`` over UCX, on a worker of its
        own; fills ``errors``."""
        lane = self._take_lane(deadline)
        if lane is None:
            for i, _ in remote:
                segment_id = transfers[i].segment_id
                errors[i] = Failure(
                    f"transfer with segment {segment_id} missed its deadline (every UCX worker "
                    "of this client was busy with other threads' transfers)",
                    timed_out=True,
                    node_id=self.node_of(segment_id),
                )
            return
        try:
            ops: list[ucp.Op] = []
            indexes: list[int] = []
            unroutable: dict[str, Failure] = {}  # node (or segment) -> why: tried once per run
            for i, memh in remote:
                transfer = transfers[i]
                route = self._route_or_failure(lane, transfer.segment_id, unroutable)
                if isinstance(route, Failure):
                    errors[i] = route
                    continue
                ops.append(
                    ucp.Op(
                        route.endpoint,
                        route.rkey,
                        transfer.local_address,
                        transfer.remote_address,
                        transfer.length,
                        memh,
                    )
                )
                indexes.append(i)
            if not ops:
                return
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                statuses = [ucp.UCS_ERR_TIMED_OUT] * len(ops)  # no time left: do not start
            else:
                statuses = lane.worker.transfer(
                    ops, is_get=is_get, timeout=timeout, grace=LATE_GRACE
                )
            failed_segments = set()
            remembered = set(self.unreachable.current())  # (as a rule none, and no work below)
            for i, status in zip(indexes, statuses, strict=True):
                segment_id = transfers[i].segment_id
                if status == ucp.UCS_OK:
                    if remembered and (node_id := self.node_of(segment_id)) in remembered:
                        self.unreachable.forget(node_id)  # it answers again
                        remembered.discard(node_id)
                    continue
                failed_segments.add(segment_id)
                if status == ucp.UCS_ERR_TIMED_OUT:
                    errors[i] = Failure(
                        f"transfer with segment {segment_id} missed its deadline",
                        timed_out=True,
                        node_id=self.node_of(segment_id),
                        silent=timeout > 0,  # (else it was never started)
                    )
                else:
                    errors[i] = self._unreachable(
                        segment_id, f"a transfer failed: {ucp.status_string(status)}"
                    )
            if lane.worker.tainted:
                self._replace_worker(lane)
            else:
                for segment_id in failed_segments:
                    self._drop_node_of(lane, segment_id)
        finally:
            self._give_lane_back(lane)

    def close(self) -> None:
        """Lets go of every worker, endpoint, registration and mapping, once the transfers
        other threads still run have ended (within ``CLOSE_WAIT``; past it, what they use is
        left to the process rather than destroyed under them)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._changed.notify_all()  # (threads waiting for a worker give up)
            until = time.monotonic() + CLOSE_WAIT
            while self._active and (left := until - time.monotonic()) > 0:
                self._changed.wait(left)
            drained = not self._active
            for segment_id, _ in list(self._mapped):
                self._unmap(segment_id)
            clean = drained
            if drained:
                for lane in self._lanes:
                    for route in lane.routes.values():
                        route.rkey.destroy()
                    lane.routes.clear()
                    clean = (
                        all([endpoint.close() for endpoint in lane.endpoints.values()]) and clean
                    )
                    lane.endpoints.clear()
                for region in self._regions:
                    region.close()
                self._regions.clear()
            if clean and not self._abandoned:
                for lane in self._lanes:
                    lane.worker.close()
                self.context.close()
            # else: a peer left an endpoint half-closed, a worker was given up, or a transfer
            # still runs; destroying the context under them could abort inside UCX. The
            # process reclaims them.
        self._reaper.stop()
        self._copier.close()
        if self._streams is not None:
            self._streams.close()

    # ---- internals

    def _take_lane(self, deadline: float) -> _Lane | None:
        """An idle worker (made now if fewer than MAX_WORKERS exist); None at ``deadline``."""
        with self._lock:
            while not self._idle:
                if self._closed:
                    raise ClientClosed("the client is closed")
                if len(self._lanes) < MAX_WORKERS:
                    lane = _Lane(self.context.create_worker())
                    self._lanes.append(lane)
                    return lane
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            lane = self._idle.pop()
            stale, lane.stale = lane.stale, set()
            gone, lane.stale_workers = lane.stale_workers, set()
        for segment_id in stale:
            lane.drop_route(segment_id)
        for worker_address in gone:
            endpoint = lane.endpoints.get(worker_address)
            if endpoint is not None:
                lane.drop_endpoint(endpoint, worker_address, ENDPOINT_CLOSE_WAIT)
        return lane

    def _give_lane_back(self, lane: _Lane) -> None:
        """A transfer ended on ``lane``: it is idle again, unless its worker is tainted (no
        fresh one could replace it), when the lane goes (one can be made again later)."""
        with self._lock:
            if lane.worker.tainted:
                self._lanes.remove(lane)
                self._abandoned.append(lane.worker)
            else:
                self._idle.append(lane)
            self._changed.notify_all()

    def _unreachable(self, segment_id: str, why: str) -> Failure:
        """The failure of a transfer whose node could not be reached; remembers the node."""
        node_id = self.node_of(segment_id)
        if node_id:
            self.unreachable.add(node_id)
        return Failure(
            f"cannot reach storage node {node_id or '(unknown)'} (segment {segment_id}): {why}",
            node_id=node_id,
            unreachable=True,
        )

    def _route_or_failure(
        self, lane: _Lane, segment_id: str, unroutable: dict[str, Failure]
    ) -> _Route | Failure:
        """The segment's route on ``lane``, or why there is none (each node is tried once
        per run)."""
        node_id = self.node_of(segment_id) or segment_id
        failure = unroutable.get(node_id)
        if failure is not None:
            return failure
        try:
            return self._route(lane, segment_id)
        except KeyError:
            failure = Failure(f"segment {segment_id} is not known to this client")
        except ucp.UcxError as error:
            why = str(error)
            if error.status == ucp.UCS_ERR_UNREACHABLE:
                why += (
                    f": no UCX transport of this client reaches the node's worker. {_STREAM_ONLY}"
                )
            failure = self._unreachable(segment_id, why)
        except _NoRemoteKey:
            failure = self._unreachable(
                segment_id, f"the node takes no UCX transfers. {_STREAM_ONLY}"
            )
        unroutable[node_id] = failure
        return failure

    def _map_ahead(self, transfers: Sequence[Transfer], *, writable: bool, deadline: float) -> None:
        """Maps the segments of ``transfers`` this client has not tried to map yet (for
        puts, or gets). Outside the client's lock: a handover waits on the node's process
        (HANDOVER_TIMEOUT at most, and not past ``deadline``), and the client's other
        threads go on meanwhile. A segment not mapped goes over the checked stream or UCX."""
        mapped_now = self._mapped  # (read without the lock: a hint, checked again under it)
        maybe = [
            segment_id
            for segment_id in set(map(_SEGMENT_OF, transfers))
            if not _tried(mapped_now, segment_id, writable)
        ]
        if not maybe:  # (every call but the first to a segment)
            return
        with self._lock:
            untried = [
                (segment_id, descriptor)
                for segment_id in maybe
                if (descriptor := self._untried(segment_id, writable=writable)) is not None
            ]
        for segment_id, descriptor in untried:
            timeout = min(HANDOVER_TIMEOUT, deadline - time.monotonic())
            if timeout <= 0:
                return
            shared = descriptor.shared_memory
            try:
                mapped = MAPPINGS.acquire(
                    segment_file(descriptor), writable=writable, timeout=timeout
                )
            except MappingRefused as refusal:
                mapped = None  # another pid namespace or user, the node is gone, or refused
                if shared.socket and not refusal.errno:  # (refused, not just out of reach)
                    log.warning("segment not mapped", segment=segment_id, why=str(refusal))
            with self._lock:
                if (
                    self._closed
                    or (segment_id, writable) in self._mapped  # (another thread was first)
                    or self._descriptors.get(segment_id) is not descriptor  # (a new one came)
                ):
                    if mapped is not None:
                        MAPPINGS.release(mapped)
                    continue
                self._mapped[segment_id, writable] = mapped
                if mapped is not None:
                    self._reaper.watch(mapped.pidfd, segment_id)
                    if writable:  # (gets read through it from now on)
                        self._let_go(self._mapped.pop((segment_id, False), None))

    # (callers of the following hold _lock)

    def _mapping(self, segment_id: str, *, writable: bool) -> MappedSegment | SharedFile | None:
        """The segment's mapping for puts (``writable``) or gets (read-only); None where it
        is not mapped (not on this host, not allowed, refused, or not tried yet: see
        ``_map_ahead``). An NVMe segment's file is held for puts only
        (transport/shared_file.py), never mapped."""
        if not self.same_host_mapping:
            return None
        if not writable and isinstance(
            through_puts := self._mapped.get((segment_id, True)), MappedSegment
        ):
            # (gets read through the puts' mapping where there is one: a second mapping of
            # the segment would fill a second set of page tables, its populator taking CPU
            # from the copies for seconds)
            return through_puts
        return self._mapped.get((segment_id, writable))  # (None too where not tried yet)

    def _untried(self, segment_id: str, *, writable: bool) -> pb.Segment | None:
        """The descriptor of a segment this client may map and has not tried to (for puts,
        or gets); None otherwise. Segments it may not map are noted as not mapped."""
        if _tried(self._mapped, segment_id, writable):
            return None
        descriptor = self._descriptors.get(segment_id)
        if (
            descriptor is not None
            and descriptor.HasField("shared_memory")
            and (shared := descriptor.shared_memory).boot_id == boot_id()
            and (descriptor.map_capability or not shared.socket)
            and (writable or not shared.direct_io)
        ):
            return descriptor
        if descriptor is not None:
            self._mapped[segment_id, writable] = None
        return None

    def _live_mappings(
        self, segment_ids: set[str], *, writable: bool
    ) -> tuple[dict[str, MappedSegment | SharedFile], set[str]]:
        """The mapped ones among ``segment_ids`` (for puts or gets), each checked once for a
        live node; and those whose node has exited (unmapped now: UCX will find that node
        gone too)."""
        live, exited = {}, set()
        for segment_id in segment_ids:
            mapped = self._mapping(segment_id, writable=writable)
            if mapped is None:
                continue
            if mapped.alive():
                live[segment_id] = mapped
            else:
                self._forget_mapping(segment_id)
                exited.add(segment_id)
        return live, exited

    def _plan_copy(self, mapped: MappedSegment, transfer: Transfer, is_get: bool) -> Copy | Failure:
        """The memory copy that carries ``transfer``, or why there is none."""
        segment_id = transfer.segment_id
        try:
            remote = mapped.local_address(transfer.remote_address, transfer.length)
        except ValueError as error:
            return Failure(f"transfer with segment {segment_id} failed: {error}")
        if is_get:
            return Copy(transfer.local_address, remote, transfer.length)
        return Copy(remote, transfer.local_address, transfer.length)

    def _unmap(self, segment_id: str) -> None:
        for writable in (False, True):
            self._let_go(self._mapped.pop((segment_id, writable), None))

    def _let_go(self, mapped: MappedSegment | SharedFile | None) -> None:
        if mapped is not None:
            self._reaper.unwatch(mapped.pidfd)
            if mapped in self._pins:
                later = self._release_later
                later[mapped] = later.get(mapped, 0) + 1  # copies still run through it
            else:
                MAPPINGS.release(mapped)  # unmapped once no other client here uses it

    def _unpin(self, mapped: MappedSegment | SharedFile) -> None:
        count = self._pins[mapped] - 1
        if count:
            self._pins[mapped] = count
            return
        del self._pins[mapped]
        for _ in range(self._release_later.pop(mapped, 0)):
            MAPPINGS.release(mapped)

    def _forget_mapping(self, segment_id: str) -> None:
        """Unmaps a segment whose node exited; until a new descriptor comes, it goes over UCX."""
        self._unmap(segment_id)
        self._mapped[segment_id, False] = self._mapped[segment_id, True] = None

    def _node_exited(self, segment_id: str) -> None:
        """Called by the reaper thread: the node process of a mapped segment has exited."""
        with self._lock:
            mappings = (self._mapped.get((segment_id, w)) for w in (False, True))
            if any(mapped is not None and not mapped.alive() for mapped in mappings):
                self._forget_mapping(segment_id)

    def _memh_for(self, address: int, length: int) -> Any:
        for region in self._regions:
            if region.contains(address, length):
                return region.memh
        return None

    # (callers of the following own ``lane``: they took it with _take_lane)

    def _route(self, lane: _Lane, segment_id: str) -> _Route:
        route = lane.routes.get(segment_id)
        if route is not None and not route.endpoint.closed:
            return route
        descriptor = self._descriptors[segment_id]
        if not descriptor.rkey:  # (a node that serves the checked stream: Segment.peer_rkey)
            raise _NoRemoteKey
        endpoint = lane.endpoints.get(descriptor.worker_address)
        if endpoint is None or endpoint.closed:
            endpoint = self._connect(lane.worker, descriptor.worker_address)
            lane.endpoints[descriptor.worker_address] = endpoint
        route = _Route(descriptor, endpoint, endpoint.unpack_rkey(descriptor.rkey))
        lane.routes[segment_id] = route
        return route

    @staticmethod
    def _connect(worker: ucp.Worker, worker_address: bytes) -> ucp.Endpoint:
        """CMA when the node shares this host, else a force-closable endpoint."""
        endpoint = worker.connect(worker_address)
        if endpoint.uses_transport("cma"):
            return endpoint
        endpoint.close(timeout=0.5)  # unused so far: nothing in flight on it
        return worker.connect(worker_address, peer_errors=True)

    def _replace_worker(self, lane: _Lane) -> None:
        """Gives the lane's worker up after a transfer it could not stop; a fresh one takes
        its place. When none can be made (out of descriptors, say), the tainted worker stays
        on the lane, which then retires (``_transfer``'s end): a request it gave up on may
        still complete into memory its caller has reused, so it must never run again."""
        try:
            fresh = self.context.create_worker()
        except ucp.UcxError as error:
            log.warning("a fresh UCX worker could not be made: one lane fewer", error=str(error))
            return
        for route in lane.routes.values():
            route.rkey.destroy()
        lane.routes.clear()
        lane.endpoints.clear()
        with self._lock:
            self._abandoned.append(lane.worker)
        lane.worker = fresh

    @staticmethod
    def _drop_node_of(lane: _Lane, segment_id: str) -> None:
        """Forgets the lane's endpoint to a failed node and every route through it."""
        route = lane.routes.get(segment_id)
        if route is not None:
            lane.drop_endpoint(route.endpoint, route.descriptor.worker_address)


def _file_offset(file: SharedFile, transfer: Transfer) -> int | Failure:
    """Where a put's ``transfer`` lands in the node's file, or why it cannot."""
    try:
        return file.offset_of(transfer.remote_address, transfer.length)
    except ValueError as error:
        return Failure(f"transfer with segment {transfer.segment_id} failed: {error}")


def _write_file(
    file: SharedFile, offset: int, transfer: Transfer, deadline: float
) -> Failure | None:
    """Writes a put's ``transfer`` into the node's file itself (transport/shared_file.py)."""
    segment_id = transfer.segment_id
    try:
        if file.write(offset, transfer.local_address, transfer.length, deadline):
            return None
    except OSError as error:
        return Failure(f"transfer with segment {segment_id} failed: writing its file: {error}")
    return Failure(f"transfer with segment {segment_id} missed its deadline", timed_out=True)
