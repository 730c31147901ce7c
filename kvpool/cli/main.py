"""The ``kvpool`` command: one entry point, a subcommand per job."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvpool.cli import client_commands, up
from kvpool.master import main as master_main
from kvpool.storage_node import main as node_main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpool",
        description="kvpool: a distributed object store for LLM KV cache.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    master = commands.add_parser("master", help="run the metadata master (gRPC)")
    master_main.add_arguments(master)
    master.set_defaults(run=master_main.run)

    node = commands.add_parser("node", help="run a storage node")
    node_main.add_arguments(node)
    node.set_defaults(run=node_main.run)

    local = commands.add_parser("up", help="run a local cluster: a master and N nodes")
    up.add_arguments(local)
    local.set_defaults(run=up.run)

    client_commands.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "forward_rest", False):  # a command that parses its own arguments
        args.rest = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
