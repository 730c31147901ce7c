"""The master's calls, independent of the transport that carries them.

Each handler checks the request's shape, runs one event of the core through the driver and
builds the protobuf answer from the core's plain data. It returns the answer, or a
``Pending`` when the core answers later (a PutEnd waiting for its nodes), or raises
``CallRefused`` with a status. gRPC (service.py) and the metadata lane (lane_server.py) are
thin adapters over these, in the way h11's ``Connection`` is driven by any I/O library: both
doors give the same answers; only the envelope differs. Whole-call problems are statuses;
per-key outcomes are KeyStatus values.
"""

from __future__ import annotations

import collections
import functools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum
from typing import Any, TypeVar

import grpc

from kvpool.common.keys import STORED_KEY_BYTES, key_problem, plainly_valid
from kvpool.common.status import KeyStatus, Pin, Tier
from kvpool.master import metrics
from kvpool.master.access import authorize, client_scope, key_prefix, own_node, own_segment
from kvpool.master.capability_keys import MasterKeys
from kvpool.master.commands_pb import segment_to_pb, stored_from_pb
from kvpool.master.core import TERM_ENDED, MasterCore
from kvpool.master.driver import CallRefused, CoreDriver, Pending, check_incarnation
from kvpool.master.quotas import InflightLimiter
from kvpool.master.records import (
    ClusterSnapshot,
    Commit,
    CopyCommand,
    DrainProgress,
    ExplainedStatuses,
    Location,
    PlacedReplica,
    PrefixRemoval,
    PutOptions,
    PutSlot,
    SegmentInfo,
    UnreadableReplica,
    make,
)
from kvpool.master.state import MAX_UNREADABLE_REPORTS
from kvpool.master.story_rpc import story_response
from kvpool.proto import master_pb2 as pb
from kvpool.security import capabilities as caps
from kvpool.security import mapping_grants
from kvpool.security.identity import Identity, Role, tenant_of, tenant_problem
from kvpool.security.mapping_grants import SameHostPolicy
from kvpool.transport.worker_address import MalformedWorkerAddress, check_worker_address

#: Keys one call may carry (see lane_protocol.MAX_BATCH_KEYS: larger batches are split by
#: the client).
MAX_BATCH = 4096
#: Largest object and segment a request may name: far beyond any machine, yet small enough
#: that no offset arithmetic on them overflows what the wire carries.
MAX_OBJECT_SIZE = 1 << 48
MAX_SEGMENT_SIZE = 1 << 52
#: Longest checked-stream address a node may announce (HOST:PORT).
MAX_ADDRESS = 300
#: The longest host name a segment may give (a DNS name holds at most 253 characters).
MAX_HOST = 255
#: The most bytes of a segment's packed UCX remote key (a few hundred bytes; its worker
#: address has its own check, ``check_worker_address``).
MAX_RKEY = 64 << 10
#: The most bytes of a segment's shared-memory description (its file, socket and boot id).
MAX_SHARED_MEMORY = 4096
#: Segments a client may say it maps, in one call, and the longest id it may name.
MAX_MAPPED_SEGMENTS = 1024
MAX_SEGMENT_ID = 1024

E = TypeVar("E", bound=IntEnum)

#: The calls every transport carries, by name (NodeSession, a stream, is each adapter's own).
UNARY_METHODS = (
    "MountSegment",
    "UnmountSegment",
    "Heartbeat",
    "PutStart",
    "PutEnd",
    "PutRevoke",
    "GetReplicas",
    "Exists",
    "ReleaseLeases",
    "Remove",
    "RemovePrefix",
    "Stat",
    "ClientHeartbeat",
    "ListKeys",
    "ClusterStatus",
    "Lane",
    "Story",
    "Drain",
)

_STARTED = time.monotonic()


#: Calls a tenant's ``inflight`` quota does not hold back: they hold nothing and give back.
#: A tenant at that quota (its PutEnds waiting on a slow node) would otherwise have its
#: clients' heartbeats refused, the clients declared dead and their reservations revoked,
#: and could not give back leases or reservations to lower what it holds.
NOT_HELD_TO_INFLIGHT = frozenset({"ClientHeartbeat", "ReleaseLeases", "PutRevoke"})


class MasterHandlers:
    def __init__(self, driver: CoreDriver) -> None:
        self.driver = driver
        #: Where the cluster's storage nodes are listed (etcd in HA mode; else nowhere).
        self.registry: Any = None
        #: Where the metadata lane listens (0: no lane); clients ask through ``Lane``.
        self.lane_port = 0
        self._segment_pbs: dict[str, tuple[SegmentInfo, pb.Segment]] = {}
        #: The same, without the means to map it (for clients that may not).
        self._unmappable_pbs: dict[str, tuple[SegmentInfo, pb.Segment]] = {}
        #: (segment id, tenant) -> (info, signing key id, grant expiry ms, segment with grant).
        self._granted_pbs: dict[tuple[str, str], tuple[SegmentInfo, int | None, int, pb.Segment]]
        self._granted_pbs = {}
        #: Which clients may map nodes' memory on their host.
        self.same_host = SameHostPolicy()
        #: node id -> (when, its drain progress then) for heartbeats' answers.
        self._drain_progresses: dict[str, tuple[float, DrainProgress | None]] = {}
        #: The second Story calls are counted in (monotonic).
        self._story_window = 0.0
        #: What each tenant's Story calls took of this second (as many entries as tenants
        #: called in it: tenants are the credential store's); their sum is all callers'.
        self._story_spent_by: dict[str, float] = {}
        #: Each tenant's calls not yet answered, held to its ``inflight`` quota.
        self.inflight = InflightLimiter()
        #: The keys this master signs capabilities with (None: it grants none).
        self.capability_keys: MasterKeys | None = None
        #: The master's wall clock (ms since the epoch): capabilities expire on it.
        self.wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)
        #: segment id -> the latest expiry (wall ms, clock allowance included) of the
        #: capabilities granted for its space: with ``MasterState.capabilities_until`` (on
        #: the monotonic clock), what a Forget says, so that a step of the wall clock back
        #: between a grant and the Forget cannot shorten the node's seal. One per segment.
        self._grants_wall_end: dict[str, int] = {}

    def call(self, method: str, request: Any, identity: Identity) -> Any:
        """Runs handler ``method`` for ``identity`` once its role may make the call,
        counting and timing it (the part that runs now). A client's call beyond its tenant's
        quota of calls in flight is refused (RESOURCE_EXHAUSTED, "quota exceeded: ..."),
        but for those of ``NOT_HELD_TO_INFLIGHT``."""
        started = time.perf_counter()
        tenant = ""
        try:
            authorize(identity, method)
            core = self.driver.core
            quotas = core.state.quotas if core is not None else None
            if (
                quotas is not None
                and identity.tenant
                and identity.role is not Role.NODE
                and method not in NOT_HELD_TO_INFLIGHT
            ):
                limit = quotas.of(identity.tenant).inflight
                if limit is not None:
                    refused = self.inflight.enter(identity.tenant, limit)
                    if refused is not None:
                        raise CallRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
                    tenant = identity.tenant
            reply = getattr(self, method)(request, identity)
            if tenant and isinstance(reply, Pending):
                reply.when_settled(functools.partial(self.inflight.leave, tenant))
                tenant = ""  # (counted out when it is answered)
            return reply
        finally:
            if tenant:
                self.inflight.leave(tenant)
            metrics.labelled(metrics.REQUESTS, method).inc()
            metrics.labelled(metrics.LATENCY, method).observe(time.perf_counter() - started)

    @property
    def core(self) -> MasterCore:
        core = self.driver.core
        if core is None:
            raise CallRefused(grpc.StatusCode.UNAVAILABLE, "this master is not serving: retry")
        return core

    # ---- node side

    def MountSegment(self, request: pb.MountSegmentRequest, identity: Identity) -> Any:
        s = request.segment
        if not s.segment_id or not s.node_id or not s.worker_address or not s.size:
            raise CallRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "MountSegment needs segment_id, node_id, worker_address and size",
            )
        own_node(identity, s.node_id, "mount segments")
        own_segment(identity, s.segment_id)
        try:
            check_worker_address(s.worker_address)
        except MalformedWorkerAddress as error:
            raise CallRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"segment.worker_address {error}: send the address ucp_worker_get_address "
                "gave the node's worker, unchanged",
            ) from None
        refusal = self.driver.process_refusal(s.node_id, request.incarnation)
        if refusal is not None:
            raise CallRefused(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        tier = _enum(Tier, s.tier, "segment.tier") if s.tier else Tier.DRAM
        if tier is Tier.UNSPECIFIED:
            tier = Tier.DRAM
        for name, value in (("segment_id", s.segment_id), ("node_id", s.node_id)):
            problem = key_problem(value)
            if problem is not None:
                raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {problem}")
        if s.size > MAX_SEGMENT_SIZE:
            raise CallRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a segment holds at most {MAX_SEGMENT_SIZE} bytes, got {s.size}",
            )
        if s.base_address + s.size > caps.MAX_U64 + 1:
            # (every replica's address is the base plus its offset, sent in uint64 fields)
            raise CallRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"segment.base_address {s.base_address:#x} plus its size {s.size} passes "
                "2**64: send the address the segment is mapped at in the node",
            )
        if s.tenant and (problem := tenant_problem(s.tenant)) is not None:
            raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT, f"segment.tenant: {problem}")
        # (sent with every replica of the segment in answers to clients: a node may not make
        # those answers as large as it likes)
        shared = s.shared_memory.ByteSize() if s.HasField("shared_memory") else 0
        for name, size, most in (
            ("host", len(s.host), MAX_HOST),
            ("rkey", len(s.rkey), MAX_RKEY),
            ("shared_memory", shared, MAX_SHARED_MEMORY),
            ("checked_address", len(s.checked_address), MAX_ADDRESS),
        ):
            if size > most:
                raise CallRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"segment.{name} holds at most {most} bytes, got {size}",
                )
        _check_batch(request.objects)
        info = SegmentInfo(
            segment_id=s.segment_id,
            node_id=s.node_id,
            host=s.host,
            worker_address=s.worker_address,
            base_address=s.base_address,
            size=s.size,
            rkey=s.rkey,
            tier=tier,
            persistent=s.persistent,
            shared_memory=(
                s.shared_memory.SerializeToString() if s.HasField("shared_memory") else b""
            ),
            checked_address=s.checked_address,
            tenant=s.tenant,
            space_reserved=s.space_reserved,
            incarnation=request.incarnation,
        )
        stored = [stored_from_pb(o) for o in request.objects]
        core = self.core
        problem = core.state.mount_problem(info)
        if problem is not None:
            raise CallRefused(grpc.StatusCode.FAILED_PRECONDITION, problem)
        if self.registry is not None:
            self.registry.node_seen(info.node_id)

        def answer(dropped: list[str] | None) -> pb.MountSegmentResponse:
            if dropped is None:
                raise CallRefused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"segment {s.segment_id!r} is not mounted as this part of its report "
                    "says: report it again from its first part (continued unset)",
                )
            response = pb.MountSegmentResponse(
                dropped_keys=dropped,
                node_ttl_ms=min(int(core.state.config.node_ttl * 1000), 2**32 - 1),
                lone_master=self.registry is None,
            )
            self._deliver_keys(response, info.node_id)
            return response

        if request.continued:
            return self.driver.call(
                lambda call_id: core.report_more(call_id, info, stored, request.more), answer
            )
        return self.driver.call(
            lambda call_id: core.mount_segment(
                call_id, info, stored, request.remount, request.silent_ms / 1000.0, request.more
            ),
            answer,
        )

    def UnmountSegment(self, request: pb.UnmountSegmentRequest, identity: Identity) -> Any:
        own_node(identity, request.node_id, "unmount segments")
        core = self.core

        def answer(result: tuple[int, float]) -> pb.UnmountSegmentResponse:
            lost, drain = result
            if self.registry is not None and request.node_id not in core.state.nodes:
                lost = core.state.left_with_losses.get(request.node_id, 0)
                self.registry.node_gone(request.node_id, lost)  # (its last: it left, away now)
            return pb.UnmountSegmentResponse(objects_removed=lost, drain_ms=int(drain * 1000))

        return self.driver.call(
            lambda call_id: core.unmount_segment(call_id, request.node_id, request.segment_id),
            answer,
        )

    def Heartbeat(self, request: pb.HeartbeatRequest, identity: Identity) -> Any:
        own_node(identity, request.node_id, "heartbeat")
        _check_node_id(request.node_id)  # (kept: an insecure caller may name any)
        check_incarnation(request.incarnation)
        core = self.core
        self.driver.processes.heard(request.node_id, request.incarnation, core.clock())
        node_id = request.node_id
        if request.draining and core.state.config.rereplication_rate:
            self.driver.call(lambda call_id: core.drain(call_id, node_id), lambda _: None)

        def answer(remount: list[str]) -> pb.HeartbeatResponse:
            response = pb.HeartbeatResponse(
                remount_segment_ids=remount,
                master_time_ms=int(time.time() * 1000),
                node_ttl_ms=min(int(core.state.config.node_ttl * 1000), 2**32 - 1),
                lone_master=self.registry is None,
            )
            progress = self._drain_progress(node_id) if core.state.draining_nodes else None
            if progress is not None and progress.draining:
                response.draining = True
                response.drain_objects_left = progress.objects_left
                response.drain_bytes_left = progress.bytes_left
            self._deliver_keys(response, node_id)
            return response

        unreadable = _unreadable(request.unreadable)
        # (a process another one of the node has replaced, resumed from a pause, names no
        # segment of the node gone: what it lacks, the live process may have)
        replaced = self.driver.process_refusal(node_id, request.incarnation) is not None
        incarnation = "" if replaced else request.incarnation
        return self.driver.call(
            lambda call_id: core.heartbeat(
                call_id, node_id, request.segment_ids, incarnation, unreadable
            ),
            answer,
        )

    def Drain(self, request: pb.DrainRequest, identity: Identity) -> Any:
        core = self.core
        node_id = request.node_id
        _check_node_id(node_id)
        if not core.state.config.rereplication_rate:
            raise CallRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this master copies no objects between nodes (--rereplication-rate 0): a "
                "drain could copy nothing away. Restart it with a rate, or stop the node "
                "(its objects go with it)",
            )

        def answer(progress: DrainProgress | None) -> pb.DrainResponse:
            lost = core.state.left_with_losses.get(node_id)
            if progress is None and lost:
                raise CallRefused(
                    grpc.StatusCode.DATA_LOSS,
                    f"storage node {node_id!r} left its drain with {lost} object(s) not copied "
                    "away (its --drain-timeout passed: did the other nodes have room?); those "
                    "it alone held are lost",
                )
            if progress is None:
                raise CallRefused(
                    grpc.StatusCode.NOT_FOUND,
                    f"no storage node {node_id!r} has a segment mounted here: `kvpool status` "
                    "lists the nodes",
                )
            if not progress.draining:
                raise CallRefused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"no other storage node takes objects (the others are draining, or there "
                    f"are none): draining {node_id!r} could copy nothing away. Start another "
                    "node first, or stop this one (its objects go with it)",
                )
            return pb.DrainResponse(
                objects_left=progress.objects_left,
                bytes_left=progress.bytes_left,
                live_nodes=progress.live_nodes,
            )

        return self.driver.call(lambda call_id: core.drain(call_id, node_id), answer)

    # ---- client side

    def PutStart(self, request: pb.PutStartRequest, identity: Identity) -> Any:
        keys = list(request.keys)  # (protobuf builds a str per key per pass: one pass)
        _check_batch(keys, sizes=request.sizes)
        mapped = _mapped_segments(request)
        _check_keys(keys)  # (as the client wrote them: the tenant's prefix comes next)
        keys = _scoped(keys, key_prefix(identity))
        client_id = client_scope(identity, request.client_id)
        if request.sizes and max(request.sizes) > MAX_OBJECT_SIZE:
            raise CallRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"an object holds at most {MAX_OBJECT_SIZE} bytes, got {max(request.sizes)}",
            )
        options = PutOptions(
            replicas=request.replicas,
            preferred_hosts=tuple(request.preferred_hosts),
            pin=_enum(Pin, request.pin, "pin"),
            pin_ttl=request.pin_ttl_ms / 1000.0,
            tier=_enum(Tier, request.tier, "tier"),
            avoid_nodes=frozenset(request.avoid_nodes),
            self_written=mapped,
        )
        core = self.core
        # (at least 1: 0 on the wire means "no window said", and the client falls back)
        write_timeout_ms = max(1, int(core.state.config.write_timeout * 1000))

        prepared: list[Granter | None] = []

        def prepare(slots: list[PutSlot] | object) -> None:
            if isinstance(slots, list):
                answered = (slot.replicas for slot in slots)
                rights = caps.Rights.WRITE
                prepared.append(self._granter(rights, write_timeout_ms, identity, answered, mapped))

        def answer(slots: list[PutSlot] | object) -> pb.PutStartResponse:
            _unless_term_ended(slots)
            assert isinstance(slots, list)
            response = pb.PutStartResponse(write_timeout_ms=write_timeout_ms)
            segments: dict[str, pb.Segment] = {}
            grant = prepared[0] if prepared else None
            for slot, size in zip(slots, request.sizes, strict=True):
                out = response.slots.add(status=slot.status, put_id=slot.put_id)
                if slot.message:
                    out.message = slot.message
                self._add_replicas(
                    out.replicas,
                    slot.replicas,
                    segments,
                    identity,
                    grant,
                    size,
                    slot.put_id,
                    mapped,
                )
            response.segments.extend(segments.values())
            _count("PutStart", [slot.status for slot in slots])
            return response

        return self.driver.call(
            lambda call_id: core.put_start(call_id, client_id, keys, request.sizes, options),
            answer,
            prepare,
        )

    def PutEnd(self, request: pb.PutEndRequest, identity: Identity) -> Any:
        _check_batch(request.commits)
        prefix = key_prefix(identity)
        commits = [
            make(
                Commit,
                (
                    prefix + c.key,
                    c.put_id,
                    tuple(c.replica_ok),
                    c.crc32c if c.HasField("crc32c") else None,
                ),
            )
            for c in request.commits
        ]
        core = self.core
        statuses = _statuses("PutEnd", pb.PutEndResponse)

        def answer(result: list[KeyStatus]) -> pb.PutEndResponse:
            response: pb.PutEndResponse = statuses(result)
            if isinstance(result, ExplainedStatuses):
                why = result.messages
                response.messages.extend([why.get(i, "") for i in range(len(result))])
            return response

        return self.driver.call(lambda call_id: core.put_end(call_id, commits), answer)

    def PutRevoke(self, request: pb.PutRevokeRequest, identity: Identity) -> Any:
        keys = list(request.keys)
        _check_batch(keys, sizes=request.put_ids)
        _check_keys(keys)
        keys = _scoped(keys, key_prefix(identity))
        core = self.core
        return self.driver.call(
            lambda call_id: core.put_revoke(call_id, keys, request.put_ids),
            _statuses("PutRevoke", pb.PutRevokeResponse),
        )

    def GetReplicas(self, request: pb.GetReplicasRequest, identity: Identity) -> Any:
        keys = _keys(request, identity)
        client_id = client_scope(identity, request.client_id)
        mapped = _mapped_segments(request)
        core = self.core

        prepared: list[Granter | None] = []

        def prepare(result: tuple[list[Location], float]) -> None:
            locations, ttl = result
            answered = (location.replicas for location in locations)
            ttl_ms = int(ttl * 1000)
            prepared.append(self._granter(caps.Rights.READ, ttl_ms, identity, answered, mapped))

        def answer(result: tuple[list[Location], float]) -> pb.GetReplicasResponse:
            locations, ttl = result
            response = pb.GetReplicasResponse(lease_ms=int(ttl * 1000))
            segments: dict[str, pb.Segment] = {}
            grant = prepared[0] if prepared else None
            for location in locations:
                out = response.objects.add(status=location.status, size=location.size)
                if location.crc32c is not None:
                    out.crc32c = location.crc32c
                self._add_replicas(
                    out.replicas,
                    location.replicas,
                    segments,
                    identity,
                    grant,
                    location.size,
                    location.generation,
                    mapped,
                )
            response.segments.extend(segments.values())
            statuses = [loc.status for loc in locations]
            _count("GetReplicas", statuses)
            if core.state.quotas is not None and KeyStatus.QUOTA_EXCEEDED in statuses:
                refused = keys[statuses.index(KeyStatus.QUOTA_EXCEEDED)]
                response.quota_refusal = core.state.lease_refusal(tenant_of(refused))
            return response

        return self.driver.call(
            lambda call_id: core.get_replicas(call_id, keys, request.lease_ms / 1000.0, client_id),
            answer,
            prepare,
        )

    def Exists(self, request: pb.ExistsRequest, identity: Identity) -> Any:
        # (a tenant's keys looked up as they came, in its own table: no key rebuilt; a
        # caller without a tenant names the master's keys themselves)
        tenant = identity.tenant or None
        keys = _checked_keys(request)
        client_id = client_scope(identity, request.client_id)
        core = self.core
        counted = _statuses("Exists", pb.ExistsResponse)

        def answer(statuses: list[KeyStatus]) -> pb.ExistsResponse:
            response: pb.ExistsResponse = counted(statuses)
            if core.state.quotas is not None and KeyStatus.QUOTA_EXCEEDED in statuses:
                refused = keys[statuses.index(KeyStatus.QUOTA_EXCEEDED)]
                owner = tenant if tenant is not None else tenant_of(refused)
                response.quota_refusal = core.state.lease_refusal(owner)
            return response

        return self.driver.call(
            lambda call_id: core.exists(
                call_id,
                keys,
                request.lease_ms / 1000.0,
                not request.no_lease,
                client_id,
                tenant,
            ),
            answer,
        )

    def ReleaseLeases(self, request: pb.ReleaseLeasesRequest, identity: Identity) -> Any:
        keys = _keys(request, identity)
        client_id = client_scope(identity, request.client_id)
        core = self.core
        return self.driver.call(
            lambda call_id: core.release_leases(call_id, client_id, keys),
            lambda released: pb.ReleaseLeasesResponse(released=released),
        )

    def Remove(self, request: pb.RemoveRequest, identity: Identity) -> Any:
        keys = _keys(request, identity)
        core = self.core
        answer = _statuses("Remove", pb.RemoveResponse)
        return self.driver.call(lambda call_id: core.remove(call_id, keys, request.force), answer)

    def RemovePrefix(self, request: pb.RemovePrefixRequest, identity: Identity) -> Any:
        scope = key_prefix(identity)
        prefix = scope + request.prefix
        start_after = scope + request.start_after if request.start_after else ""
        core = self.core
        cut = len(scope)

        def answer(result: PrefixRemoval) -> pb.RemovePrefixResponse:
            _unless_term_ended(result)
            return pb.RemovePrefixResponse(
                removed=result.removed,
                leased=result.leased,
                not_ready=result.not_ready,
                next_start_after=result.next_start_after[cut:],
            )

        return self.driver.call(
            lambda call_id: core.remove_prefix(call_id, prefix, request.force, start_after),
            answer,
        )

    def ClientHeartbeat(self, request: pb.ClientHeartbeatRequest, identity: Identity) -> Any:
        client_id = client_scope(identity, request.client_id)
        core = self.core
        return self.driver.call(
            lambda call_id: core.client_heartbeat(call_id, client_id),
            lambda _: pb.ClientHeartbeatResponse(),
        )

    # ---- reads of the state that change nothing

    def Stat(self, request: pb.StatRequest, identity: Identity) -> pb.StatResponse:
        info = self.core.state.stat(key_prefix(identity) + request.key)
        response = pb.StatResponse(
            status=_wire(info.status),
            size=info.size,
            state=info.state,
            lease_remaining_ms=int(info.lease_remaining * 1000),
            pin=_wire(info.pin),
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

    def ListKeys(self, request: pb.ListKeysRequest, identity: Identity) -> pb.ListKeysResponse:
        scope = key_prefix(identity)
        start_after = scope + request.start_after if request.start_after else ""
        page = self.core.state.list_keys(scope + request.prefix, request.limit, start_after)
        cut = len(scope)
        return pb.ListKeysResponse(
            keys=[key[cut:] for key in page.keys] if cut else page.keys,
            sizes=page.sizes,
            next_start_after=page.next_start_after[cut:],
        )

    def ClusterStatus(
        self, request: pb.ClusterStatusRequest, identity: Identity
    ) -> pb.ClusterStatusResponse:
        state = self.core.state
        snapshot = state.snapshot()
        refused = self.core.client_refusal() or ""
        if identity.role is not Role.ADMIN and not identity.insecure:
            objects = state.published_count(key_prefix(identity))
            response = _totals(snapshot, objects, identity.tenant)
            response.clients_refused = refused
            return response
        response = pb.ClusterStatusResponse(
            objects=snapshot.objects,
            reservations=snapshot.reservations,
            nodes=snapshot.nodes,
            uptime_s=time.monotonic() - _STARTED,
            clients_refused=refused,
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

    def Lane(self, request: pb.LaneRequest, identity: Identity) -> pb.LaneResponse:
        return pb.LaneResponse(port=self.lane_port)

    def Story(self, request: pb.StoryRequest, identity: Identity) -> pb.StoryResponse:
        # (a story scans the whole event ring on the event loop: every caller's Story calls
        # together get STORY_BUDGET of each second, so that none can stall the others', and
        # each tenant's STORY_SHARE of it, so that one tenant's cannot refuse everyone's)
        now = time.monotonic()
        if now - self._story_window >= 1.0:
            self._story_window = now
            self._story_spent_by.clear()
        tenant = identity.tenant
        spent_by = self._story_spent_by
        if (
            sum(spent_by.values()) >= STORY_BUDGET
            or spent_by.get(tenant, 0.0) >= STORY_BUDGET * STORY_SHARE
        ):
            raise CallRefused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Story calls may take {STORY_BUDGET:.0%} of the master's time, each tenant's "
                f"{STORY_SHARE:.0%} of that, and have this second: retry in a second",
            )
        started = time.perf_counter()
        try:
            return story_response(self.core.state, key_prefix(identity) + request.key)
        finally:
            spent_by[tenant] = spent_by.get(tenant, 0.0) + time.perf_counter() - started

    # ---- helpers

    def _add_replicas(
        self,
        out: Any,
        replicas: Iterable[PlacedReplica],
        segments: dict[str, pb.Segment],
        identity: Identity,
        grant: Callable[[PlacedReplica, int, int], bytes] | None = None,
        size: int = 0,
        grant_id: int = 0,
        mapped: frozenset[str] = frozenset(),
    ) -> None:
        """Each replica (and its segment's descriptor, once per response), with a capability
        from ``grant`` for the node's checked stream, but in the ``mapped`` segments, which
        the client reaches through its own mapping."""
        for replica in replicas:
            segment_id = replica.segment.segment_id
            if (
                grant is not None
                and size
                and replica.segment.checked_address
                and segment_id not in mapped
            ):
                capability = grant(replica, size, grant_id)
                out.add(segment_id=segment_id, address=replica.address, capability=capability)
            else:
                out.add(segment_id=segment_id, address=replica.address)
            if segment_id not in segments:
                segments[segment_id] = self._segment_for(replica.segment, identity)

    def _granter(
        self,
        rights: caps.Rights,
        ttl_ms: int,
        identity: Identity,
        answered: Iterable[Iterable[PlacedReplica]],
        mapped: frozenset[str],
    ) -> Granter | None:
        """What grants capabilities for replicas' exact ranges, for ``identity``'s tenant,
        ending ``ttl_ms`` from now on this master's wall clock (the write timeout for writes,
        the lease for reads), with the grants each of the ``answered`` replica lists will get
        noted (``Granter.note``); None when this master grants none."""
        keys = self.capability_keys
        if keys is None:
            return None
        granter = Granter(
            keys,
            rights,
            identity.tenant,
            self.core.state,
            self.wall_ms(),
            ttl_ms,
            self._grants_wall_end,
        )
        for replicas in answered:
            granter.note(replicas, mapped)
        return granter

    def grants_end_ms(self, segment_id: str) -> tuple[int, int]:
        """``MasterState.grants_end`` on this master's wall clock, as capabilities name
        their expiry, and the term they name: what a Forget tells its node."""
        state = self.core.state
        left = state.grants_end(segment_id) - state.clock()
        now_ms = self.wall_ms()
        converted = now_ms + max(0, math.ceil(left * 1000))
        on_the_wall = self._grants_wall_end.get(segment_id, 0)
        if on_the_wall and on_the_wall < now_ms:  # (past: kept no longer)
            del self._grants_wall_end[segment_id]
        return max(converted, on_the_wall), state.epoch

    def grant_copy(self, command: CopyCommand) -> bytes:
        """The READ capability a node copying an object from another node's checked stream
        shows it: exactly the source's range, for the object's generation (a Forget of it
        seals it), until the master stops waiting for the copy (plus the nodes' clock
        allowance). Only nodes get these: in their command stream."""
        keys = self.capability_keys
        assert keys is not None  # (the driver asks only where there are keys)
        source = command.source_segment
        assert source is not None  # (asked only for copies from another node)
        ttl_ms = int(self.core.command_timeout * 1000)
        granter = Granter(
            keys,
            caps.Rights.READ,
            COPY_TENANT,
            self.core.state,
            self.wall_ms(),
            ttl_ms,
            self._grants_wall_end,
        )
        granter.note_segment(command.source_segment_id)  # (as it goes out: a Forget after)
        return keys.for_node(source.node_id).grant(
            segment_id=command.source_segment_id,
            offset=command.source.offset,
            length=max(command.source.size, 1),
            rights=caps.Rights.READ,
            expiry_ms=granter.expiry_ms,
            term=granter.term,
            tenant=COPY_TENANT,
            grant_id=command.source.generation,
        )

    def _deliver_keys(
        self, response: pb.MountSegmentResponse | pb.HeartbeatResponse, node_id: str
    ) -> None:
        """Puts ``node_id``'s capability keys in its answer (the node's authenticated
        session): its own, which sign for its segments and no other node's."""
        keys = self.capability_keys
        if keys is not None:
            response.capability_keys.CopyFrom(keys.delivery(self.core.state.epoch, node_id))

    def _segment_for(self, info: SegmentInfo, identity: Identity) -> pb.Segment:
        """The segment as ``identity`` may see it: with the means to map it (and, on a
        secure cluster, the grant the node's mapping socket asks for) only where
        security/mapping_grants.py allows; else without them."""
        if not info.shared_memory:
            return self._segment_pb(info)
        if not self.same_host.allows(identity, info.tenant):
            return self._unmappable_pb(info)
        if identity.insecure:
            return self._segment_pb(info)  # (no grants: the node's user opens /proc)
        keys = self.capability_keys
        if keys is None:
            return self._unmappable_pb(info)
        return self._granted_pb(info, identity.tenant, keys)

    def _granted_pb(self, info: SegmentInfo, tenant: str, keys: MasterKeys) -> pb.Segment:
        """The segment with a map grant for ``tenant``, made again when less than half its
        life is left or the signing key changed (one per segment and tenant, not per call)."""
        cache_key = (info.segment_id, tenant)
        now_ms, key_id = self.wall_ms(), keys.ring.current
        cached = self._granted_pbs.get(cache_key)
        if (
            cached is not None
            and cached[0] is info
            and cached[1] == key_id
            and cached[2] - now_ms > mapping_grants.GRANT_TTL_MS // 2
        ):
            return cached[3]
        message = pb.Segment()
        message.CopyFrom(self._segment_pb(info))
        expiry_ms = now_ms + mapping_grants.GRANT_TTL_MS
        message.map_capability = mapping_grants.grant(
            keys.for_node(info.node_id),
            segment_id=info.segment_id,
            size=info.size,
            tenant=tenant,
            term=self.core.state.epoch,
            expiry_ms=expiry_ms,
        )
        if len(self._granted_pbs) >= MAX_CACHED_GRANTS:
            self._granted_pbs.clear()  # (segments that went, tenants no longer mapping)
        self._granted_pbs[cache_key] = (info, key_id, expiry_ms, message)
        return message

    def _unmappable_pb(self, info: SegmentInfo) -> pb.Segment:
        cached = self._unmappable_pbs.get(info.segment_id)
        if cached is None or cached[0] is not info:
            message = pb.Segment()
            message.CopyFrom(self._segment_pb(info))
            message.ClearField("shared_memory")
            self._make_room(self._unmappable_pbs)
            cached = self._unmappable_pbs[info.segment_id] = (info, message)
        return cached[1]

    def _segment_pb(self, info: SegmentInfo) -> pb.Segment:
        cached = self._segment_pbs.get(info.segment_id)
        if cached is None or cached[0] is not info:
            self._make_room(self._segment_pbs)
            cached = self._segment_pbs[info.segment_id] = (info, segment_to_pb(info))
        return cached[1]

    def _drain_progress(self, node_id: str) -> DrainProgress | None:
        """A draining node's progress for its heartbeat's answer, worked out at most every
        DRAIN_PROGRESS_EVERY seconds (it reads every object of the node, on the event loop,
        and a node heartbeats every second or more often)."""
        node = self.core.state.nodes.get(node_id)
        if node is None or not node.draining:  # (cheap, and never a stale "draining")
            # (nor a stale "not draining": reused after the node began, its answer would
            # say the drain was refused, and the node would leave with its objects)
            self._drain_progresses.pop(node_id, None)
            return self.core.state.drain_progress(node_id)
        now = time.monotonic()
        cached = self._drain_progresses.get(node_id)
        if cached is not None and now - cached[0] < DRAIN_PROGRESS_EVERY:
            return cached[1]
        progress = self.core.state.drain_progress(node_id)
        if len(self._drain_progresses) >= MAX_CACHED_SEGMENTS:
            self._drain_progresses.clear()
        self._drain_progresses[node_id] = (now, progress)
        return progress

    def _make_room(self, cache: dict[str, Any]) -> None:
        """Drops the messages of segments no longer mounted once ``cache`` is full (a node's
        DRAM segment has a new id at each start: the old ones would stay for good)."""
        if len(cache) >= MAX_CACHED_SEGMENTS:
            mounted = self.core.state.segments
            for segment_id in [s for s in cache if s not in mounted]:
                del cache[segment_id]


#: Segment messages with map grants kept at most (one per mapped segment and tenant).
MAX_CACHED_GRANTS = 4096
#: Seconds a draining node's progress is reused for its heartbeats' answers.
DRAIN_PROGRESS_EVERY = 2.0
#: The share of each second that Story calls may take on the master's event loop.
STORY_BUDGET = 0.1
#: The most of STORY_BUDGET one tenant's Story calls take (admins are one tenant, "").
STORY_SHARE = 0.25
#: Segment messages kept per kind before those of segments gone are dropped.
MAX_CACHED_SEGMENTS = 1024

#: The tenant a copy's capability names (no tenant's: a node reads for the master; the colon
#: is in no tenant name).
COPY_TENANT = "kvpool:node-copy"

#: The ``status`` label of each KeyStatus value.
_STATUS_LABELS = {status.value: status.name.lower() for status in KeyStatus}


def _unreadable(reported: Sequence[pb.UnreadableReplica]) -> list[UnreadableReplica]:
    """A heartbeat's unreadable replicas, the first MAX_UNREADABLE_REPORTS, those well
    formed (a node's word is input; one malformed entry must not refuse the heartbeat, which
    the node would send again and again until the master declared it dead)."""
    return [
        UnreadableReplica(item.segment_id, item.key, item.offset, item.generation)
        for item in reported[:MAX_UNREADABLE_REPORTS]
        if key_problem(item.key, STORED_KEY_BYTES) is None and key_problem(item.segment_id) is None
    ]


def _totals(snapshot: ClusterSnapshot, objects: int, tenant: str) -> pb.ClusterStatusResponse:
    """What a client of a tenant learns of the cluster: its own objects, and the nodes and
    the capacity and use per tier, summed, of the segments that may hold its objects (a node
    given another tenant's ``--tenant`` is that tenant's business, as the NO_SPACE message
    says): no segment, node, host or other tenant's count."""
    segments = [s for s in snapshot.segments if not s.info.tenant or s.info.tenant == tenant]
    others = {s.info.node_id for s in snapshot.segments} - {s.info.node_id for s in segments}
    nodes = snapshot.nodes - len(others)  # (a node with no segment mounted still counts)
    response = pb.ClusterStatusResponse(
        objects=objects, nodes=nodes, uptime_s=time.monotonic() - _STARTED
    )
    tiers: dict[int, pb.SegmentStatus] = {}
    for s in segments:
        total = tiers.get(s.info.tier)
        if total is None:
            total = tiers[s.info.tier] = response.segments.add(
                segment_id=f"(every {Tier(s.info.tier).name.lower()} segment)", tier=s.info.tier
            )
        total.capacity += s.capacity
        total.used += s.used
        total.largest_free = max(total.largest_free, s.largest_free)
    return response


def _count(method: str, statuses: Iterable[int]) -> None:
    if isinstance(statuses, list) and statuses:
        first = statuses[0]
        if statuses.count(first) == len(statuses):  # (the usual batch: one status for all,
            # found by identity in C; a Counter hashes each key's enum member)
            metrics.labelled(metrics.KEYS, method, _STATUS_LABELS[first]).inc(len(statuses))
            return
    for status, n in collections.Counter(statuses).items():  # (counted in C)
        metrics.labelled(metrics.KEYS, method, _STATUS_LABELS[status]).inc(n)


def _statuses(method: str, response_type: Any) -> Callable[[Any], Any]:
    """The answer of a call that says one KeyStatus per key: counted, and refused as
    UNAVAILABLE when the core says the term ended while it waited."""

    def answer(statuses: list[KeyStatus]) -> Any:
        _unless_term_ended(statuses)
        _count(method, statuses)
        return response_type(statuses=_wire(statuses))

    return answer


def _wire(value: object) -> Any:
    """A core value where protobuf wants one of its enums: common.status's enums hold the wire
    values, which protoc's stubs do not know."""
    return value


def _unless_term_ended(answer: object) -> None:
    if answer is TERM_ENDED:
        raise CallRefused(grpc.StatusCode.UNAVAILABLE, "the master's term ended meanwhile: retry")


def _check_node_id(node_id: str) -> None:
    """CallRefused (INVALID_ARGUMENT) for a node id no node could have mounted under: the
    master keeps the ids it hears of (their processes), so each is bounded as a key is."""
    if (problem := key_problem(node_id)) is not None:
        raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT, f"node_id: {problem}")


def _enum(kind: type[E], value: int, field: str) -> E:
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(f"{member.value} ({member.name})" for member in kind)
        raise CallRefused(
            grpc.StatusCode.INVALID_ARGUMENT, f"{field} must be one of {names}, got {value}"
        ) from None


def _keys(request: Any, identity: Identity) -> list[str]:
    """The request's keys, checked, in the master's key space (the caller's tenant's)."""
    return _scoped(_checked_keys(request), key_prefix(identity))


def _checked_keys(request: Any) -> list[str]:
    """The request's keys as a list (protobuf builds a str per key on every pass over its own
    container: one pass here, the rest over the list), checked."""
    keys = list(request.keys)
    _check_batch(keys)
    _check_keys(keys)
    return keys


def _scoped(keys: list[str], prefix: str) -> list[str]:
    """``keys`` in the master's key space: each behind its tenant's prefix."""
    return [prefix + key for key in keys] if prefix else keys


def _check_keys(keys: Sequence[str]) -> None:
    """Keys of a lookup or removal: a key no put could have made is a broken client."""
    if plainly_valid(keys):
        return
    for key in keys:
        problem = key_problem(key)
        if problem is not None:
            shown = key if len(key) <= 64 else f"{key[:64]}... ({len(key)} characters)"
            raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT, f"key {shown!r}: {problem}")


def _mapped_segments(request: Any) -> frozenset[str]:
    """The segments a client says it maps (``mapped_segments``): it asks for no capability
    there, so its word needs no checking beyond its size."""
    mapped = request.mapped_segments
    if not mapped:
        return frozenset()
    if len(mapped) > MAX_MAPPED_SEGMENTS or max(map(len, mapped)) > MAX_SEGMENT_ID:
        raise CallRefused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"mapped_segments names at most {MAX_MAPPED_SEGMENTS} segment ids of at most "
            f"{MAX_SEGMENT_ID} characters each: name only the segments mapped",
        )
    return frozenset(mapped)


def _check_batch(keys: Sequence[Any], *, sizes: Sequence[Any] | None = None) -> None:
    if len(keys) > MAX_BATCH:
        raise CallRefused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"a batch holds at most {MAX_BATCH} keys, got {len(keys)}: split it",
        )
    if sizes is not None and len(sizes) != len(keys):
        raise CallRefused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{len(keys)} keys but {len(sizes)} sizes/ids: send one per key",
        )


class Granter:
    """The capabilities of one answer, their expiry fixed when the core gave the answer.

    ``note`` runs then (``CoreDriver.call``'s prepare), before any later event's Forget goes
    out: it records in ``MasterState.capabilities_until`` (and on the wall clock) until
    when grants for each segment may be honoured, which a Forget tells its node, so that
    the node keeps its seal that long. The grants themselves are signed when the answer is
    sent, which may be later (after a tombstone record is written): a grant made then,
    with an expiry counted from then, could outlive the seal of a Forget sent meanwhile.
    Calling the granter grants one replica's exact range; a grant's id is the put id (the
    object's generation): the node refuses a write grant once it recorded that put's
    object, and any grant once it forgot it."""

    __slots__ = (
        "_end_ms",
        "_ends",
        "_keys",
        "_noted",
        "_signers",
        "_until",
        "expiry_ms",
        "rights",
        "tenant",
        "term",
    )

    def __init__(
        self,
        keys: MasterKeys,
        rights: caps.Rights,
        tenant: str,
        state: Any,
        now_ms: int,
        ttl_ms: int,
        ends: dict[str, int],
    ) -> None:
        self._keys = keys
        self.rights = rights
        self.tenant = tenant
        self.term = state.epoch
        self.expiry_ms = now_ms + ttl_ms
        self._until = state.clock() + ttl_ms / 1000.0 + keys.max_skew_ms / 1000.0
        self._end_ms = self.expiry_ms + keys.max_skew_ms
        self._noted: dict[str, float] = state.capabilities_until
        self._ends = ends
        self._signers: dict[str, Callable[[str, int, int, int], bytes]] = {}  # (by node)

    def note(self, replicas: Iterable[PlacedReplica], mapped: frozenset[str]) -> None:
        """Records the grants ``replicas`` will get (those on a segment served over the
        checked stream that the client does not map)."""
        note_segment = self.note_segment
        for replica in replicas:
            segment = replica.segment
            if segment.checked_address and segment.segment_id not in mapped:
                note_segment(segment.segment_id)

    def note_segment(self, segment_id: str) -> None:
        """Records that grants for ``segment_id``'s space run until this granter's end."""
        noted, ends = self._noted, self._ends
        if noted.get(segment_id, 0.0) < self._until:
            noted[segment_id] = self._until
        if ends.get(segment_id, 0) < self._end_ms:
            ends[segment_id] = self._end_ms

    def __call__(self, replica: PlacedReplica, size: int, grant_id: int) -> bytes:
        segment = replica.segment
        signed = self._signers.get(segment.node_id)
        if signed is None:
            signed = self._signers[segment.node_id] = self._keys.for_node(segment.node_id).granter(
                rights=self.rights, expiry_ms=self.expiry_ms, term=self.term, tenant=self.tenant
            )
        return signed(segment.segment_id, replica.address - segment.base_address, size, grant_id)
