"""The ``kvpool`` command: one entry point, a subcommand per job.

Only the module of the subcommand being run is imported. A shell user waits for every import
of every call: ``kvpool get`` has no use for the master's modules (gRPC servers, the metadata
core), and ``kvpool --help`` for none at all. A ``kvpool node`` process must not import the
master's modules either: their Prometheus metrics register in the process-wide registry on
import, and the node's /metrics would list them as its own.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvpool.common import grpc_tuning
from kvpool.common.logging import configure_logging_on_first_use

grpc_tuning.apply()  # a kvpool process: its own gRPC settings, before anything imports grpc

from kvpool.cli import (  # noqa: E402  (after the settings above)
    capability_keys_command,
    client_commands,
    drain_command,
    quota_command,
    token_command,
)

#: The services: name -> (one-line help, module with ``add_arguments(parser)`` and ``run``).
SERVICES = {
    "master": ("run the metadata master (gRPC)", "kvpool.master.main"),
    "node": ("run a storage node", "kvpool.storage_node.main"),
    "up": ("run a local cluster: a master and N nodes", "kvpool.cli.up"),
}
#: The commands that configure logging from their own options (--log-format, --log-level).
SELF_LOGGING = frozenset({"master", "node"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``command`` (the subcommand about to run), only that service's
    module is imported, and the other services' parsers are left empty (they are not used)."""
    parser = argparse.ArgumentParser(
        prog="kvpool",
        description="kvpool: a distributed object store for LLM KV cache.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, module_name) in SERVICES.items():
        service = commands.add_parser(name, help=help_text)
        if command is None or command == name:
            module = importlib.import_module(module_name)
            module.add_arguments(service)
            service.set_defaults(run=module.run)
    client_commands.add_commands(commands)
    drain_command.add_commands(commands)
    token_command.add_commands(commands)
    quota_command.add_commands(commands)
    capability_keys_command.add_commands(commands)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: its first word that is not an option (the
    top-level parser has no option that takes a value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_in(argv)
    if command not in SELF_LOGGING:
        # (a command's output is on stdout, `kvpool get KEY > file` the object's bytes: the
        # client library's lines go to stderr, and only its warnings and errors)
        configure_logging_on_first_use(level="warning")
    parser = build_parser(command or "")  # "": no service's module
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "forward_rest", False):  # a command that parses its own arguments
        args.rest = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
