"""``kvpool drain NODE``: an admin empties a storage node before it goes.

The master (``Drain``, admins only) stops placing objects on the node and has every object
that would lose a replica with it copied to other nodes, node to node, at its
``--rereplication-rate``; the node learns it from its next heartbeat and, once nothing is
left to copy (or its ``--drain-timeout`` has passed), unmounts and exits. This command asks,
then follows the progress until the node has left (or ``--wait`` seconds have passed).
Metadata only: no UCX, so it starts fast.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from kvpool.cli.shown import message, printable
from kvpool.common import cli_numbers
from kvpool.common.sizes import format_size
from kvpool.errors import KVPoolError

#: Seconds between two looks at the progress.
POLL = 1.0


def add_commands(commands: Any) -> None:
    from kvpool.cli.client_commands import _client_options

    drain = commands.add_parser(
        "drain",
        help="empty a storage node: copy its objects to other nodes, then it leaves (admin)",
    )
    _client_options(drain)
    drain.add_argument("node_id", metavar="NODE", help="the node's id (`kvpool status` lists them)")
    drain.add_argument(
        "--wait",
        type=cli_numbers.seconds(0, zero=True),
        default=600.0,
        metavar="SECONDS",
        help="follow the drain this long at most until the node has left (default 600; 0: "
        "ask and return)",
    )
    drain.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvpool.client.master_link import MasterLink
    from kvpool.common.master_address import parse_master
    from kvpool.proto import master_pb2 as pb
    from kvpool.security.caller import CallerCredentials

    try:
        target = parse_master(args.master)
        credentials = CallerCredentials.resolve(
            args.token, args.tls_ca, args.tls_cert, args.tls_key
        )
        credentials.refuse_plaintext_token((*target.masters, *target.etcd))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        args.node_id.encode("utf-8")
    except UnicodeEncodeError:
        print(f"error: the node id {args.node_id!r} is not valid text", file=sys.stderr)
        return 2
    link = MasterLink(target, use_lane=False, credentials=credentials)
    request = pb.DrainRequest(node_id=args.node_id)
    end = time.monotonic() + args.wait
    shown: tuple[int, int] | None = None
    asked = False
    try:
        while True:
            try:
                answer = link.call("Drain", request, time.monotonic() + args.timeout)
            except KVPoolError as error:
                if asked and "NOT_FOUND" in str(error):  # (a loss is DATA_LOSS: below)
                    print(f"node {printable(args.node_id)} drained and left", file=sys.stderr)
                    return 0
                print(f"error: {message(error)}", file=sys.stderr)
                return 1
            left = (answer.objects_left, answer.bytes_left)
            if not asked or left != shown:
                print(
                    f"node {printable(args.node_id)} draining: {answer.objects_left} object(s) "
                    f"({format_size(answer.bytes_left)}) left to copy to "
                    f"{answer.live_nodes} other node(s)",
                    file=sys.stderr,
                )
                shown = left
            asked = True
            if time.monotonic() >= end:
                if args.wait > 0:
                    print(
                        f"error: node {printable(args.node_id)} has not left after "
                        f"{args.wait:g}s: it leaves once nothing is left to copy, or at its "
                        "--drain-timeout",
                        file=sys.stderr,
                    )
                    return 1
                return 0
            time.sleep(min(POLL, max(0.0, end - time.monotonic())))
    finally:
        link.close()
