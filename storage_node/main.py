"""``kvpool node``: a storage node process."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from pathlib import Path

from kvpool.common.gc_tuning import tune_for_server
from kvpool.common.http_server import HealthServer
from kvpool.common.logging import LOG_FORMATS, configure_logging, get_logger
from kvpool.common.master_address import MasterTarget, parse_master
from kvpool.common.process import stop_event_on_signals, write_ready_file
from kvpool.common.sizes import format_size, parse_size

log = get_logger("kvpool.node")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default=None, help="master HOST:PORT (default: $KVPOOL_MASTER)")
    parser.add_argument(
        "--dram",
        type=parse_size,
        default=parse_size("4GiB"),
        help="DRAM segment size, e.g. 4GiB (0: no DRAM segment)",
    )
    parser.add_argument(
        "--dram-shm",
        action="store_true",
        help="keep the DRAM segment in /dev/shm, so its objects survive a restart of the node",
    )
    parser.add_argument(
        "--shm-dir", default="/dev/shm", help="where --dram-shm keeps its files (default /dev/shm)"
    )
    parser.add_argument(
        "--nvme",
        action="append",
        default=[],
        metavar="PATH",
        help="an NVMe segment: a directory (on the device) for its data and index; repeatable",
    )
    parser.add_argument(
        "--nvme-size",
        action="append",
        type=parse_size,
        default=[],
        metavar="SIZE",
        help="size of each --nvme segment (one for all, or one per --nvme), e.g. 200GiB",
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
        help="node id, stable across restarts (default: the host name); one per node process",
    )
    parser.add_argument(
        "--listen", default="0.0.0.0", help="address of the HTTP side door (default: all)"
    )
    parser.add_argument(
        "--http-port", type=int, default=9091, help="port of /healthz, /readyz, /metrics (0: free)"
    )
    parser.add_argument(
        "--heartbeat-interval", type=float, default=1.0, help="seconds between heartbeats"
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on shutdown, keep memory at most this long for readers holding leases (s)",
    )
    parser.add_argument(
        "--ready-file", default=None, help="write the node's id and ports here as JSON once ready"
    )
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="auto")
    parser.add_argument("--log-level", default="info")


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
        asyncio.run(_serve(args, master))
    except (ValueError, OSError) as error:
        log.error("cannot open storage", error=str(error))
        return 1
    return 0


def _storage_problem(args: argparse.Namespace) -> str | None:
    if args.dram < 0:
        return f"--dram must not be negative, got {args.dram}"
    if args.dram == 0 and not args.nvme:
        return "nothing to serve: give --dram SIZE, --nvme PATH, or both"
    if args.dram == 0 and args.dram_shm:
        return "--dram-shm needs a --dram size"
    if args.nvme and len(args.nvme_size) not in (1, len(args.nvme)):
        return f"give one --nvme-size for all --nvme paths, or one per path ({len(args.nvme)})"
    if args.nvme_size and not args.nvme:
        return "--nvme-size without --nvme: say where the NVMe segment lives"
    if args.nvme and not args.nvme_size:
        return "--nvme needs --nvme-size, e.g. --nvme-size 200GiB"
    return None


def _nvme_base(path: str) -> Path:
    """``PATH`` is a directory (created if missing) that holds ``kvpool-nvme.data`` and
    ``kvpool-nvme.index``."""
    return Path(path) / "kvpool-nvme"


async def _serve(args: argparse.Namespace, master: MasterTarget) -> None:
    # UCX is loaded here, not at import: building the CLI parser must stay cheap.
    from kvpool.common.status import Tier
    from kvpool.storage_node.node import StorageNode
    from kvpool.storage_node.segment import allocate_dram_segment, open_persistent_segment
    from kvpool.transport import ucp

    host = args.host or socket.gethostname()
    node_id = args.node_id or socket.gethostname()
    context = ucp.Context()
    worker = context.create_worker()
    segments = []
    if args.dram and args.dram_shm:
        base = Path(args.shm_dir) / f"kvpool-{node_id.replace('/', '_')}-dram"
        segments.append(
            open_persistent_segment(
                context, node_id, base, args.dram, Tier.DRAM, prefault=args.prefault
            )
        )
    elif args.dram:
        segments.append(allocate_dram_segment(context, node_id, args.dram, prefault=args.prefault))
    sizes = args.nvme_size * len(args.nvme) if len(args.nvme_size) == 1 else args.nvme_size
    for path, size in zip(args.nvme, sizes, strict=True):
        segments.append(
            open_persistent_segment(context, node_id, _nvme_base(path), size, Tier.NVME)
        )
    for segment in segments:
        if segment.dropped_on_open:
            log.warning(
                "dropped damaged objects on open",
                segment=segment.segment_id,
                count=len(segment.dropped_on_open),
                keys=segment.dropped_on_open[:10],
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
    )
    http = HealthServer(args.listen, args.http_port, readiness=lambda: node.ready)
    http.start()
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
