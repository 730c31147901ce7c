"""The master's gRPC face: a thin ``grpc.aio`` adapter around ``MasterState``.

Each handler checks the request's shape, calls one method of the core and translates the
plain-data result into protobuf. All handlers run on one event loop thread, so the core needs
no locks. Whole-call problems are gRPC status codes; per-key outcomes are KeyStatus values.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import grpc

from kvpool.common.status import KeyStatus, Pin, Tier
from kvpool.master import metrics
from kvpool.master.records import Commit, PlacedReplica, PutOptions, SegmentInfo
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc

MAX_BATCH = 65536


class MasterService(master_pb2_grpc.MasterServicer):
    def __init__(self, state: MasterState) -> None:
        self.state = state
        self._segment_pbs: dict[str, tuple[SegmentInfo, pb.Segment]] = {}

    # ---- node side

    async def MountSegment(self, request, context):
        with _observe("MountSegment"):
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
            )
            self.state.mount_segment(info)
            return pb.MountSegmentResponse()

    async def UnmountSegment(self, request, context):
        with _observe("UnmountSegment"):
            lost, drain = self.state.unmount_segment(request.node_id, request.segment_id)
            return pb.UnmountSegmentResponse(objects_removed=lost, drain_ms=int(drain * 1000))

    async def Heartbeat(self, request, context):
        with _observe("Heartbeat"):
            remount = self.state.heartbeat(request.node_id, request.segment_ids)
            return pb.HeartbeatResponse(remount_segment_ids=remount)

    # ---- client side

    async def PutStart(self, request, context):
        with _observe("PutStart"):
            await _check_batch(context, request.keys, sizes=request.sizes)
            options = PutOptions(
                replicas=request.replicas,
                preferred_hosts=tuple(request.preferred_hosts),
                pin=Pin(request.pin),
                pin_ttl=request.pin_ttl_ms / 1000.0,
            )
            slots = self.state.put_start(request.client_id, request.keys, request.sizes, options)
            response = pb.PutStartResponse(
                write_timeout_ms=int(self.state.config.reservation_timeout * 1000)
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

    async def PutEnd(self, request, context):
        with _observe("PutEnd"):
            await _check_batch(context, request.commits)
            commits = [
                Commit(
                    c.key, c.put_id, tuple(c.replica_ok), c.crc32 if c.HasField("crc32") else None
                )
                for c in request.commits
            ]
            statuses = self.state.put_end(commits)
            _count("PutEnd", statuses)
            return pb.PutEndResponse(statuses=statuses)

    async def PutRevoke(self, request, context):
        with _observe("PutRevoke"):
            await _check_batch(context, request.keys, sizes=request.put_ids)
            statuses = self.state.put_revoke(request.keys, request.put_ids)
            _count("PutRevoke", statuses)
            return pb.PutRevokeResponse(statuses=statuses)

    async def GetReplicas(self, request, context):
        with _observe("GetReplicas"):
            await _check_batch(context, request.keys)
            locations, ttl = self.state.get_replicas(request.keys, request.lease_ms / 1000.0)
            response = pb.GetReplicasResponse(lease_ms=int(ttl * 1000))
            segments: dict[str, pb.Segment] = {}
            for location in locations:
                out = response.objects.add(status=location.status, size=location.size)
                if location.crc32 is not None:
                    out.crc32 = location.crc32
                self._add_replicas(out.replicas, location.replicas, segments)
            response.segments.extend(segments.values())
            _count("GetReplicas", (loc.status for loc in locations))
            return response

    async def Exists(self, request, context):
        with _observe("Exists"):
            await _check_batch(context, request.keys)
            statuses = self.state.exists(
                request.keys, request.lease_ms / 1000.0, grant_lease=not request.no_lease
            )
            _count("Exists", statuses)
            return pb.ExistsResponse(statuses=statuses)

    async def Remove(self, request, context):
        with _observe("Remove"):
            await _check_batch(context, request.keys)
            statuses = self.state.remove(request.keys, request.force)
            _count("Remove", statuses)
            return pb.RemoveResponse(statuses=statuses)

    async def RemovePrefix(self, request, context):
        with _observe("RemovePrefix"):
            result = self.state.remove_prefix(request.prefix, request.force)
            return pb.RemovePrefixResponse(
                removed=result.removed, leased=result.leased, not_ready=result.not_ready
            )

    async def Stat(self, request, context):
        with _observe("Stat"):
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
            if info.crc32 is not None:
                response.crc32 = info.crc32
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
        with _observe("ClientHeartbeat"):
            self.state.client_heartbeat(request.client_id)
            return pb.ClientHeartbeatResponse()

    async def ListKeys(self, request, context):
        with _observe("ListKeys"):
            page = self.state.list_keys(request.prefix, request.limit, request.start_after)
            return pb.ListKeysResponse(
                keys=page.keys, sizes=page.sizes, next_start_after=page.next_start_after
            )

    async def ClusterStatus(self, request, context):
        with _observe("ClusterStatus"):
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
                )
            return response

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
            )
            cached = self._segment_pbs[info.segment_id] = (info, message)
        return cached[1]


_STARTED = time.monotonic()


class _observe:
    """Counts an RPC and times it into the latency histogram."""

    __slots__ = ("_method", "_start")

    def __init__(self, method: str) -> None:
        self._method = method

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        metrics.REQUESTS.labels(self._method).inc()
        metrics.LATENCY.labels(self._method).observe(time.perf_counter() - self._start)


def _count(method: str, statuses: Iterable[int]) -> None:
    tally: dict[int, int] = {}
    for status in statuses:
        tally[status] = tally.get(status, 0) + 1
    for status, n in tally.items():
        metrics.KEYS.labels(method, KeyStatus(status).name.lower()).inc(n)


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
