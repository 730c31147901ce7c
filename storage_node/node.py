"""A storage node: owns segments, keeps UCX progressing, and keeps the master informed.

The node never handles payload bytes itself: clients read and write its segments with
one-sided UCX operations. Its own work is to keep its UCX worker progressing (needed for
TCP's software RMA) on a thread that sleeps on the worker's event fd; to mount its segments at
the master, with the objects they already hold; to heartbeat; to remount when the master asks
(after a master restart); to carry out the master's commands (record published objects,
forget removed ones, copy between tiers, copy another node's objects in) over its session
stream; and to unmount cleanly when told to stop.

Draining: a node told to stop with ``drain_on_term`` (or one the master drains, at an admin's
``kvpool drain``) first says so in its heartbeats: the master places nothing new here and
copies every object that would otherwise lose a replica to other nodes. The node keeps
serving (reads, its command stream) until the master reports nothing left to copy, or
``drain_timeout`` has passed; then it unmounts and stops.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from kvpool.common import lane_protocol as lp
from kvpool.common.aio import pause
from kvpool.common.leader_resolver import LEADER_METADATA, LeaderResolver
from kvpool.common.limits import GRPC_MESSAGE_OPTIONS
from kvpool.common.listen_address import host_port
from kvpool.common.log_throttle import LogThrottle
from kvpool.common.logging import get_logger
from kvpool.common.master_address import MasterTarget, host_of
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security import capabilities as caps
from kvpool.security.caller import ANONYMOUS, CallerCredentials
from kvpool.storage_node import lane_session, metrics
from kvpool.storage_node.checked_server import CheckedServer, NodeKeys
from kvpool.storage_node.checked_writes import WrittenRanges
from kvpool.storage_node.clock_offset import ClockOffset
from kvpool.storage_node.commands import CommandExecutor
from kvpool.storage_node.index_log import Entry
from kvpool.storage_node.mapping_server import MappingServer
from kvpool.storage_node.peer_copy import PeerCopier
from kvpool.storage_node.segment import Segment
from kvpool.transport import ucp

log = get_logger("kvpool.node")
_In = TypeVar("_In")
_Out = TypeVar("_Out")

#: Seconds the node waits for the master's answers while the master has not said its node
#: TTL (an older master; or none answered yet), and at least once it has (``call_deadline``).
RPC_TIMEOUT = 2.0
#: Seconds a mount's deadline grows by per object it reports.
ADOPT_ALLOWANCE = 50e-6
#: How often a command stream that waits for the first mount looks again.
MOUNT_POLL = 0.05
#: How long a stopping node waits for a command running on a worker thread (a copy, a sync).
COMMAND_GRACE = 60.0
#: Longest pause between heartbeats while draining: the node leaves soon after the last copy.
DRAIN_POLL = 0.25
#: How often a node that goes on looking for the leading master says so (a search's first
#: look, and a leader newly named, are said at once).
SEARCH_LOG_INTERVAL = 60.0
#: How a standby's refusal begins (master/leader_gate.py): with no leader named, none is
#: elected yet (or the standby, cut off from etcd, cannot know).
NOT_THE_LEADER = "not the leader"


def call_deadline(node_ttl: float, heartbeat_interval: float) -> float:
    """Seconds a node waits for the master's answer to a heartbeat, a lane lookup or a mount
    (a mount adds ADOPT_ALLOWANCE an object it reports): the master's node TTL (``node_ttl``,
    as its last answer said) less a heartbeat interval, never under RPC_TIMEOUT. An answer
    that comes that late still comes before the master would declare the node dead: a slow
    link to the master is no reason to give up on it. RPC_TIMEOUT while the TTL is not known
    (0). One heartbeat at a time: the next is sent once this one is answered or failed."""
    if node_ttl <= 0:
        return RPC_TIMEOUT
    return max(RPC_TIMEOUT, node_ttl - heartbeat_interval)


def gives_up(
    code: grpc.StatusCode,
    failures: int,
    unanswered_for: float,
    node_ttl: float,
    heartbeat_interval: float,
) -> bool:
    """Whether a node whose call to the master just failed leaves this master (its channel,
    its session) and asks again who leads. ``failures``: the calls failed in a row, this one
    included; ``unanswered_for``: seconds since this master last answered (or since the node
    connected to it); ``node_ttl``: the master's node TTL as it last said (0: not known).

    A refused connection (UNAVAILABLE: the master is down, restarting, or gone in a failover),
    or a master that has not said its TTL: at every second failure, as before. Else (no answer
    in time, an error): once the master has not answered for about its node TTL (the last
    heartbeat interval of it spent in the pause between two calls): it would declare the node
    dead by then anyway. (A standby's refusal, or etcd naming another leader, moves the node at
    once: ``StorageNode._sync_with_master``.)"""
    if code == grpc.StatusCode.UNAVAILABLE or node_ttl <= 0:
        return failures % 2 == 0
    return unanswered_for + heartbeat_interval >= node_ttl


class LeaderMoved(Exception):
    """Another master leads than the one a call waits for: the node goes there."""

    def __init__(self, leader: str) -> None:
        super().__init__(leader)
        self.leader = leader


class WaitedEnough(Exception):
    """A node that leaves waits no longer than RPC_TIMEOUT for the master, as before."""


def report_parts(
    objects: list[pb.StoredObject], most: int = lp.MAX_BATCH_KEYS
) -> Iterator[tuple[list[pb.StoredObject], tuple[bool, bool]]]:
    """A segment's objects as the parts of its mount report: (part, (continued, more)),
    newest first (where two overlap, the master keeps the one it adopts first), at most
    ``most`` a part (the master's batch limit); one part, maybe empty, when they fit."""
    if len(objects) <= most:
        yield objects, (False, False)
        return
    newest_first = sorted(objects, key=lambda o: o.generation, reverse=True)
    for start in range(0, len(newest_first), most):
        part = newest_first[start : start + most]
        yield part, (start > 0, start + most < len(newest_first))


class StorageNode:
    def __init__(
        self,
        *,
        node_id: str,
        host: str,
        master: MasterTarget,
        context: ucp.Context,
        worker: ucp.Worker,
        segments: list[Segment],
        heartbeat_interval: float = 1.0,
        drain_timeout: float = 30.0,
        credentials: CallerCredentials = ANONYMOUS,
        drain_on_term: bool = False,
        checked: tuple[str, int, str] | None = None,
        tenant: str = "",
        mapping: bool = False,
        prove_writes: bool = True,
    ) -> None:
        """``drain_timeout``: how long a node that stops keeps its memory for readers that
        hold leases; and, draining, how long it waits for its objects to be copied away.
        ``drain_on_term``: a stop (SIGTERM) drains first. ``checked``: (address, port,
        advertised host) of the checked stream (storage_node/checked_server.py); None: none.
        ``tenant``: the one tenant whose objects the segments hold ("": any tenant's).
        ``mapping``: hand the segments' files to clients of ``tenant`` holding the master's
        map grant (storage_node/mapping_server.py). ``prove_writes``: with a checked stream
        and no ``tenant``, record only objects whose writers wrote every byte over the stream
        (storage_node/checked_writes.py); off where UCX is offered over TCP, which writes
        unseen."""
        self.node_id = node_id
        self.credentials = credentials
        #: gRPC metadata of every call to the master: the node's token.
        self._metadata = credentials.metadata
        self.incarnation = uuid.uuid4().hex  # this process (see NodeHello)
        self.host = host
        self.master = str(master)
        self._resolver = LeaderResolver(master)
        self.context = context
        self.worker = worker
        self.segments = segments
        self.heartbeat_interval = heartbeat_interval
        self.drain_timeout = drain_timeout
        self.mounted: set[str] = set()
        #: Segments this process has mounted at some master: mounting them again tells the
        #: master to fence them (old-term writers may still be copying).
        self._ever_mounted: set[str] = set()
        self._worker_address = worker.address
        #: When a master last answered us (for the fence after a master change).
        self._last_contact = time.monotonic()
        self._clock_offset = ClockOffset()
        self._progress = ucp.ProgressThread(worker)
        self._failures = 0
        #: The master's node TTL, as its last answer said (0: not known, or an older master
        #: that does not say): how long the node waits for the master (``call_deadline``,
        #: ``gives_up``).
        self._node_ttl = 0.0
        #: When the master the node follows last answered, or the node connected to it.
        self._answered_at = time.monotonic()
        #: The search for the leading master (what it logs), and why the node looks now.
        self._search = LeaderSearch()
        self._why_looking = ""
        self._peers = PeerCopier(context)
        self.drain_on_term = drain_on_term
        #: Draining: until when at most, whether the master said nothing is left, and what
        #: it last said was left (objects, bytes).
        self._draining = False
        self._drain_deadline = 0.0
        self._drained = False
        self._drain_left = (-1, -1)
        #: Set once the node decided to leave (stopped, or drained): ends its command stream.
        self._leave: asyncio.Event | None = None
        #: Set when the node is told to stop (``run``'s).
        self._stop: asyncio.Event | None = None
        #: The command running on a worker thread, if any (commands run one at a time).
        self._command_running: asyncio.Future[Any] | None = None
        #: The capability keys the master delivered last (None: none yet, or it grants none).
        self.capability_keys: NodeKeys | None = None
        self.checked: CheckedServer | None = None
        self.checked_address = ""
        if checked is not None:
            listen, port, advertised = checked
            # (a segment of one tenant holds nothing another could read; with UCX offered
            # over TCP, its peers write where they like, unseen by the node: their choice)
            written = WrittenRanges() if prove_writes and not tenant else None
            self.checked = CheckedServer(
                segments, lambda: self.capability_keys, host=listen, port=port, written=written
            )
            self.checked_address = host_port(advertised, self.checked.port)
        self.tenant = tenant
        self.mapping: MappingServer | None = None
        if mapping and tenant:
            self.mapping = MappingServer(segments, lambda: self.capability_keys, tenant)
        seals = self.checked.seals if self.checked is not None else None
        if seals is not None:
            metrics.SEALS.set_function(seals.__len__)
        written = self.checked.written if self.checked is not None else None
        self._executor = CommandExecutor(
            segments, self._peers, seals, written, term=self._verifying_term
        )

    @property
    def ready(self) -> tuple[bool, str]:
        missing = len(self.segments) - len(self.mounted)
        if missing:
            return False, f"{missing} segment(s) not mounted at master {self.master}"
        return True, f"{len(self.segments)} segment(s) mounted"

    async def run(self, stop: asyncio.Event, on_ready: Callable[[], None] | None = None) -> None:
        """Serves until ``stop`` is set, then unmounts and releases everything."""
        self._progress.start()
        if self.checked is not None:
            self.checked.start()
        if self.mapping is not None:
            self.mapping.start()
        for segment in self.segments:
            metrics.SEGMENT_BYTES.labels(segment.segment_id, segment.tier.name.lower()).set(
                segment.size
            )
        metrics.HOLDINGS.watch(self.segments, asyncio.get_running_loop())
        announced = False
        drain = 0.0
        self._leave = leave = asyncio.Event()
        self._stop = stop
        while True:
            leader = await asyncio.to_thread(lambda: self._resolver.current)
            if not leader:
                if self._leaving(stop):
                    break
                self._looking("(none)", "", "etcd names no leader")
                await pause(stop, self.heartbeat_interval)
                await asyncio.to_thread(self._resolver.failed)
                continue
            async with self.credentials.aio_channel(leader, GRPC_MESSAGE_OPTIONS) as channel:
                stub = master_pb2_grpc.MasterStub(channel)
                self.mounted.clear()  # a new leader (or the first): mount everything there
                self._answered_at = time.monotonic()
                session_over = asyncio.Event()
                session = asyncio.create_task(self._keep_session(stub, leader, leave, session_over))
                hint = None
                while not self._leaving(stop) and hint is None:
                    hint = await self._sync_with_master(stub, leader)
                    if hint is None and not self._failures and (looks := self._search.found()):
                        log.info("following the leading master", master=leader, looks=looks)
                    if not announced and self.ready[0]:
                        announced = True
                        log.info("node ready", node_id=self.node_id, segments=len(self.segments))
                        if on_ready is not None:
                            on_ready()
                    if hint is None:
                        await self._pause(stop)
                if leave.is_set():
                    drain = await self._unmount_all(stub)
                session_over.set()
                session.cancel()
                await asyncio.wait({session}, timeout=2 * RPC_TIMEOUT)
            if leave.is_set():
                break
            self._looking(leader, hint or "", self._why_looking)
            if not hint and not self._leaving(stop):
                # (refused, or no leader named: asked again at once, a process refused for
                # another of its node's spun, calling the master hundreds of times a second)
                await pause(stop, self.heartbeat_interval)
            await asyncio.to_thread(self._resolver.failed, hint or "")
        if drain > 0:
            # Readers may still be copying out of objects leased before the unmount: keep the
            # memory (and UCX progressing) until their leases end, within the drain timeout.
            wait = min(drain, self.drain_timeout)
            log.info("draining in-flight reads", seconds=round(wait, 3), leases_end_in=drain)
            await asyncio.sleep(wait)
        # A copy or disk sync may still be running on a worker thread: the segments it touches
        # must outlive it.
        if not await self._commands_finished(timeout=COMMAND_GRACE):
            log.warning("a command still runs; leaving its memory to the process exit")
            return
        self.close()

    def _looking(self, was: str, hint: str, why: str) -> None:
        """One more look for the leading master: said as ``LeaderSearch`` lets it (a
        search lasts as long as an etcd outage: a line a look would flood the log)."""
        suppressed = self._search.look(hint)
        if suppressed is not None:
            log.warning(
                "looking for the leading master",
                was=was,
                hint=hint or "(ask again)",
                why=why or "(unknown)",
                looks=self._search.looks,
                suppressed=suppressed,
            )

    def _leaving(self, stop: asyncio.Event) -> bool:
        """Whether the node leaves now (and sets ``_leave`` if so): told to stop and not
        draining, or drained, or past its drain deadline. A stop with ``drain_on_term``
        starts the drain instead."""
        assert self._leave is not None
        if self._leave.is_set():
            return True
        if self._draining:
            if self._drained:
                log.info("drained: leaving", node_id=self.node_id)
            elif time.monotonic() >= self._drain_deadline:
                objects, size = self._drain_left
                log.warning(
                    "drain deadline passed: leaving with objects not copied away",
                    objects_left=objects if objects >= 0 else "(unknown: no answer)",
                    bytes_left=size if size >= 0 else "(unknown)",
                    drain_timeout=self.drain_timeout,
                )
            else:
                return False
        elif stop.is_set() and self.drain_on_term and self.mounted:
            self._start_drain("stopping (--drain-on-term)")
            return False
        elif not stop.is_set():
            return False
        self._leave.set()
        return True

    def _unreadable(self) -> list[tuple[Segment, list[Entry]]]:
        """The objects whose reads failed on the disk since the last heartbeat, by segment
        (storage_node/unreadable.py)."""
        found = []
        for segment in self.segments:
            entries = segment.unreadable.take(segment.index.entries)
            if entries:
                found.append((segment, entries))
        return found

    def _compare_clocks(self, sent: float, received: float, master_time_ms: int) -> None:
        """This node's wall clock against the master's (storage_node/clock_offset.py):
        capabilities are checked against it."""
        keys = self.capability_keys
        allowed_ms = keys.max_skew_ms if keys is not None else caps.DEFAULT_MAX_SKEW_MS
        estimate = self._clock_offset.heard(sent, received, master_time_ms, allowed_ms)
        if estimate is None:
            return
        metrics.CLOCK_OFFSET.set(estimate.offset)
        said = self._clock_offset.warn(time.monotonic())
        if said == "too_far":
            log.warning(
                "this node's wall clock is far from the master's: capabilities it checks end "
                "too early or start too late, and transfers are refused as EXPIRED; keep the "
                "clocks of the cluster in sync (NTP, chrony)",
                node_minus_master_s=round(estimate.offset, 3),
                uncertainty_s=round(estimate.uncertainty, 3),
                allowed_s=allowed_ms / 1000,
            )
        elif said == "back_in_range":
            log.info(
                "this node's wall clock agrees with the master's again",
                node_minus_master_s=round(estimate.offset, 3),
            )

    def _verifying_term(self) -> int | None:
        """The term whose capabilities the checked stream honours now (None: no keys)."""
        keys = self.capability_keys
        return None if keys is None else keys.term

    def _learn_keys(self, response: pb.MountSegmentResponse | pb.HeartbeatResponse) -> None:
        """Takes the capability keys a master's answer carries (over this node's
        authenticated session): the checked stream verifies with them from now on."""
        if not response.HasField("capability_keys"):
            return
        delivered = response.capability_keys
        known = self.capability_keys
        ids = sorted(key.key_id for key in delivered.keys)
        if (
            known is not None
            and known.term == delivered.term
            and known.max_skew_ms == delivered.max_skew_ms
            and known.ring.key_ids() == ids
            # (the same ids may come with other secrets: a master of the previous version
            # delivered its own keys, this one the node's)
            and all(known.ring.secret(key.key_id) == key.secret for key in delivered.keys)
        ):
            return  # (the usual heartbeat: nothing new)
        try:
            ring = caps.KeyRing((key.key_id, key.secret) for key in delivered.keys[: caps.MAX_KEYS])
        except ValueError as error:
            if (suppressed := NODE_LOGS.allow("keys refused")) is not None:
                log.error(
                    "capability keys from the master refused",
                    error=str(error),
                    suppressed=suppressed,
                )
            return
        # (the term of the master this node follows now: older terms' grants are refused.
        # Not the highest ever seen: a cluster moved to masters of another kind, whose terms
        # count from elsewhere, must not be refused for good.)
        term = delivered.term
        if known is not None and term < known.term and self.checked is not None:
            self.checked.seals.distrust_grant_ends()  # (see Seals.distrust_grant_ends)
        self.capability_keys = NodeKeys(ring, term, delivered.max_skew_ms)
        log.info("capability keys", key_ids=ids, term=term, max_skew_ms=delivered.max_skew_ms)

    def _heard(self, response: pb.MountSegmentResponse | pb.HeartbeatResponse) -> None:
        """The master answered: when, and the node TTL it says (0 from an older master).

        The TTL is followed (long waits for a slow master) only where a failover cannot hide
        behind them: the master is the only one (``lone_master``), or the node can ask
        another than the master it waits for who leads (etcd, or several masters listed).
        A node of an HA cluster given one address (a Service in front of the masters)
        cannot tell a stopped leader from a slow one behind it: it keeps the 2 s waits and
        gives up at the second failure, so that it finds a new leader within seconds."""
        self._answered_at = time.monotonic()
        target = self._resolver.target
        others = bool(target.etcd) or len(set(target.masters)) > 1
        follows = response.lone_master or others
        self._node_ttl = response.node_ttl_ms / 1000.0 if follows else 0.0

    @property
    def _deadline(self) -> float:
        return call_deadline(self._node_ttl, self.heartbeat_interval)

    async def _answer_of(self, call: Any, leader: str) -> Any:
        """The answer to ``call``, a unary call under way to the master ``leader``. A call
        that waits past RPC_TIMEOUT (its deadline follows a long node TTL) is not waited out
        where another master is known to lead meanwhile (this one stopped past its etcd lease,
        its host went away): who leads is asked once a heartbeat interval (``_leader_named``),
        and when it is another master, LeaderMoved, the call cancelled: as fast as before the
        deadline followed the TTL. A node that leaves (``_hurried``) waits no longer than
        RPC_TIMEOUT: WaitedEnough. One call at a time: none is left running behind."""
        target = self._resolver.target
        # (nobody else to ask: one master, or a Service in front of them)
        others = bool(target.etcd) or any(master != leader for master in target.masters)
        waiting = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({waiting}, timeout=RPC_TIMEOUT)
            while not done:
                if self._hurried():
                    raise WaitedEnough()
                if others:
                    named = await self._leader_named(leader)
                    if named and named != leader and not waiting.done():
                        raise LeaderMoved(named)
                done, _ = await asyncio.wait({waiting}, timeout=self.heartbeat_interval)
            return waiting.result()
        finally:
            if not waiting.done():
                call.cancel()
                waiting.cancel()

    def _hurried(self) -> bool:
        """Whether the node is leaving: told to stop and not draining, or past its drain
        deadline. It waits for the master no longer than before then (a stop must not wait
        for a node TTL: a pod's grace period may be shorter)."""
        if self._draining:
            return time.monotonic() >= self._drain_deadline
        return self._stop is not None and self._stop.is_set()

    async def _leader_named(self, leader: str) -> str:
        """Who leads now, asked elsewhere than ``leader`` ("" not known): the leader etcd
        names; without etcd, the first other listed master that serves the node, or that
        names the leader in its refusal (a standby). The node's resolver is left as it is."""
        target = self._resolver.target
        if target.etcd:
            only_etcd = MasterTarget(etcd=target.etcd, cluster=target.cluster)
            return await asyncio.to_thread(lambda: LeaderResolver(only_etcd).current)
        for master in target.masters:
            if master == leader:
                continue
            try:
                async with self.credentials.aio_channel(master, GRPC_MESSAGE_OPTIONS) as channel:
                    await master_pb2_grpc.MasterStub(channel).Lane(
                        pb.LaneRequest(), timeout=RPC_TIMEOUT / 2, metadata=self._metadata
                    )
                return master  # (it serves: it leads)
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.FAILED_PRECONDITION and (
                    hint := _leader_hint(error)
                ):
                    return hint
        return ""

    def _start_drain(self, why: str) -> None:
        self._draining = True
        self._drain_deadline = time.monotonic() + self.drain_timeout
        log.info("draining", node_id=self.node_id, why=why, timeout=self.drain_timeout)

    async def _pause(self, stop: asyncio.Event) -> None:
        if self._draining:
            await asyncio.sleep(min(self.heartbeat_interval, DRAIN_POLL))
        else:
            await pause(stop, self.heartbeat_interval)

    def _heard_drain(self, response: pb.HeartbeatResponse) -> None:
        """What a heartbeat's answer says of draining: the master drains this node (an
        admin asked: start), and how much is left (none: leave)."""
        if response.draining:
            if not self._draining:
                self._start_drain("the master drains this node (kvpool drain)")
            left = (response.drain_objects_left, response.drain_bytes_left)
            if left != self._drain_left:
                log.info("drain progress", objects_left=left[0], bytes_left=left[1])
            self._drain_left = left
            self._drained = left[0] == 0
        elif self._draining:  # asked, and refused: nowhere to copy to, or no copies at all
            if not self._drained:
                log.warning(
                    "the master drains no objects off this node (it copies none between nodes, "
                    "or no other node takes them): leaving undrained"
                )
            self._drained = True

    async def _sync_with_master(self, stub: master_pb2_grpc.MasterStub, leader: str) -> str | None:
        """Mounts what is not mounted and heartbeats (``leader``: the master ``stub`` calls).
        Returns None while this master serves us; otherwise where to look for the leader (""
        when it is not known)."""
        try:
            for segment in self.segments:
                if segment.segment_id not in self.mounted:
                    descriptor = segment.descriptor(self.node_id, self.host, self._worker_address)
                    descriptor.checked_address = self.checked_address
                    descriptor.tenant = self.tenant
                    if self.mapping is not None and descriptor.HasField("shared_memory"):
                        descriptor.shared_memory.socket = self.mapping.name
                    objects = segment.stored_objects()
                    remount = segment.segment_id in self._ever_mounted
                    dropped: set[str] = set()
                    for part, (continued, more) in report_parts(objects):
                        call = stub.MountSegment(
                            pb.MountSegmentRequest(
                                segment=descriptor,
                                objects=part,
                                remount=remount,
                                silent_ms=int((time.monotonic() - self._last_contact) * 1000),
                                incarnation=self.incarnation,
                                more=more,
                                continued=continued,
                            ),
                            # (the master adopts each object of the part before it answers)
                            timeout=self._deadline + len(part) * ADOPT_ALLOWANCE,
                            metadata=self._metadata,
                        )
                        response = await self._answer_of(call, leader)
                        self._heard(response)
                        self._learn_keys(response)
                        dropped.update(response.dropped_keys)
                    self._ever_mounted.add(segment.segment_id)
                    if dropped:  # (it took them: they go, even if its log is unwritable now)
                        gone = [e for e in segment.index.entries() if e.key in dropped]
                        segment.forget(gone, durable_later=True)
                    if segment.index.unconfirmed:  # (the master kept them: they are sure now)
                        await asyncio.to_thread(segment.index.confirm)
                    self.mounted.add(segment.segment_id)
                    log.info(
                        "segment mounted",
                        segment=segment.segment_id,
                        size=segment.size,
                        objects=len(objects) - len(dropped),
                        dropped=len(dropped),
                    )
            sent_at = time.time()
            unreadable = []
            if any(s.unreadable.any() for s in self.segments):  # (a pass over an index)
                unreadable = await asyncio.to_thread(self._unreadable)
            try:
                call = stub.Heartbeat(
                    pb.HeartbeatRequest(
                        node_id=self.node_id,
                        segment_ids=[s.segment_id for s in self.segments],
                        incarnation=self.incarnation,
                        draining=self._draining,
                        unreadable=[
                            pb.UnreadableReplica(
                                segment_id=segment.segment_id,
                                key=entry.key,
                                offset=entry.offset,
                                generation=entry.generation,
                            )
                            for segment, entries in unreadable
                            for entry in entries
                        ],
                    ),
                    timeout=self._deadline,
                    metadata=self._metadata,
                )
                response = await self._answer_of(call, leader)
            except (grpc.aio.AioRpcError, LeaderMoved, WaitedEnough):
                for segment, entries in unreadable:  # (told at the next heartbeat instead)
                    segment.unreadable.give_back(entries)
                raise
            if unreadable:
                log.warning(
                    "objects the disk could not read reported to the master, which stops "
                    "listing these replicas",
                    objects=[(s.segment_id, e.key) for s, entries in unreadable for e in entries],
                )
            self._heard(response)
            self._heard_drain(response)
            self._learn_keys(response)
            self._compare_clocks(sent_at, time.time(), response.master_time_ms)
            if response.remount_segment_ids:
                log.warning("master asks to remount", segments=list(response.remount_segment_ids))
                self.mounted.difference_update(response.remount_segment_ids)
            metrics.HEARTBEATS.inc()
            self._last_contact = time.monotonic()
            for segment in self.segments:
                segment.index.write_pending()  # (removals a mount ordered, if they wait)
            if self._failures:
                log.info("master reachable again", after_failures=self._failures)
            self._failures = 0
        except WaitedEnough:  # (the node leaves: ``run`` sees it)
            metrics.HEARTBEAT_FAILURES.inc()
            metrics.MOUNTED.set(len(self.mounted))
            return None
        except LeaderMoved as moved:  # (this master may be stopped past its lease)
            metrics.HEARTBEAT_FAILURES.inc()
            metrics.MOUNTED.set(len(self.mounted))
            self._why_looking = f"{moved.leader} leads now"
            return moved.leader
        except grpc.aio.AioRpcError as error:
            metrics.HEARTBEAT_FAILURES.inc()
            metrics.MOUNTED.set(len(self.mounted))
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                hint = _leader_hint(error)  # a standby: it says who leads
                if hint:
                    self._why_looking = "a standby named the leader"
                elif (error.details() or "").startswith(NOT_THE_LEADER):
                    # a standby that names no leader: none is elected yet (etcd down, an
                    # election under way), or it cannot know. Looked for again, said as the
                    # search lets it (``_looking``): not a refusal of this node.
                    self._why_looking = "no leader elected yet"
                else:  # refused outright (another process of this node is attached)
                    self._why_looking = "this master refused the node"
                    self._failures += 1
                    if self._failures in (1, 10) or self._failures % 60 == 0:
                        log.warning(
                            "master refused", detail=error.details(), failures=self._failures
                        )
                return hint
            self._failures += 1
            if self._failures in (1, 10) or self._failures % 60 == 0:
                log.warning(
                    "cannot reach master",
                    master=self.master,
                    code=error.code().name,
                    detail=error.details(),
                    failures=self._failures,
                )
            unanswered_for = time.monotonic() - self._answered_at
            if gives_up(
                error.code(),
                self._failures,
                unanswered_for,
                self._node_ttl,
                self.heartbeat_interval,
            ):
                self._why_looking = (
                    f"master unreachable ({error.code().name}, no answer for {unanswered_for:.1f}s)"
                )
                return ""  # ask again who leads (a failover may be under way)
        metrics.MOUNTED.set(len(self.mounted))
        return None

    async def _keep_session(
        self,
        stub: master_pb2_grpc.MasterStub,
        leader: str,
        stop: asyncio.Event,
        over: asyncio.Event,
    ) -> None:
        """Keeps the command stream to this master open (reopening it after a master
        restart) and answers each command in order, until ``stop`` (the node leaves: a
        draining node keeps it, to copy) or ``over``. The stream takes the master's
        metadata lane where it has one, else gRPC."""
        lane_unreachable = False  # then this master's streams use gRPC
        while not stop.is_set() and not over.is_set():
            if not self.mounted:  # a master takes command streams only from nodes it knows
                await pause(over, MOUNT_POLL)
                continue
            hello = pb.NodeHello(node_id=self.node_id, incarnation=self.incarnation)
            port = 0 if lane_unreachable else await self._lane_port(stub)
            if port:
                try:
                    await lane_session.serve_commands(
                        host_of(leader),
                        port,
                        hello,
                        self._answer_group,
                        self._answer_now,
                        self.credentials,
                        self._executor.groups_with,
                    )
                except lane_session.SessionRefused as refused:
                    log.warning("command stream refused", detail=refused.details)
                except lp.LaneUnreachable as error:
                    log.warning("metadata lane unreachable; using gRPC", error=str(error))
                    lane_unreachable = True
                    continue
                except Exception as error:  # a broken connection, a frame that does not parse
                    log.warning("command stream broke", error=f"{type(error).__name__}: {error}")
            else:
                await self._grpc_session(stub, hello)
            await pause(over, self.heartbeat_interval)

    async def _lane_port(self, stub: master_pb2_grpc.MasterStub) -> int:
        try:
            return (
                await stub.Lane(pb.LaneRequest(), timeout=self._deadline, metadata=self._metadata)
            ).port
        except grpc.aio.AioRpcError:
            return 0  # an older master, or not the leader: the gRPC stream says which

    async def _grpc_session(self, stub: master_pb2_grpc.MasterStub, hello: pb.NodeHello) -> None:
        reports = _Reports()
        await reports.put(pb.NodeReport(hello=hello))
        call = stub.NodeSession(reports, metadata=self._metadata)
        call.add_done_callback(lambda _: reports.end())  # (a put waiting for room gives up)
        try:
            async for command in call:
                # (waits while the answers queued are at their bound: the next command is
                # not read until the master takes some)
                if not await reports.put(pb.NodeReport(result=await self._answer(command))):
                    break  # (the stream ended meanwhile: ``call`` says how, below)
        except grpc.aio.AioRpcError as error:
            if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                log.warning("command stream broke", code=error.code().name)
        finally:
            call.cancel()

    async def _answer(self, command: pb.NodeCommand) -> pb.CommandResult:
        return _logged(await self._run_command(command))

    async def _answer_group(self, commands: list[pb.NodeCommand]) -> list[pb.CommandResult]:
        """Runs commands that group (``CommandExecutor.groups_with``) as one, after the
        commands before them; one command as ``_answer`` does."""
        if len(commands) == 1:
            return [await self._answer(commands[0])]
        await self._commands_finished()
        results = await self._on_a_thread(self._executor.execute_group, commands)
        return [_logged(result) for result in results]

    def _answer_now(self, command: pb.NodeCommand) -> pb.CommandResult | None:
        """Carries out a command on the spot if it only touches memory and no earlier one
        still runs (as ``_run_command`` would, without a pass of the event loop); else None."""
        running = self._command_running
        if (running is not None and not running.done()) or not self._executor.quick(command):
            return None
        return _logged(self._executor.execute(command))

    async def _run_command(self, command: pb.NodeCommand) -> pb.CommandResult:
        """Runs one command after the one before it (even one begun on a stream that has
        since closed: its thread runs on), so that they apply in the order they were sent."""
        await self._commands_finished()
        if self._executor.quick(command):
            return self._executor.execute(command)
        return await self._on_a_thread(self._executor.execute, command)

    async def _on_a_thread(self, run: Callable[[_In], _Out], commands: _In) -> _Out:
        """``run(commands)`` on a worker thread, tracked as the command running: a cancelled
        stream leaves it running, and the next command waits for it."""
        running = asyncio.get_running_loop().run_in_executor(None, run, commands)
        self._command_running = running
        return await asyncio.shield(running)

    async def _commands_finished(self, timeout: float | None = None) -> bool:
        running = self._command_running
        if running is not None and not running.done():
            await asyncio.wait({running}, timeout=timeout)
        return running is None or running.done()

    async def _unmount_all(self, stub: master_pb2_grpc.MasterStub) -> float:
        """Unmounts every segment; returns how long readers may still need the memory."""
        drain = 0.0
        for segment in self.segments:
            if segment.segment_id not in self.mounted:
                continue
            try:
                response = await stub.UnmountSegment(
                    pb.UnmountSegmentRequest(node_id=self.node_id, segment_id=segment.segment_id),
                    timeout=RPC_TIMEOUT,
                    metadata=self._metadata,
                )
                log.info(
                    "segment unmounted",
                    segment=segment.segment_id,
                    objects_removed=response.objects_removed,
                )
                drain = max(drain, response.drain_ms / 1000.0)
            except grpc.aio.AioRpcError as error:
                log.warning(
                    "unmount failed; the master will drop the segment when its heartbeat TTL ends",
                    segment=segment.segment_id,
                    code=error.code().name,
                )
            self.mounted.discard(segment.segment_id)
        return drain

    def close(self) -> None:
        metrics.HOLDINGS.stop_watching()
        self._peers.close()
        progress_stopped = self._progress.stop()
        if self.mapping is not None:
            self.mapping.stop()
        if not progress_stopped:  # (its worker may still touch the segments' registrations)
            log.warning("UCX progress did not stop; leaving its worker to the process exit")
            return
        if self.checked is not None and not self.checked.stop():
            log.warning("a checked transfer still runs; leaving its memory to the process exit")
            return
        for segment in self.segments:
            segment.close()
        self.worker.close()
        self.context.close()


#: Answers queued for the gRPC command stream at most: past them the node reads no further
#: command until the master takes some (gRPC takes from the queue only as fast as the master
#: reads), so a master that stops reading cannot grow the node's memory without bound.
REPORTS_QUEUED = 1024


class _Reports:
    """The node's side of its command stream: reports queued for gRPC to send, at most
    ``REPORTS_QUEUED``.

    A plain async iterator rather than an async generator, so that cancelling the stream
    never has to close a generator gRPC is still iterating.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[pb.NodeReport] = asyncio.Queue(REPORTS_QUEUED)
        #: Set once the stream ended: gRPC takes nothing more from the queue then, and a put
        #: waiting for room would wait for ever.
        self._ended = asyncio.Event()

    def end(self) -> None:
        self._ended.set()

    async def put(self, report: pb.NodeReport) -> bool:
        """Queues ``report``, waiting while the queue is full; False (nothing queued) once
        the stream has ended."""
        if self._ended.is_set():
            return False
        if not self._queue.full():
            self._queue.put_nowait(report)
            return True
        putting = asyncio.ensure_future(self._queue.put(report))
        ending = asyncio.ensure_future(self._ended.wait())
        try:
            await asyncio.wait({putting, ending}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
            if not putting.done():
                putting.cancel()
        return putting.done() and not putting.cancelled()

    def __aiter__(self) -> _Reports:
        return self

    async def __anext__(self) -> pb.NodeReport:
        return await self._queue.get()


class LeaderSearch:
    """What a node says while it looks for the leading master (none elected: etcd down, the
    masters down, an election under way): a warning as the search begins and whenever a
    standby names a leader other than the one named last, else one line every ``interval``
    seconds, with the looks since the last line; the search ends once a master serves the
    node. The clock is injected (tests)."""

    def __init__(
        self, interval: float = SEARCH_LOG_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._clock = clock
        #: Looks since the search began (0: the node is not looking).
        self.looks = 0
        self._unsaid = 0
        self._said_at = 0.0
        #: The leader a standby named last in this search ("" none yet).
        self._named = ""

    def look(self, hint: str) -> int | None:
        """One more look; ``hint``: the leader a standby named ("" none). None: say nothing;
        else say it, with the count of looks not said since the last line."""
        now = self._clock()
        self.looks += 1
        named = bool(hint) and hint != self._named
        if hint:
            self._named = hint
        if self.looks == 1 or named or now - self._said_at >= self.interval:
            unsaid, self._unsaid, self._said_at = self._unsaid, 0, now
            return unsaid
        self._unsaid += 1
        return None

    def found(self) -> int:
        """A master serves the node: the search (if any) ends. How many looks it took (0:
        the node was not looking)."""
        looks, self.looks, self._unsaid, self._named = self.looks, 0, 0, ""
        return looks


def _leader_hint(error: grpc.aio.AioRpcError) -> str:
    for key, value in error.trailing_metadata() or ():
        if key == LEADER_METADATA:
            return value
    return ""


#: Failed commands and refused keys are logged at most 10 lines a minute (the rest counted
#: in the next line): a restart can bring a burst of stale Forgets, and keys are delivered
#: with every heartbeat.
NODE_LOGS = LogThrottle(burst=10, interval=60.0)


def _logged(result: pb.CommandResult) -> pb.CommandResult:
    """A command's answer, its failure logged here (the master logs it too)."""
    if not result.ok and (suppressed := NODE_LOGS.allow("command failed")) is not None:
        log.warning("command failed", error=result.error, suppressed=suppressed)
    return result
