"""``kvpool node``: a storage node process."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import uuid

from kvpool.common.http_server import HealthServer
from kvpool.common.logging import LOG_FORMATS, configure_logging, get_logger
from kvpool.common.master_address import resolve_master
from kvpool.common.process import stop_event_on_signals, write_ready_file
from kvpool.common.sizes import format_size, parse_size

log = get_logger("kvpool.node")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default=None, help="master HOST:PORT (default: $KVPOOL_MASTER)")
    parser.add_argument(
        "--dram", type=parse_size, default=parse_size("4GiB"), help="DRAM segment size, e.g. 4GiB"
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
        "--node-id", default=None, help="stable node id (default: hostname plus a random suffix)"
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
    try:
        master = resolve_master(args.master)
    except ValueError as error:
        log.error("no master", error=str(error))
        return 2
    if args.dram <= 0:
        log.error("bad --dram", error=f"the DRAM segment needs a positive size, got {args.dram}")
        return 2
    asyncio.run(_serve(args, master))
    return 0


async def _serve(args: argparse.Namespace, master: str) -> None:
    # UCX is loaded here, not at import: building the CLI parser must stay cheap.
    from kvpool.storage_node.node import StorageNode
    from kvpool.storage_node.segment import allocate_dram_segment
    from kvpool.transport import ucp

    host = args.host or socket.gethostname()
    node_id = args.node_id or f"{host}-{uuid.uuid4().hex[:6]}"
    context = ucp.Context()
    worker = context.create_worker()
    segments = [allocate_dram_segment(context, node_id, args.dram, prefault=args.prefault)]
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
        master=master,
        dram=format_size(args.dram),
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
