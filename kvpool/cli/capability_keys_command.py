"""``kvpool capability-keys create/rotate/show``: the file of keys masters sign capabilities
with (``kvpool master --capability-key-file``).

Every master of a cluster must read the same file: a node checks a capability against the
keys its master delivered, and a new leader signs with its own. In Kubernetes the file lives
in a Secret (``auth.capabilityKeysSecret``), which the masters read again when it changes: to
rotate, ``rotate`` a copy of the file and update the Secret. The new key is delivered at once
and signs one node TTL later, when every live node holds it; the older keys stay (at most
four) so that grants signed with them end on their own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvpool.cli.one_line_errors import Refused, one_line_errors


def add_commands(commands: Any) -> None:
    keys = commands.add_parser(
        "capability-keys",
        help="create and rotate the masters' capability key file (shared by every master)",
    )
    actions = keys.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="make a file with one fresh key (mode 0600)")
    create.add_argument("file", metavar="FILE", type=Path)
    create.set_defaults(run=_create)
    rotate = actions.add_parser(
        "rotate", help="add a fresh key and name it current (the oldest goes past four)"
    )
    rotate.add_argument("file", metavar="FILE", type=Path)
    rotate.set_defaults(run=_rotate)
    show = actions.add_parser("show", help="the key ids and the current one (never the keys)")
    show.add_argument("file", metavar="FILE", type=Path)
    show.set_defaults(run=_show)


def _key_file_errors() -> tuple[type[Exception], ...]:
    from kvpool.master.capability_keys import KeyFileError

    return (KeyFileError, OSError)


@one_line_errors(_key_file_errors)
def _create(args: argparse.Namespace) -> int:
    from kvpool.master.capability_keys import load_or_create

    path: Path = args.file
    if path.exists():
        raise Refused(f"{path} exists: `kvpool capability-keys rotate {path}` adds a key to it")
    keys = load_or_create(path)
    print(f"created {path} with key {keys.current}", file=sys.stderr)
    return 0


def _must_exist(path: Path) -> None:
    if not path.exists():
        raise Refused(f"no file {path}: `kvpool capability-keys create {path}` makes one")


@one_line_errors(_key_file_errors)
def _rotate(args: argparse.Namespace) -> int:
    from kvpool.master.capability_keys import rotate

    _must_exist(args.file)
    keys = rotate(args.file)
    kept = ", ".join(str(key_id) for key_id, _ in keys.keys)
    print(
        f"{args.file}: key {keys.current} is current (keys {kept}); masters that read this "
        "file deliver it at once and sign with it one node TTL later",
        file=sys.stderr,
    )
    return 0


@one_line_errors(_key_file_errors)
def _show(args: argparse.Namespace) -> int:
    from kvpool.master.capability_keys import read_key_file

    _must_exist(args.file)
    keys = read_key_file(args.file)
    print(f"keys: {' '.join(str(key_id) for key_id, _ in keys.keys)}; current: {keys.current}")
    return 0
