"""``kvpool master``: runs the metadata service (gRPC) and its HTTP side door."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import resource
import socket
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc

from kvpool.common import grpc_tuning
from kvpool.common import lane_protocol as lp
from kvpool.common.aio import pause
from kvpool.common.cli_numbers import integer, port, real, seconds, size
from kvpool.common.gc_tuning import tune_for_server
from kvpool.common.http_server import MAX_CONNECTIONS as HTTP_MAX_CONNECTIONS
from kvpool.common.http_server import HealthServer
from kvpool.common.limits import GRPC_SERVER_MESSAGE_OPTIONS
from kvpool.common.listen_address import bare, host_port
from kvpool.common.logging import LOG_FORMATS, configure_logging, get_logger
from kvpool.common.memory_limit import memory_limit
from kvpool.common.memory_trim import TrimRule, malloc_trim, resident_bytes
from kvpool.common.process import stop_event_on_signals, write_ready_file
from kvpool.common.sizes import format_size, parse_size
from kvpool.master import metrics
from kvpool.master.capability_keys import (
    KeyFile,
    MasterKeys,
    load_or_create,
    read_key_file,
)
from kvpool.master.config import MAX_GRANT_SECONDS, PLACEMENTS, MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.driver import CoreDriver
from kvpool.master.election import DEFAULT_TTL, ETCD_ERRORS, AlwaysLeader, Election
from kvpool.master.grpc_request_guard import RequestGuard
from kvpool.master.handlers import MasterHandlers
from kvpool.master.lane_server import MAX_CONNECTIONS as LANE_MAX_CONNECTIONS
from kvpool.master.lane_server import REQUEST_MEMORY, LaneServer
from kvpool.master.leader_gate import LeaderGate
from kvpool.master.load_shedding import LoadShedder
from kvpool.master.quota_file import QuotaFile
from kvpool.master.records import TickReport
from kvpool.master.security_config import (
    MasterSecurity,
    add_security_arguments,
    security_from_args,
)
from kvpool.master.service import MasterService
from kvpool.master.state import MasterState
from kvpool.master.tombstone_file import TombstoneFile, TombstoneFileError
from kvpool.master.tombstone_store import TombstoneStore
from kvpool.proto import master_pb2_grpc
from kvpool.security import capabilities as caps
from kvpool.security.etcd_tls import parse_etcd_endpoint
from kvpool.security.tls import TlsFiles

log = get_logger("kvpool.master")

#: Objects one tick goes through in its bulk jobs (frees, ended leases, an eviction pass);
#: calls waiting meanwhile are answered between steps. Chosen by bench/full_store.py's put
#: latency percentiles (docs/benchmarks.md, "Bulk work in steps").
TICK_STEP = 64
#: The master's memory counted per object for the default ``--max-objects``: several times
#: what one costs it (records, indexes, its share of the story ring; docs/reliability.md,
#: "The master's object table"), so that the table stays well within the memory.
MEMORY_PER_OBJECT = 4096
#: Seconds between two copies of every tenant's usage for the metrics.
TENANT_METRICS_EVERY = 1.0
#: What the nodes copy between them at most, by default, to make good lost replicas: a
#: fraction of what one node's network carries, so that clients keep the rest.
DEFAULT_REREPLICATION_RATE = "256MiB"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = MasterConfig()
    # Every number is checked as it is read (common/cli_numbers.py): finite, within these
    # ceilings (durations: at most cli_numbers.MAX_SECONDS) and MasterConfig's own ranges.
    max_tick, max_inflight, max_election_ttl, max_story_events = 60.0, 1_000_000, 3600, 10**8
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    parser.add_argument(
        "--port",
        type=port(),
        default=50051,
        help="gRPC port (default %(default)s; 0 picks a free one)",
    )
    parser.add_argument(
        "--lane-port",
        type=port(none=-1),
        default=50052,
        help="port of the metadata lane, the lean protocol of the hot client calls and the "
        "nodes' command streams (default %(default)s; 0 picks a free one; -1: none, everything "
        "over gRPC). Clients "
        "learn it over gRPC and fall back to gRPC where it is unreachable",
    )
    parser.add_argument(
        "--lane-request-memory",
        type=size(low=lp.REQUEST_LIMIT),
        default=REQUEST_MEMORY,
        help="memory the metadata lane's large requests (over 64 KiB) may hold at once while "
        "they arrive, whatever the number of connections; one that does not fit is read once "
        "others are done (default 1GiB; at least the largest request, "
        f"{-(-lp.REQUEST_LIMIT // (1 << 20))}MiB)",
    )
    parser.add_argument(
        "--http-port",
        type=port(),
        default=9090,
        help="port of /healthz, /readyz, /metrics (default %(default)s; 0: free)",
    )
    parser.add_argument(
        "--default-replicas",
        type=integer(1, defaults.max_replicas),
        default=defaults.default_replicas,
        help="replicas per object when a put does not say (default %(default)s; at most "
        f"{defaults.max_replicas}: puts asking for more are refused)",
    )
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default=defaults.placement,
        help="replica placement: random nodes, or the most free first",
    )
    parser.add_argument(
        "--lease-ttl",
        type=seconds(0, defaults.max_lease_ttl),
        default=defaults.lease_ttl,
        help=f"read lease in seconds, at most {defaults.max_lease_ttl:g}",
    )
    parser.add_argument(
        "--write-timeout",
        type=seconds(0, MAX_GRANT_SECONDS),
        default=defaults.write_timeout,
        help="seconds a writer has to copy its bytes after PutStart (also the fence after a "
        f"master change), at most {MAX_GRANT_SECONDS:g}",
    )
    parser.add_argument(
        "--reservation-timeout",
        type=seconds(0),
        default=defaults.reservation_timeout,
        help="seconds before an uncommitted put is revoked and its key freed",
    )
    parser.add_argument(
        "--reclaim-delay",
        type=seconds(0, zero=True),
        default=defaults.reclaim_delay,
        help="extra seconds a revoked reservation's space stays quarantined",
    )
    parser.add_argument(
        "--node-ttl",
        type=seconds(0),
        default=defaults.node_ttl,
        help="seconds without a heartbeat before a storage node is declared dead",
    )
    parser.add_argument(
        "--client-ttl",
        type=seconds(0),
        default=defaults.client_ttl,
        help="seconds without a heartbeat before a client's reservations are revoked",
    )
    parser.add_argument(
        "--high-watermark",
        type=real(0, 1, low_included=False),
        default=defaults.high_watermark,
        help="fill fraction of a segment or the pool that starts eviction (default 0.90)",
    )
    parser.add_argument(
        "--eviction-ratio",
        type=real(0, 1, high_included=False),
        default=defaults.eviction_ratio,
        help="fraction of capacity eviction frees below the watermark (default 0.05)",
    )
    parser.add_argument(
        "--soft-pin-ttl",
        type=seconds(0),
        default=defaults.soft_pin_ttl,
        help="seconds a soft pin lasts unless the put says otherwise",
    )
    parser.add_argument(
        "--rereplication-rate",
        type=size(),
        default=parse_size(DEFAULT_REREPLICATION_RATE),
        metavar="BYTES_PER_S",
        help="bytes per second at most that the nodes copy between them to give objects "
        "that lost a replica with their node a new one, and to copy a draining node's "
        f"objects away (default {DEFAULT_REREPLICATION_RATE}; 0: off, and drains refused)",
    )
    parser.add_argument(
        "--rereplication-copies",
        type=integer(1, 1024),
        default=defaults.rereplication_copies,
        help="copies between nodes in flight at most (default %(default)s)",
    )
    parser.add_argument(
        "--tick",
        type=seconds(0, max_tick),
        default=0.1,
        help=f"seconds between timeout checks, at most {max_tick:g} (default 0.1)",
    )
    parser.add_argument(
        "--max-inflight",
        type=integer(1, max_inflight),
        default=1024,
        help="calls admitted and not yet answered; beyond this the master answers "
        "RESOURCE_EXHAUSTED",
    )
    parser.add_argument(
        "--etcd",
        default=None,
        help="etcd endpoint(s) for leader election, e.g. http://etcd:2379 (HA mode)",
    )
    parser.add_argument(
        "--cluster",
        default="kvpool",
        type=_cluster_name,
        help="cluster name (etcd key prefix; no '/')",
    )
    parser.add_argument(
        "--tombstone-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="a master that runs alone (no --etcd) keeps there what it must refuse from a "
        "node that was away when objects were removed, so that removals stick across its "
        "restart (default: in memory only; with --etcd the records live in etcd)",
    )
    parser.add_argument(
        "--election-ttl",
        type=integer(1, max_election_ttl),
        default=DEFAULT_TTL,
        help="seconds of the etcd lease behind leadership; a failover takes at most twice this",
    )
    parser.add_argument(
        "--advertise",
        default=None,
        help="HOST:PORT other processes use to reach this master (default: host name:port)",
    )
    parser.add_argument(
        "--ready-file", default=None, help="write the bound addresses here as JSON once serving"
    )
    parser.add_argument(
        "--debug-validate",
        action="store_true",
        help="check the metadata core's invariants after every event and fail loudly on a "
        "broken one (for debugging: costs CPU in proportion to the objects held)",
    )
    parser.add_argument(
        "--max-objects",
        type=integer(1, 10**10),
        default=None,
        help="objects the master holds at most, every tenant's together; a put beyond evicts "
        "the least recently used (fairly, with --quotas). Bounds the master's memory whatever "
        "the objects' sizes (default: its memory limit, the cgroup's where lower, over "
        f"{MEMORY_PER_OBJECT // 1024} KiB)",
    )
    parser.add_argument(
        "--story-events",
        type=integer(0, max_story_events),
        default=defaults.story_events,
        help="events of all keys kept for `kvpool story KEY` to tell, the last ones (a put is "
        "three; each holds its key and replicas, a few hundred bytes of the master's memory, "
        "removed keys' too; 0: none; default %(default)s)",
    )
    parser.add_argument(
        "--quotas",
        type=Path,
        default=None,
        metavar="FILE",
        help="per-tenant quotas and guaranteed shares (JSON; `kvpool quota set --quotas FILE "
        "...`), read again when it changes. With it, eviction is fair between tenants "
        '(docs/security.md, "Tenants and quotas"); without, no quota and plain LRU',
    )
    parser.add_argument(
        "--capability-key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the keys this master signs data-path capabilities with (created, mode 0600, "
        "with a fresh key when absent; read again when it changes, so that a rotation "
        "reaches running masters). HA masters must share one. Default: a fresh key in memory "
        "(a lone master only). Secure masters only: an --insecure one grants none",
    )
    parser.add_argument(
        "--capability-skew-ms",
        type=integer(0, 60_000),
        default=caps.DEFAULT_MAX_SKEW_MS,
        help="how far a node's clock may lag this master's: nodes honour a capability this "
        "long past its expiry, and space waits as much longer before reuse (default "
        "%(default)s)",
    )
    add_security_arguments(parser)
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="auto")
    parser.add_argument("--log-level", default="info")


def config_from_args(args: argparse.Namespace) -> MasterConfig:
    """The configuration the flags give (each checked on its own as it was read); a
    ValueError when they do not fit together."""
    if args.eviction_ratio >= args.high_watermark:
        raise ValueError(
            f"--eviction-ratio ({args.eviction_ratio:g}) must be below --high-watermark "
            f"({args.high_watermark:g}): eviction frees that much below the watermark"
        )
    return MasterConfig(
        default_replicas=args.default_replicas,
        placement=args.placement,
        lease_ttl=args.lease_ttl,
        reservation_timeout=args.reservation_timeout,
        write_timeout=args.write_timeout,
        reclaim_delay=args.reclaim_delay,
        node_ttl=args.node_ttl,
        client_ttl=args.client_ttl,
        high_watermark=args.high_watermark,
        eviction_ratio=args.eviction_ratio,
        soft_pin_ttl=args.soft_pin_ttl,
        validate_each_event=args.debug_validate,
        story_events=args.story_events,
        max_objects=args.max_objects or max(1, memory_limit() // MEMORY_PER_OBJECT),
        rereplication_rate=float(args.rereplication_rate),
        rereplication_copies=args.rereplication_copies,
    )


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    tune_for_server()
    try:
        config = config_from_args(args)
        security = security_from_args(args)
        if args.etcd:
            etcd_endpoints(args.etcd, security.etcd_tls)  # (refuses a scheme that does not fit)
            if args.tombstone_file is not None:
                raise ValueError(
                    "--tombstone-file is for a master that runs alone: with --etcd the "
                    "records live in etcd, where every master reads them (drop the flag)"
                )
        quotas = QuotaFile(args.quotas) if args.quotas is not None else None
        keys = _capability_keys(args, config) if security.secure else None
        if keys is not None:
            config = dataclasses.replace(config, capability_skew=keys.max_skew_ms / 1000.0)
        connection_options = grpc_connection_options(args)
    except ValueError as error:
        log.error("bad configuration", error=str(error))
        return 2
    if not security.secure:
        log.warning(
            "INSECURE: no credentials and no TLS; anyone who reaches this master's ports may "
            "read, write and remove everything (--insecure)",
            host=args.host,
        )
    try:
        asyncio.run(
            serve(args, config, security, quotas, keys, connection_options=connection_options)
        )
    except (CannotListen, TombstoneFileError, BadSetting) as error:
        log.error("cannot start", error=str(error))
        return 2
    return 0


class CannotListen(Exception):
    """A port this master was told to serve on is taken (or not ours to bind)."""


class BadSetting(Exception):
    """A setting read once the master runs (the environment's lane caps) is out of range."""


def grpc_connection_options(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The gRPC server's bounds on its connections (grpc_tuning.server_connection_options),
    its cap counting what this master's lane and HTTP side door may hold, as they are
    descriptors too; logged, with a warning where the descriptor limit is too low for all
    of them (their caps are then worth less: raise it). ValueError for an override that is
    not a number."""
    others = (LANE_MAX_CONNECTIONS if args.lane_port >= 0 else 0) + HTTP_MAX_CONNECTIONS
    options = grpc_tuning.server_connection_options(others)
    named = dict(options)
    room = grpc_tuning.descriptor_room(others)
    if room is not None and room < grpc_tuning.MIN_CONNECTIONS:
        log.warning(
            "the descriptor limit is lower than the master's connection caps need: raise it "
            "(ulimit -n, LimitNOFILE=, the container's nofile)",
            limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            needed=others + grpc_tuning.RESERVED_DESCRIPTORS + grpc_tuning.MIN_CONNECTIONS,
        )
    log.info(
        "gRPC connections bounded",
        max_connections=named["grpc.max_allowed_incoming_connections"],
        handshake_timeout_ms=named["grpc.server_handshake_timeout_ms"],
        idle_ms=named["grpc.max_connection_idle_ms"],
    )
    return options


def _cannot_listen(what: str, host: str, port: int, flag: str, error: object) -> CannotListen:
    return CannotListen(
        f"cannot listen for {what} on {host}:{port} ({error}): another process (another "
        f"master?) holds it. Pick another port with {flag} (0: any free one)"
    )


async def serve(
    args: argparse.Namespace,
    config: MasterConfig,
    security: MasterSecurity,
    quotas: QuotaFile | None = None,
    keys: MasterKeys | None = None,
    *,
    connection_options: list[tuple[str, int]],
) -> None:
    """``connection_options``: the gRPC server's bounds on its connections
    (``grpc_connection_options``, as ``run`` read them)."""
    stop = stop_event_on_signals(asyncio.get_running_loop())
    leadership: Election | AlwaysLeader
    if args.etcd:
        leadership = Election(
            etcd_endpoints(args.etcd, security.etcd_tls),
            args.cluster,
            "",
            args.election_ttl,
            tls=security.etcd_tls,
        )
        driver = CoreDriver(None)  # a standby until elected
    else:
        leadership = AlwaysLeader()
        # The epoch orders this master's writes after any earlier master's (whole seconds
        # fit the 32 bits it gets in every put id until 2106); clients wait out the rest of
        # its second, so that a master restarted within it has a later one (core.py).
        # Nodes that held objects for an earlier run of this master remount within a few
        # seconds: until then, clients are told it is rebuilding (they retry).
        wall = time.time()
        state = _new_state(config, int(wall), quotas)
        epoch_ends = state.clock() + (int(wall) + 1 - wall)
        kept = None
        if args.tombstone_file is not None:
            kept = TombstoneFile(args.tombstone_file)
            restored = await kept.load()  # (raises TombstoneFileError: the master stops)
            state.restore_tombstones(restored)
            log.info("tombstone records read", path=str(kept.path), records=len(restored))
        driver = CoreDriver(
            MasterCore(
                state,
                awaited_nodes=None,
                rebuild_window=config.node_ttl,
                epoch_ends=epoch_ends,
            )
        )
        if kept is not None:
            driver.durable = kept
            kept.begin(state.durable_record)
    handlers = MasterHandlers(driver)
    handlers.capability_keys = keys
    handlers.same_host = args.same_host_clients
    if keys is not None:  # (nodes copy from each other over the checked stream)
        driver.copy_grant = handlers.grant_copy
        driver.grants_end_ms = handlers.grants_end_ms
    key_watch = _KeyFileWatch(args.capability_key_file) if keys is not None else None
    service = MasterService(handlers, security.auth)
    shedder = LoadShedder(args.max_inflight)
    gate = LeaderGate(leadership, driver.client_refusal)
    guard = RequestGuard(security.auth, certificates_required=args.require_client_cert)
    server = grpc.aio.server(
        options=[
            *GRPC_SERVER_MESSAGE_OPTIONS,
            ("grpc.so_reuseport", 0),
            # a peer gone without closing (a node's host lost, a partition) ends its calls,
            # a node's command stream among them, within about 40 s
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            # a peer without a token must not hold connections until the master runs out of
            # descriptors: a cap, and a deadline on handshakes and on connections left idle
            *connection_options,
        ],
        # The shedder is outermost: it counts a call only once the others let it through
        # (their refusals never reach a handler that would release it).
        interceptors=[shedder, guard, gate],
    )
    master_pb2_grpc.add_MasterServicer_to_server(service, server)
    try:
        address = host_port(args.host, args.port)
        if security.grpc_credentials is not None:
            port = server.add_secure_port(address, security.grpc_credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as error:
        raise _cannot_listen("gRPC", args.host, args.port, "--port", error) from None
    try:
        lane = LaneServer(
            handlers,
            gate,
            shedder,
            security.auth,
            tls=security.lane_tls,
            request_memory=args.lane_request_memory,
        )
    except ValueError as error:  # (a cap given in the environment, out of range)
        raise BadSetting(str(error)) from None
    if args.lane_port >= 0:
        try:
            handlers.lane_port = await lane.start(args.host, args.lane_port)
        except OSError as error:
            reason = error.strerror or str(error)
            raise _cannot_listen(
                "the metadata lane", args.host, args.lane_port, "--lane-port", reason
            ) from None
    await server.start()
    advertise = args.advertise or host_port(_reachable_host(args.host), port)

    def readiness() -> tuple[bool, str]:
        if leadership.serving():
            return True, "leading" if args.etcd else "serving"
        return False, f"standby; the leader is {leadership.leader or '(none yet)'}"

    def ready_in_any_role() -> tuple[bool, str]:
        """/readyz?role=any, the readiness probe of several masters: the leader, or a
        standby that can campaign (etcd answers it); not one cut off from etcd, which could
        never take over."""
        ready, why = readiness()
        if ready or not isinstance(leadership, Election):
            return ready, why
        in_touch, cut_off = leadership.in_touch()
        return (True, why) if in_touch else (False, f"standby; {cut_off}")

    try:
        http = HealthServer(
            args.host, args.http_port, readiness=readiness, any_role=ready_in_any_role
        )
    except OSError as error:
        await lane.stop()
        await server.stop(0)
        reason = error.strerror or str(error)
        raise _cannot_listen("HTTP", args.host, args.http_port, "--http-port", reason) from None
    http.start()
    # (read at each scrape, as /readyz reads it: 1 from the moment a term serves)
    metrics.LEADER.set_function(lambda: 1.0 if leadership.serving() else 0.0)
    tasks = []
    if isinstance(leadership, Election):
        leadership.address = advertise

        handlers.registry = leadership
        election = leadership
        election.step_down_reason = driver.step_down_reason
        records = driver.durable = TombstoneStore(
            lambda: election.etcd_client,
            election.cluster_prefix,
            election.key,
            lambda: election.address,
        )

        async def elected(epoch: int) -> None:
            # (either read failing raises: the term is given up, and campaigned for again)
            nodes = await _read_for_term(
                "the storage nodes listed in etcd", election.registered_nodes()
            )
            tombstones = await _read_for_term("the tombstone records in etcd", records.load())
            log.info(
                "rebuilding the index from the nodes",
                expected_nodes=sorted(nodes.live),
                away_nodes=sorted(nodes.away),
                tombstone_records=len(tombstones),
            )
            state = _new_state(config, epoch, quotas)
            state.restore_tombstones(tombstones)
            if nodes.away:  # (not waited for: what ends from now on is refused at their return)
                state.nodes_unheard(nodes.away)
            for node_id, lost in nodes.lost.items():  # (`kvpool drain` hears of it still)
                state.remember_loss(node_id, lost)
            if election.etcd_data_lost:
                # (no node list to wait for, and a leader of before may still answer until
                # its lease, unknown to etcd now, is found gone: this term takes no client
                # for a lease TTL, then waits for whatever nodes come, as a first start does)
                core = MasterCore(
                    state,
                    awaited_nodes=None,
                    rebuild_window=config.node_ttl,
                    epoch_ends=state.clock() + election.ttl,
                )
            else:
                core = MasterCore(state, awaited_nodes=nodes.live, rebuild_window=config.node_ttl)
            driver.reset(core)

        async def lost() -> None:
            driver.reset(None)
            metrics.STATE.clear()  # (a standby exports none of the cluster's series)

        campaign = asyncio.create_task(leadership.run(stop, elected, lost))
        campaign.add_done_callback(lambda task: _campaign_ended(task, stop))
        tasks.append(campaign)
    log.info(
        "master started",
        grpc_port=port,
        lane_port=lane.port,
        http_port=http.port,
        advertise=advertise,
        etcd=args.etcd or "(none: the only master)",
        tls=security.grpc_credentials is not None,
        credentials=str(args.credentials) if security.secure else "(none: --insecure)",
        config=str(config),
    )
    write_ready_file(args.ready_file, grpc_port=port, lane_port=lane.port, http_port=http.port)
    trim = _MemoryTrim()
    leaving = _NodesLeaving()
    try:
        evicted = 0  # by the eviction pass under way, logged once it ends
        due: float | None = None  # when this tick was planned
        while not stop.is_set():
            started = time.monotonic()
            late_by = 0.0 if due is None else max(0.0, started - due)
            trim.maybe(started)
            if keys is not None and key_watch is not None:
                key_watch.apply(keys, started)
            report = _tick(driver, handlers, quotas, late_by, leaving)
            if report is not None:
                evicted += report.objects_evicted
                for space in report.passes_started:
                    log.info("eviction pass started: past the high watermark", **space)
                if report.unfinished:
                    # Calls get at least as long as the step took before the next one: a put
                    # goes through the master three times (PutStart, PutEnd, its node's answer).
                    now = time.monotonic()
                    due = now + (now - started)
                    await pause(stop, now - started)
                    continue
                if evicted:
                    log.info("objects evicted", count=evicted)
                    evicted = 0
            due = time.monotonic() + args.tick
            await pause(stop, args.tick)
    finally:
        log.info("master stopping")
        for task in tasks:
            task.cancel()
        await lane.stop()
        await server.stop(grace=1.0)
        http.stop()


def _capability_keys(args: argparse.Namespace, config: MasterConfig) -> MasterKeys:
    """The keys this master grants with: from ``--capability-key-file`` (made when
    absent), else a fresh one. A new key of the file signs once every live node has
    heartbeated since it appeared (one node TTL)."""
    path = args.capability_key_file
    keys = KeyFile(((1, caps.KeyRing.new_secret()),), 1) if path is None else load_or_create(path)
    return MasterKeys(keys, activate_after=config.node_ttl, max_skew_ms=args.capability_skew_ms)


class _MemoryTrim:
    """Gives freed heap memory back to the system when the resident size has grown
    (common/memory_trim.py), one trim at a time, on a worker thread."""

    def __init__(self) -> None:
        self.rule = TrimRule()
        self._running: asyncio.Future[None] | None = None

    def maybe(self, now: float) -> None:
        if malloc_trim is None or self._running is not None:
            return
        if self.rule.due(now, resident_bytes):
            self._running = asyncio.get_running_loop().run_in_executor(None, malloc_trim)
            self._running.add_done_callback(self._done)

    def _done(self, _: asyncio.Future[None]) -> None:
        self._running = None
        self.rule.trimmed(resident_bytes())


class _KeyFileWatch:
    """Reads the capability key file again when it changes (a rotation)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_ino

    def apply(self, keys: MasterKeys, now: float) -> None:
        stamp = self._stat()
        if stamp is not None and stamp != self._stamp and self.path is not None:
            try:
                keys.reload(read_key_file(self.path), now)
            except Exception as error:  # (in the serving loop: keep the keys, never stop)
                log.error("capability key file not taken", error=str(error) or repr(error))
            else:
                log.info("capability keys read again", key_ids=keys.ring.key_ids())
            self._stamp = stamp
        keys.tick(now)


T = TypeVar("T")


def _campaign_ended(task: asyncio.Task[None], stop: asyncio.Event) -> None:
    """The election campaigns until the master stops; one that ended otherwise (a bug it
    did not survive) would leave this master a standby for good with nobody told: it stops
    the master instead, saying why (its supervisor starts it again)."""
    if stop.is_set() or task.cancelled():
        return
    error = task.exception()
    log.error(
        "the election stopped campaigning; stopping the master",
        error=repr(error) if error is not None else "(it returned)",
    )
    stop.set()


def _cluster_name(text: str) -> str:
    """A cluster name: its etcd keys live under ``/kvpool/NAME/``, so a "/" in it would put
    them inside another cluster's (``a/nodes`` writes ``a``'s node list), as clients
    refuse it in ``etcd://HOST/CLUSTER``."""
    if not text or "/" in text or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a cluster name: give a name without '/' (e.g. kvpool, team-a)"
        )
    return text


async def _read_for_term(what: str, read: Awaitable[T]) -> T:
    """What a new term reads from etcd before it begins; a failure is logged, naming
    ``what``, and raised (the term is given up)."""
    try:
        return await read
    except ETCD_ERRORS as error:
        log.error(
            f"the term cannot begin: {what} could not be read",
            error=str(error) or type(error).__name__,
        )
        raise


class _NodesLeaving:
    """Tells the cluster's registry (master/election.py) of each node that leaves the core:
    declared dead, or gone once it unmounted its last segment (it shut down, drained, was
    scaled down), and of each the rebuild window of a new term closed without. Each is away
    from then on: a later leader does not wait for it, and refuses what ended while it was
    away should it come back with its segments (a paused process, a node with its disk).

    A node declared dead is told away one node TTL later, unless it is back by then or the
    term has ended: a leader that declared every node dead may be the one cut off from them
    and step down (``MasterCore.step_down_reason``); its successor must wait for them in its
    rebuild window (answering clients "rebuilding", which they retry), not take clients at
    once with an empty index. If they are dead, that window closes without them, and the
    successor tells them away then."""

    def __init__(self) -> None:
        self._core: MasterCore | None = None
        self._nodes: set[str] = set()
        #: node id -> (when it was declared dead, on the core's clock; objects lost).
        self._dead: dict[str, tuple[float, int]] = {}

    def check(self, core: MasterCore, registry: Any, dead: Sequence[str] = ()) -> None:
        """After a tick: the nodes gone from the core's state since the last one, ``dead``
        those of them it declared dead."""
        nodes = core.state.nodes
        if core is not self._core:  # (a new term: its nodes are those that mount)
            self._core, self._nodes, self._dead = core, set(), {}
        now = core.clock()
        for node_id in dead:
            self._dead[node_id] = (now, core.state.left_with_losses.get(node_id, 0))
        if self._nodes or nodes:
            current = set(nodes)
            for node_id in self._nodes - current:
                if node_id not in self._dead:
                    registry.node_gone(node_id, core.state.left_with_losses.get(node_id, 0))
            self._nodes = current
        if self._dead:
            hold = core.state.config.node_ttl
            for node_id, (since, lost) in list(self._dead.items()):
                if node_id in nodes:
                    del self._dead[node_id]  # (back: registered as serving at its mount)
                elif now - since >= hold or lost:
                    del self._dead[node_id]
                    registry.node_gone(node_id, lost, ago=now - since)
        for node_id in core.take_nodes_not_heard():
            if node_id not in nodes:
                registry.node_gone(node_id)


def _new_state(config: MasterConfig, epoch: int, quotas: QuotaFile | None) -> MasterState:
    state = MasterState(config, clock=time.monotonic, epoch=epoch)
    if quotas is not None:
        state.set_quotas(quotas.current())
    return state


def _tick(
    driver: CoreDriver,
    handlers: MasterHandlers,
    quotas: QuotaFile | None = None,
    late_by: float = 0.0,
    leaving: _NodesLeaving | None = None,
) -> TickReport | None:
    """One tick of the core (its bulk jobs in steps of TICK_STEP objects); None on a standby.
    The quotas file's quotas go to the core first when they changed (or the core is new).
    ``late_by``: how much later than planned the tick comes (MasterState.tick).
    ``leaving``: tells the registry (an Election's) of the nodes that left."""
    core = driver.core
    registry = handlers.registry
    if quotas is not None:
        current = quotas.current()  # (a standby reads it too: it begins its term with it)
        if core is not None and core.state.quotas is not current:
            core.state.set_quotas(current)
    report = driver.tick(TICK_STEP, late_by)
    if core is None or report is None:
        return None
    if report.silence_forgiven:
        log.warning(
            "the master did not run for a while (its process stopped, its host paused or its "
            "loop blocked): silences of nodes and clients in that time are not held against "
            "them",
            seconds=round(report.silence_forgiven, 3),
        )
    if registry is not None:
        if leaving is not None:
            leaving.check(core, registry, report.dead_nodes)
        else:
            for node_id in report.dead_nodes:
                registry.node_gone(node_id, core.state.left_with_losses.get(node_id, 0))
    if report.reservations_reclaimed:
        log.info("reservations reclaimed", keys=len(report.reservations_reclaimed))
    if report.dead_clients:
        log.warning("clients declared dead", clients=len(report.dead_clients))
    state = core.state
    if report.dead_nodes:
        log.warning(
            "storage nodes declared dead",
            nodes=report.dead_nodes,
            objects_lost=report.objects_lost,
            under_replicated=state.snapshot().under_replicated,
            rereplication=format_size(int(state.config.rereplication_rate)) + "/s"
            if state.config.rereplication_rate
            else "off",
        )
    metrics.STATE.publish(state.snapshot(), state.counters)
    refusals = dict(state.quota_refusals)
    for tenant, count in handlers.inflight.refusals.items():
        refusals[tenant, "inflight"] = count
    now = time.monotonic()
    if now - metrics.STATE.tenants_published_at >= TENANT_METRICS_EVERY:
        # (a copy of every tenant's usage: once a second, not every tick, with many tenants)
        metrics.STATE.publish_tenants(state.tenant_usage(), refusals)
        metrics.STATE.tenants_published_at = now
    return report


def etcd_endpoints(etcd: str, tls: TlsFiles | None) -> list[str]:
    """``https://a:2379,https://b:2379`` -> ["a:2379", "b:2379"]. An ``https://`` endpoint
    needs TLS material (--etcd-ca ...), a plain ``http://`` one must not come with it, and a
    bare HOST:PORT takes https when it does: the scheme is never changed without a word.
    ValueError when they do not fit."""
    endpoints = []
    for part in etcd.split(","):
        if part.strip():
            _, host, port = parse_etcd_endpoint(part.strip(), tls)
            endpoints.append(f"{host}:{port}")
    return endpoints


def _reachable_host(bound: str) -> str:
    return socket.gethostname() if bare(bound) in ("0.0.0.0", "::", "") else bound
