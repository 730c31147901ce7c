"""``kvpool node``: a storage node process."""

from __future__ import annotations

import argparse
import asyncio
import errno
import hashlib
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kvpool.common.cli_numbers import MAX_SECONDS, port, seconds, size
from kvpool.common.gc_tuning import tune_for_server
from kvpool.common.http_server import HealthServer
from kvpool.common.listen_address import bare
from kvpool.common.logging import LOG_FORMATS, configure_logging, get_logger
from kvpool.common.master_address import MasterTarget, parse_master
from kvpool.common.memory_limit import memory_limit
from kvpool.common.process import not_dumpable, stop_event_on_signals, write_ready_file
from kvpool.common.sizes import format_size, parse_size
from kvpool.security.identity import tenant_problem
from kvpool.storage_node.security_config import add_security_arguments, credentials_from_args

if TYPE_CHECKING:  # UCX is loaded when the node starts, not to build the CLI parser
    from kvpool.security.caller import CallerCredentials
    from kvpool.storage_node.segment import Segment
    from kvpool.transport import ucp

log = get_logger("kvpool.node")

#: Longest pause between heartbeats (a master declares a node dead after its --node-ttl).
MAX_HEARTBEAT = 60.0
#: Longest --node-id (it names the node's segments, in their index headers too).
MAX_NODE_ID = 255
#: --data-port when none is given: 0 serves the checked stream on a free port (secure
#: nodes), -1 serves none (clients on other hosts then use UCX). Issue 17: one line to flip.
DEFAULT_DATA_PORT = 0
#: The UCX transports of a node without UCX over TCP (``--ucx-tcp``): shared memory and CMA
#: for clients on its host, and loopback.
LOCAL_UCX_TRANSPORTS = "sm,self"

NODE_ID_HELP = (
    "node id, one per node process (default: the host name and a suffix. A node with no "
    "persistent segment takes a random suffix: a fresh id each start, as its objects do not "
    "outlive it. A node with --nvme or --dram-shm takes one derived from those paths (and "
    "--shm-dir): it comes back under the same id after a restart and remounts what it holds, "
    "and two such nodes on one host differ as long as their paths do)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default=None, help="master HOST:PORT (default: $KVPOOL_MASTER)")
    parser.add_argument(
        "--dram",
        type=size(),
        default=parse_size("4GiB"),
        help="DRAM segment size, e.g. 4GiB (0: no DRAM segment; at most this machine's memory)",
    )
    parser.add_argument(
        "--dram-shm",
        action="store_true",
        help="keep the DRAM segment in /dev/shm, so its objects survive a restart of the node",
    )
    parser.add_argument(
        "--shm-dir",
        default="/dev/shm",
        help="where --dram-shm keeps its files, in a directory of their own made there, "
        "kvpool-NAME-dram (NAME: --node-id, else the host name; default /dev/shm)",
    )
    parser.add_argument(
        "--nvme",
        action="append",
        default=[],
        metavar="PATH",
        help="an NVMe segment: a directory (on the device); its data and index go in "
        "PATH/kvpool-nvme/, which only the node may write; repeatable",
    )
    parser.add_argument(
        "--nvme-size",
        action="append",
        type=size(low=1),
        default=[],
        metavar="SIZE",
        help="size of each --nvme segment (one for all, or one per --nvme), e.g. 200GiB; its "
        "blocks are all allocated on the disk at start (a disk without room for them stops "
        "the node at once, not a put later)",
    )
    parser.add_argument(
        "--nvme-sparse",
        action="store_true",
        help="allocate an --nvme segment's blocks as objects are written instead of at start: "
        "the segment may be larger than its disk, and puts placed there fail once the disk is "
        "full",
    )
    parser.add_argument(
        "--prefault",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fault the segment's pages in at start, so first writes run at full speed",
    )
    parser.add_argument(
        "--host",
        default=None,
        help="host name clients use to tell whether they share this host (default: hostname)",
    )
    parser.add_argument(
        "--node-id",
        default=None,
        help=NODE_ID_HELP,
    )
    parser.add_argument(
        "--listen", default="0.0.0.0", help="address of the HTTP side door (default: all)"
    )
    parser.add_argument(
        "--http-port",
        type=port(),
        default=9091,
        help="port of /healthz, /readyz, /metrics (0: free)",
    )
    parser.add_argument(
        "--data-port",
        type=port(none=-1),
        default=DEFAULT_DATA_PORT,
        help="port of the checked stream, the data path of clients on other hosts: every "
        "transfer there moves bytes only under the master's capability for its range "
        f"(0: a free one; -1: none, such clients use UCX; default {DEFAULT_DATA_PORT}). "
        "Listens on --listen; served only when the master grants capabilities (a secure "
        "master)",
    )
    parser.add_argument(
        "--ucx-tcp",
        action="store_true",
        help="let peers on other hosts reach this node's UCX worker over TCP (one-sided "
        "reads and writes the node does not check: trusted networks only). Off by default "
        "while the node serves the checked stream: its worker then offers shared memory "
        "only, to clients on its host (an environment's UCX_TLS naming other transports is "
        "refused without this flag); on when --data-port is -1 or the node --insecure",
    )
    parser.add_argument(
        "--tenant",
        type=_tenant,
        default="",
        help="hold only this tenant's objects (the master places no other tenant's here). "
        "Only such a node's DRAM segments are ever mapped by clients on its host, and only "
        "by its tenant's clients that the master's --same-host-clients names; the node hands "
        "the segment's file to them over a local socket, read-only for reads. Default: any "
        "tenant's objects, never mapped on a secure cluster",
    )
    parser.add_argument(
        "--data-advertise",
        default=None,
        help="host clients connect to for the checked stream (default: --listen, or --host "
        "when --listen is a wildcard)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=seconds(0, MAX_HEARTBEAT),
        default=1.0,
        help=f"seconds between heartbeats, at most {MAX_HEARTBEAT:g}",
    )
    parser.add_argument(
        "--drain-timeout",
        type=seconds(0, MAX_SECONDS, zero=True),
        default=30.0,
        help="on shutdown, keep memory at most this long for readers holding leases (s); "
        "draining (--drain-on-term, kvpool drain), wait at most this long for the objects "
        "to be copied to other nodes first",
    )
    parser.add_argument(
        "--drain-on-term",
        action="store_true",
        help="on SIGTERM, drain before leaving: take no new objects and wait (at most "
        "--drain-timeout) until the master has copied every object that would lose a "
        "replica to other nodes. Give the process that long to stop (Kubernetes: "
        "terminationGracePeriodSeconds)",
    )
    parser.add_argument(
        "--ready-file", default=None, help="write the node's id and ports here as JSON once ready"
    )
    add_security_arguments(parser)
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="auto")
    parser.add_argument("--log-level", default="info")


class CannotStart(Exception):
    """What the node was told to do cannot be done here: a port is taken, a segment is held
    by another process, a segment's directory is not the node's own."""


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    tune_for_server()
    try:
        master = parse_master(args.master)
    except ValueError as error:
        log.error("no master", error=str(error))
        return 2
    problem = _storage_problem(args)
    if problem:
        log.error("bad storage options", error=problem)
        return 2
    try:
        credentials = credentials_from_args(args, master)
    except ValueError as error:
        log.error("no credentials", error=str(error))
        return 2
    if args.insecure:
        log.warning("INSECURE: this node presents no credentials to the master (--insecure)")
    else:
        not_dumpable()  # (its memory, keys and token: not through /proc, nor ptrace or CMA)
    try:
        asyncio.run(_serve(args, master, credentials))
    except CannotStart as error:
        log.error("cannot start", error=str(error))
        return 2
    except (ValueError, OSError) as error:
        log.error("cannot open storage", error=str(error))
        return 1
    return 0


def _tenant(value: str) -> str:
    problem = tenant_problem(value) if value else None  # ("": any tenant's, the default)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def _storage_problem(args: argparse.Namespace) -> str | None:
    if args.dram == 0 and not args.nvme:
        return "nothing to serve: give --dram SIZE, --nvme PATH, or both"
    if args.dram == 0 and args.dram_shm:
        return "--dram-shm needs a --dram size"
    if args.nvme and len(args.nvme_size) not in (1, len(args.nvme)):
        return f"give one --nvme-size for all --nvme paths, or one per path ({len(args.nvme)})"
    if args.nvme_size and not args.nvme:
        return "--nvme-size without --nvme: say where the NVMe segment lives"
    if args.nvme_sparse and not args.nvme:
        return "--nvme-sparse without --nvme: say where the NVMe segment lives"
    if args.nvme and not args.nvme_size:
        return "--nvme needs --nvme-size, e.g. --nvme-size 200GiB"
    memory = memory_limit()
    if args.dram > memory:
        return (
            f"--dram {format_size(args.dram)} is more than this machine's memory "
            f"({format_size(memory)}): give a smaller size"
        )
    if args.node_id is not None and not args.node_id.strip():
        return "--node-id is empty: give a name, or leave the flag out for the default"
    if args.node_id is not None and len(args.node_id) > MAX_NODE_ID:
        return f"--node-id is {len(args.node_id)} characters long; at most {MAX_NODE_ID}"
    return None


def node_id_of(args: argparse.Namespace) -> str:
    """``--node-id``, else the host name and a suffix (see NODE_ID_HELP)."""
    if args.node_id:
        return str(args.node_id)
    host = socket.gethostname()
    places = [str(Path(path).resolve()) for path in args.nvme]
    if args.dram and args.dram_shm:
        places.append(str(Path(args.shm_dir).resolve()))
    if not places:
        return f"{host}-{secrets.token_hex(3)}"
    digest = hashlib.sha256("\n".join(sorted(places)).encode()).hexdigest()
    return f"{host}-{digest[:6]}"


async def _serve(
    args: argparse.Namespace, master: MasterTarget, credentials: CallerCredentials
) -> None:
    # UCX is loaded here, not at import: building the CLI parser must stay cheap.
    from kvpool.storage_node.node import StorageNode
    from kvpool.transport import ucp

    host = args.host or socket.gethostname()
    node_id = node_id_of(args)
    node: StorageNode | None = None
    # The port first: a taken one is reported as such, before any memory is set up.
    http = _http_server(args, lambda: node.ready if node else (False, "opening segments"))
    http.start()
    try:
        config = _ucx_config(args)
        stream_only = config is not None  # (no peer's one-sided RMA: docs/security.md)
        context = ucp.Context(config, rma=not stream_only, active_messages=stream_only)
        worker = context.create_worker()
        segments = _open_segments(args, context, node_id)
    except BaseException:
        http.stop()
        raise
    for segment in segments:
        if segment.dropped_on_open:
            log.warning(
                "dropped damaged objects on open",
                segment=segment.segment_id,
                count=len(segment.dropped_on_open),
                keys=segment.dropped_on_open[:10],
            )
        if segment.unreadable_on_open:
            log.error(
                "dropped objects the disk could not read on open: check the disk",
                segment=segment.segment_id,
                path=str(segment.path),
                count=len(segment.unreadable_on_open),
                keys=segment.unreadable_on_open[:10],
                first_error=segment.read_error,
            )
        damaged = getattr(segment.index, "damaged_records", 0)
        undecodable = getattr(segment.index, "undecodable_records", 0)
        if damaged or undecodable:
            log.warning(
                "skipped index records on open",
                segment=segment.segment_id,
                damaged=damaged,
                undecodable=undecodable,
                # (recorded before the damage, which may have removed them: the master
                # adopts them only if it still knows them)
                unconfirmed=len(segment.index.unconfirmed),
            )
        elif segment.index.unconfirmed:  # (the damage of an earlier open, not yet confirmed)
            log.warning(
                "index entries await a master's confirmation",
                segment=segment.segment_id,
                unconfirmed=len(segment.index.unconfirmed),
            )
    node = StorageNode(
        node_id=node_id,
        host=host,
        master=master,
        context=context,
        worker=worker,
        segments=segments,
        heartbeat_interval=args.heartbeat_interval,
        drain_timeout=args.drain_timeout,
        credentials=credentials,
        drain_on_term=args.drain_on_term,
        checked=_checked_listener(args, host),
        tenant=args.tenant,
        mapping=not args.insecure,
        prove_writes=_ucx_config(args) is not None,  # (UCX over shared memory only)
    )
    log.info(
        "node starting",
        node_id=node_id,
        master=str(master),
        dram=format_size(args.dram),
        segments=[f"{s.segment_id} ({format_size(s.size)})" for s in segments],
        http_port=http.port,
        pid=os.getpid(),
    )

    def announce() -> None:
        write_ready_file(args.ready_file, node_id=node_id, http_port=http.port, pid=os.getpid())

    stop = stop_event_on_signals(asyncio.get_running_loop())

    try:
        await node.run(stop, on_ready=announce)
    finally:
        http.stop()
        log.info("node stopped", node_id=node_id)


def _checked_listener(args: argparse.Namespace, host: str) -> tuple[str, int, str] | None:
    """(address, port, advertised host) of the checked stream; None when there is none
    (``--data-port -1``, or an insecure node: its master grants no capabilities)."""
    if args.data_port < 0 or args.insecure:
        return None
    wildcard = bare(args.listen) in ("0.0.0.0", "::", "")
    return args.listen, args.data_port, args.data_advertise or (host if wildcard else args.listen)


def _ucx_config(args: argparse.Namespace) -> dict[str, str] | None:
    """The node's UCX transports: shared memory only (no peer elsewhere reaches its worker)
    while the checked stream carries every transfer, other nodes' copies included: its
    context then serves no peer's RMA either (over shared memory UCP would run a same-host
    peer's software RMA anywhere in the node, whatever the peer's tenant). UCX's defaults
    (None) with ``--ucx-tcp`` or without the stream. An operator's UCX_TLS is kept where it
    names local transports only; one that would offer more (TCP, say) without ``--ucx-tcp``
    is refused (CannotStart): a tuning variable must not quietly open the unchecked path."""
    if args.ucx_tcp or _checked_listener(args, "") is None:
        return None
    named = os.environ.get("UCX_TLS")
    if named is None:
        return {"TLS": LOCAL_UCX_TRANSPORTS}
    wider = _non_local_transports(named)
    if wider:
        raise CannotStart(
            f"UCX_TLS={named!r} in this node's environment would let peers on other hosts "
            f"reach its UCX worker ({', '.join(wider)}), with one-sided reads and writes the "
            "node does not check (docs/security.md). The checked stream carries every "
            "transfer from other hosts: unset UCX_TLS (or name only local transports, such "
            f"as {LOCAL_UCX_TRANSPORTS!r}), or pass --ucx-tcp to accept UCX over TCP on a "
            "network only trusted peers reach"
        )
    return {"TLS": named}


#: UCX transports that reach no other host (UCX_TLS names; ``sm`` and ``shm`` stand for the
#: shared-memory ones, ``mm`` for posix and sysv, ``cuda`` and ``rocm`` for their GPUs' copy,
#: IPC and GDR transports).
LOCAL_TRANSPORT_NAMES = frozenset(
    ("sm", "shm", "mm", "self", "cma", "posix", "sysv", "xpmem", "knem", "cuda", "cuda_copy",
     "cuda_ipc", "gdr_copy", "rocm", "rocm_copy", "rocm_ipc", "rocm_gdr", "ze_copy", "ze_ipc")
)  # fmt: skip


def _non_local_transports(named: str) -> list[str]:
    """The transports of a UCX_TLS value that may reach other hosts: every name not known
    to be local, and the whole value where it excludes (``^...``: all the others) or is
    empty (UCX's defaults)."""
    value = named.strip()
    if not value or value.startswith("^"):
        return [value or "UCX's defaults"]
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    # (``ud:aux``: a transport named for one use)
    return [name for name in names if name.split(":")[0] not in LOCAL_TRANSPORT_NAMES]


def _http_server(
    args: argparse.Namespace, readiness: Callable[[], tuple[bool, str]]
) -> HealthServer:
    try:
        return HealthServer(args.listen, args.http_port, readiness=readiness)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise CannotStart(
                f"port {args.http_port} is taken (another kvpool node on this host?): pass "
                "--http-port with a free port (0: any free one)"
            ) from None
        raise CannotStart(
            f"cannot listen on {args.listen}:{args.http_port} ({error.strerror or error}): "
            "pass --listen with an address of this host, and --http-port with a port this "
            "user may open (0: any free one)"
        ) from None


def _open_segments(args: argparse.Namespace, context: ucp.Context, node_id: str) -> list[Segment]:
    from kvpool.common.status import Tier
    from kvpool.storage_node import segment_layout
    from kvpool.storage_node.disk_reservation import DiskTooSmall
    from kvpool.storage_node.private_files import SegmentInUse, UnsafeLocation
    from kvpool.storage_node.segment import allocate_dram_segment, open_persistent_segment

    segments = []
    try:
        if args.dram and args.dram_shm:
            name = args.node_id or socket.gethostname()
            base = segment_layout.segment_base(segment_layout.shm_directory(args.shm_dir, name))
            segments.append(
                open_persistent_segment(
                    context, node_id, base, args.dram, Tier.DRAM, prefault=args.prefault
                )
            )
        elif args.dram:
            segments.append(
                allocate_dram_segment(context, node_id, args.dram, prefault=args.prefault)
            )
        sizes = args.nvme_size * len(args.nvme) if len(args.nvme_size) == 1 else args.nvme_size
        for path, nvme_size in zip(args.nvme, sizes, strict=True):
            base = segment_layout.segment_base(segment_layout.nvme_directory(path))
            segments.append(
                open_persistent_segment(
                    context, node_id, base, nvme_size, Tier.NVME, sparse=args.nvme_sparse
                )
            )
    except DiskTooSmall as error:
        raise CannotStart(str(error)) from None
    except SegmentInUse as error:  # the process ends: what was opened goes with it
        raise CannotStart(
            f"{error}: another kvpool node on this host serves this segment. Give each node "
            "its own --nvme directory, and with --dram-shm its own --node-id (or --shm-dir)"
        ) from None
    except UnsafeLocation as error:
        raise CannotStart(str(error)) from None
    return segments
