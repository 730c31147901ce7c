"""The master's face: a thin ``grpc.aio`` adapter around ``MasterState``, whose handlers the
metadata lane (lane_server.py) also calls, with a context that only aborts.

Each handler checks the request's shape, calls one method of the core and translates the
plain-data result into protobuf; afterwards the core's outbox of node commands goes out over
the nodes' session streams, and PutEnds that waited for their nodes get their answers. All
handlers run on one event loop thread, so the core needs no locks. Whole-call problems are
gRPC status codes; per-key outcomes are KeyStatus values.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from kvpool.common.logging import get_logger
from kvpool.common.status import KeyStatus, Pin, Tier
from kvpool.master import metrics
from kvpool.master.command_batching import merge_forgets
from kvpool.master.commands_pb import command_to_pb, stored_from_pb
from kvpool.master.forget_barrier import ForgetBarrier
from kvpool.master.node_channels import BOUND_TO_PROCESS, NodeChannels
from kvpool.master.records import (
    Commit,
    ForgetCommand,
    PlacedReplica,
    PutOptions,
    PutSlot,
    SegmentInfo,
)
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc

log = get_logger("kvpool.master")

MAX_BATCH = 65536
#: How long the master waits for a node to answer a command before counting it failed.
COMMAND_TIMEOUT = 5.0
#: How long a PutStart waits for nodes to forget what lay where it reserved (forget_barrier.py).
FORGET_WAIT = 1.0


class MasterService(master_pb2_grpc.MasterServicer):
    def __init__(self, state: MasterState | None, command_timeout: float = COMMAND_TIMEOUT) -> None:
        """``state`` is None on a standby: the leader gate then turns every call away."""
        self.state = state  # type: ignore[assignment]
        self.command_timeout = command_timeout
        #: Where the cluster's storage nodes are listed (etcd in HA mode; else nowhere).
        self.registry: Any = None
        #: Where the metadata lane listens (0: no lane); clients ask through ``Lane``.
        self.lane_port = 0
        #: After an election: nodes to wait for, and until when, before answering clients
        #: from an index that is rebuilt from what the nodes report.
        self._awaited_nodes: set[str] = set()
        self._rebuild_deadline = 0.0
        self.channels = NodeChannels()
        self.forgets = ForgetBarrier()
        self._segment_pbs: dict[str, tuple[SegmentInfo, pb.Segment]] = {}
        #: (key, put_id) -> the PutEnd calls waiting for nodes to record the object, each with
        #: the object's place in its batch.
        self._commits: dict[tuple[str, int], list[tuple[_CommitWait, int]]] = {}

    def accepting_clients(self) -> bool:
        """False while a new leader still waits for known nodes to report what they hold:
        it would answer NOT_FOUND for objects it has not heard of yet."""
        if not self._awaited_nodes or self.state is None:
            return True
        if time.monotonic() >= self._rebuild_deadline:
            self._awaited_nodes = set()
            return True
        self._awaited_nodes -= set(self.state.nodes)
        return not self._awaited_nodes

    def reset(
        self,
        state: MasterState | None,
        awaited_nodes: set[str] | None = None,
        rebuild_window: float = 0.0,
    ) -> None:
        """A new term begins (``state``: a fresh core) or ends (None). What the old term
        left pending is answered (commits: STALE_PUT, the writer must put again) and the
        nodes' streams are closed, so they reconnect to whoever leads now."""
        for waits in self._commits.values():
            for wait, index in waits:
                wait.settle(index, KeyStatus.STALE_PUT)
        self._commits.clear()
        self.channels.close_all()
        self.channels = NodeChannels()
        self.forgets.clear()
        self.forgets = ForgetBarrier()
        self.state = state  # type: ignore[assignment]
        self._awaited_nodes = set(awaited_nodes or ())
        self._rebuild_deadline = time.monotonic() + rebuild_window

    def _rpc(self, method: str) -> _observe:
        return _observe(method, self.after_state_change)

    def after_state_change(self) -> list[asyncio.Future[None]]:
        """Sends the core's node commands and answers PutEnds whose objects were settled.
        Returns the answers to come of the Forgets it sent."""
        state = self.state
        forgets: list[asyncio.Future[None]] = []
        if state is None:
            return forgets
        if state.outbox:
            loop = asyncio.get_running_loop()
            for command in merge_forgets(state.outbox):
                if isinstance(command, ForgetCommand):
                    forgets.append(self.forgets.sent(command))
                self.channels.send(command.node_id, command_to_pb(command))
                if state.awaiting(command.command_id):
                    loop.call_later(self.command_timeout, self._expire, command.command_id)
            state.outbox.clear()
        if state.resolved:
            for result in state.resolved:
                for wait, index in self._commits.pop((result.key, result.put_id), ()):
                    wait.settle(index, result.status)
            state.resolved.clear()
        return forgets

    def _expire(self, command_id: int) -> None:
        if self.state is not None and self.state.awaiting(command_id):
            log.warning("a storage node did not answer in time", command_id=command_id)
            self.state.command_expired(command_id)
            self.after_state_change()

    # ---- node side

    async def MountSegment(self, request, context):
        with self._rpc("MountSegment"):
            s = request.segment
            if not s.segment_id or not s.node_id or not s.worker_address or not s.size:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "MountSegment needs segment_id, node_id, worker_address and size",
                )
            info = SegmentInfo(
                segment_id=s.segment_id,
                node_id=s.node_id,
                host=s.host,
                worker_address=s.worker_address,
                base_address=s.base_address,
                size=s.size,
                rkey=s.rkey,
                tier=Tier(s.tier) if s.tier else Tier.DRAM,
                persistent=s.persistent,
                shared_memory=(
                    s.shared_memory.SerializeToString() if s.HasField("shared_memory") else b""
                ),
            )
            dropped = self.state.mount_segment(
                info,
                [stored_from_pb(o) for o in request.objects],
                remount=request.remount,
                silent=request.silent_ms / 1000.0,
            )
            if self.registry is not None:
                self.registry.node_seen(info.node_id)
            if request.objects:
                log.info(
                    "segment remounted with objects",
                    segment=info.segment_id,
                    reported=len(request.objects),
                    dropped=len(dropped),
                )
            return pb.MountSegmentResponse(dropped_keys=dropped)

    async def UnmountSegment(self, request, context):
        with self._rpc("UnmountSegment"):
            lost, drain = self.state.unmount_segment(request.node_id, request.segment_id)
            return pb.UnmountSegmentResponse(objects_removed=lost, drain_ms=int(drain * 1000))

    async def Heartbeat(self, request, context):
        with self._rpc("Heartbeat"):
            remount = self.state.heartbeat(request.node_id, request.segment_ids)
            return pb.HeartbeatResponse(remount_segment_ids=remount)

    # ---- client side

    async def PutStart(self, request, context):
        with self._rpc("PutStart"):
            await _check_batch(context, request.keys, sizes=request.sizes)
            options = PutOptions(
                replicas=request.replicas,
                preferred_hosts=tuple(request.preferred_hosts),
                pin=Pin(request.pin),
                pin_ttl=request.pin_ttl_ms / 1000.0,
                tier=Tier(request.tier),
            )
            state = self.state
            slots = state.put_start(request.client_id, request.keys, request.sizes, options)
            self.after_state_change()  # sends the Forgets of what this call evicted
            slots = await self._clear_of_forgets(state, request, slots)
            if self.state is not state:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, "the master's term ended meanwhile: retry"
                )
            response = pb.PutStartResponse(
                write_timeout_ms=int(self.state.config.write_timeout * 1000)
            )
            segments: dict[str, pb.Segment] = {}
            for slot in slots:
                out = response.slots.add(status=slot.status, put_id=slot.put_id)
                if slot.message:
                    out.message = slot.message
                self._add_replicas(out.replicas, slot.replicas, segments)
            response.segments.extend(segments.values())
            _count("PutStart", (slot.status for slot in slots))
            return response

    async def _clear_of_forgets(
        self, state: MasterState, request: pb.PutStartRequest, slots: list[PutSlot]
    ) -> list[PutSlot]:
        """Holds back slots whose space a node may still list under an older object (see
        forget_barrier.py); a slot still held after FORGET_WAIT is revoked as FENCED (the
        client retries it)."""
        if not self.forgets:
            return slots  # no Forget unanswered anywhere: the common case, at no cost
        waits: dict[int, list[asyncio.Future[None]]] = {}
        for i, slot in enumerate(slots):
            if slot.status is not KeyStatus.OK:
                continue
            pending = [
                answer
                for r in slot.replicas
                for answer in self.forgets.pending(
                    r.segment.segment_id, r.address - r.segment.base_address, request.sizes[i]
                )
            ]
            if pending:
                waits[i] = pending
        if not waits:
            return slots
        await asyncio.wait({a for answers in waits.values() for a in answers}, timeout=FORGET_WAIT)
        late = [i for i, answers in waits.items() if not all(a.done() for a in answers)]
        if not late or self.state is not state:
            return slots
        state.put_revoke([request.keys[i] for i in late], [slots[i].put_id for i in late])
        slots = list(slots)
        for i in late:
            slots[i] = PutSlot(
                KeyStatus.FENCED,
                message="its storage node has not yet confirmed that it cleared the space: retry",
            )
        return slots

    async def PutEnd(self, request, context):
        with self._rpc("PutEnd"):
            await _check_batch(context, request.commits)
            commits = [
                Commit(
                    c.key, c.put_id, tuple(c.replica_ok), c.crc32c if c.HasField("crc32c") else None
                )
                for c in request.commits
            ]
            statuses = self.state.put_end(commits)
            wait = _CommitWait(statuses)
            for i, (commit, status) in enumerate(zip(commits, statuses, strict=True)):
                if status is None:
                    self._commits.setdefault((commit.key, commit.put_id), []).append((wait, i))
        await wait.done  # nodes record the objects; the timeouts in _expire bound this wait
        _count("PutEnd", statuses)
        return pb.PutEndResponse(statuses=statuses)

    async def NodeSession(self, request_iterator, context):
        """A node's command stream: its hello, then an answer per command we send."""
        hello = await anext(aiter(request_iterator), None)
        if hello is None or not hello.HasField("hello") or not hello.hello.node_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "say hello with a node_id first")
        node_id = hello.hello.node_id
        session = object()
        # This term's: a new term replaces them (and numbers its commands afresh).
        channels = self.channels
        term = (self.state, channels, self.forgets)
        queue = channels.attach(
            node_id,
            session,
            self._still_wanted,
            hello.hello.incarnation,
            send_now=getattr(request_iterator, "send_now", None),  # the lane's stream can
        )
        reader = asyncio.create_task(self._read_reports(request_iterator, term, node_id))
        # When the node's side ends, so does this handler: cancelling a wait on the queue
        # takes nothing out of it, so every command stays for the node's next stream.
        handler = asyncio.current_task()

        def end_with_the_node(_: asyncio.Task) -> None:
            if handler is not None and not handler.done():
                handler.cancel()

        reader.add_done_callback(end_with_the_node)
        log.info("node session open", node_id=node_id)
        try:
            while True:
                command = await queue.get()
                if command is None:  # the term ended: the node must find the new leader
                    return
                channels.written(node_id, command)
                yield command
        except asyncio.CancelledError:
            if not reader.done():
                raise  # gRPC ended the call
        finally:
            reader.remove_done_callback(end_with_the_node)
            channels.detach(node_id, session)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            log.info("node session closed", node_id=node_id)

    def _still_wanted(self, command: pb.NodeCommand) -> bool:
        """Whether a command a broken stream may have lost is worth sending again: not a
        Persist or Copy the master stopped waiting for (its target may be reused by now)."""
        if command.WhichOneof("kind") in BOUND_TO_PROCESS:  # the commands the core awaits
            return self.state is not None and self.state.awaiting(command.command_id)
        return True

    async def _read_reports(
        self,
        request_iterator,
        term: tuple[MasterState, NodeChannels, ForgetBarrier],
        node_id: str,
    ) -> None:
        """Applies the node's reports until its side ends or the term does. A stream that
        can hand each report over as it arrives (the lane's, ``deliver_to``) does so, sparing
        a pass of the event loop per report on every put's critical path."""
        on_report = functools.partial(self._on_report, term, node_id)
        deliver_to = getattr(request_iterator, "deliver_to", None)
        if deliver_to is not None:
            await deliver_to(on_report)
            return
        async for report in request_iterator:
            if not on_report(report):
                return

    def _on_report(
        self,
        term: tuple[MasterState, NodeChannels, ForgetBarrier],
        node_id: str,
        report: pb.NodeReport,
    ) -> bool:
        """Applies one report; False once the term it belongs to has ended (ids start afresh
        each term, so its answers must change nothing)."""
        state, channels, forgets = term
        if self.state is not state:
            return False
        if report.HasField("result"):
            result = report.result
            channels.answered(node_id, result.command_id)
            forgets.answered(result.command_id)
            with self._rpc("NodeResult"):
                if not result.ok and result.error:
                    log.warning("a node command failed", error=result.error)
                state.command_done(result.command_id, result.ok, list(result.crc32c))
        return True

    async def PutRevoke(self, request, context):
        with self._rpc("PutRevoke"):
            await _check_batch(context, request.keys, sizes=request.put_ids)
            statuses = self.state.put_revoke(request.keys, request.put_ids)
            _count("PutRevoke", statuses)
            return pb.PutRevokeResponse(statuses=statuses)

    async def GetReplicas(self, request, context):
        with self._rpc("GetReplicas"):
            await _check_batch(context, request.keys)
            locations, ttl = self.state.get_replicas(request.keys, request.lease_ms / 1000.0)
            response = pb.GetReplicasResponse(lease_ms=int(ttl * 1000))
            segments: dict[str, pb.Segment] = {}
            for location in locations:
                out = response.objects.add(status=location.status, size=location.size)
                if location.crc32c is not None:
                    out.crc32c = location.crc32c
                self._add_replicas(out.replicas, location.replicas, segments)
            response.segments.extend(segments.values())
            _count("GetReplicas", (loc.status for loc in locations))
            return response

    async def Exists(self, request, context):
        with self._rpc("Exists"):
            await _check_batch(context, request.keys)
            statuses = self.state.exists(
                request.keys, request.lease_ms / 1000.0, grant_lease=not request.no_lease
            )
            _count("Exists", statuses)
            return pb.ExistsResponse(statuses=statuses)

    async def Remove(self, request, context):
        with self._rpc("Remove"):
            await _check_batch(context, request.keys)
            statuses = self.state.remove(request.keys, request.force)
            forgotten = self.after_state_change()
        await _until_nodes_forgot(forgotten)
        _count("Remove", statuses)
        return pb.RemoveResponse(statuses=statuses)

    async def RemovePrefix(self, request, context):
        with self._rpc("RemovePrefix"):
            result = self.state.remove_prefix(request.prefix, request.force)
            forgotten = self.after_state_change()
        await _until_nodes_forgot(forgotten)
        return pb.RemovePrefixResponse(
            removed=result.removed, leased=result.leased, not_ready=result.not_ready
        )

    async def Stat(self, request, context):
        with self._rpc("Stat"):
            info = self.state.stat(request.key)
            response = pb.StatResponse(
                status=info.status,
                size=info.size,
                state=info.state,
                lease_remaining_ms=int(info.lease_remaining * 1000),
                pin=info.pin,
                pin_remaining_ms=int(info.pin_remaining * 1000),
                age_ms=int(info.age * 1000),
                idle_ms=int(info.idle * 1000),
            )
            if info.crc32c is not None:
                response.crc32c = info.crc32c
            for replica in info.replicas:
                response.replicas.add(
                    segment_id=replica.segment.segment_id,
                    node_id=replica.segment.node_id,
                    host=replica.segment.host,
                    tier=replica.segment.tier,
                    address=replica.address,
                )
            return response

    async def ClientHeartbeat(self, request, context):
        with self._rpc("ClientHeartbeat"):
            self.state.client_heartbeat(request.client_id)
            return pb.ClientHeartbeatResponse()

    async def ListKeys(self, request, context):
        with self._rpc("ListKeys"):
            page = self.state.list_keys(request.prefix, request.limit, request.start_after)
            return pb.ListKeysResponse(
                keys=page.keys, sizes=page.sizes, next_start_after=page.next_start_after
            )

    async def ClusterStatus(self, request, context):
        with self._rpc("ClusterStatus"):
            snapshot = self.state.snapshot()
            response = pb.ClusterStatusResponse(
                objects=snapshot.objects,
                reservations=snapshot.reservations,
                nodes=snapshot.nodes,
                uptime_s=time.monotonic() - _STARTED,
            )
            for s in snapshot.segments:
                response.segments.add(
                    segment_id=s.info.segment_id,
                    node_id=s.info.node_id,
                    host=s.info.host,
                    tier=s.info.tier,
                    capacity=s.capacity,
                    used=s.used,
                    objects=s.objects,
                    largest_free=s.largest_free,
                    persistent=s.info.persistent,
                )
            return response

    async def Lane(self, request, context):
        return pb.LaneResponse(port=self.lane_port)

    # ---- helpers

    def _add_replicas(
        self, out, replicas: Iterable[PlacedReplica], segments: dict[str, pb.Segment]
    ) -> None:
        for replica in replicas:
            segment_id = replica.segment.segment_id
            out.add(segment_id=segment_id, address=replica.address)
            if segment_id not in segments:
                segments[segment_id] = self._segment_pb(replica.segment)

    def _segment_pb(self, info: SegmentInfo) -> pb.Segment:
        cached = self._segment_pbs.get(info.segment_id)
        if cached is None or cached[0] is not info:
            message = pb.Segment(
                segment_id=info.segment_id,
                node_id=info.node_id,
                host=info.host,
                worker_address=info.worker_address,
                base_address=info.base_address,
                size=info.size,
                rkey=info.rkey,
                tier=info.tier,
                persistent=info.persistent,
            )
            if info.shared_memory:
                message.shared_memory.ParseFromString(info.shared_memory)
            cached = self._segment_pbs[info.segment_id] = (info, message)
        return cached[1]


_STARTED = time.monotonic()


class _CommitWait:
    """One PutEnd call waiting for its objects' nodes: ``statuses`` fills in as they answer
    (None: still waiting), and ``done`` resolves when none is left."""

    __slots__ = ("_left", "done", "statuses")

    def __init__(self, statuses: list[KeyStatus | None]) -> None:
        self.statuses = statuses
        self._left = statuses.count(None)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self._left:
            self.done.set_result(None)

    def settle(self, index: int, status: KeyStatus) -> None:
        if self.statuses[index] is None:
            self.statuses[index] = status
            self._left -= 1
            if not self._left and not self.done.done():
                self.done.set_result(None)


class _observe:
    """Counts an RPC, times it into the latency histogram, then runs ``after``."""

    __slots__ = ("_after", "_method", "_start")

    def __init__(self, method: str, after: Callable[[], None]) -> None:
        self._method = method
        self._after = after

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._after()
        metrics.labelled(metrics.REQUESTS, self._method).inc()
        metrics.labelled(metrics.LATENCY, self._method).observe(time.perf_counter() - self._start)


#: The ``status`` label of each KeyStatus value.
_STATUS_LABELS = {status.value: status.name.lower() for status in KeyStatus}


def _count(method: str, statuses: Iterable[int | None]) -> None:
    for status, n in collections.Counter(statuses).items():  # (counted in C)
        metrics.labelled(metrics.KEYS, method, _STATUS_LABELS[status]).inc(n)


async def _until_nodes_forgot(answers: list[asyncio.Future[None]]) -> None:
    """A removal answers once the nodes have dropped what it removed (or FORGET_WAIT has
    passed: a node that is away gets the Forget when it comes back). Answered earlier, a
    master that died before its nodes heard would leave a new leader to adopt the removed
    objects again from what the nodes report."""
    if answers:
        await asyncio.wait(answers, timeout=FORGET_WAIT)


async def _check_batch(context, keys, *, sizes=None) -> None:
    if len(keys) > MAX_BATCH:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"a batch holds at most {MAX_BATCH} keys, got {len(keys)}: split it",
        )
    if sizes is not None and len(sizes) != len(keys):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{len(keys)} keys but {len(sizes)} sizes/ids: send one per key",
        )
