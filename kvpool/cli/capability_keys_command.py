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


def _refusing(command: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        from kvpool.master.capability_keys import KeyFileError

        try:
            result: int = command(args)
        except (KeyFileError, OSError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return result

    return run


@_refusing
def _create(args: argparse.Namespace) -> int:
    from kvpool.master.capability_keys import load_or_create

    path: Path = args.file
    if path.exists():
        print(
            f"error: {path} exists: `kvpool capability-keys rotate {path}` adds a key to it",
            file=sys.stderr,
        )
        return 2
    keys = load_or_create(path)
    print(f"created {path} with key {keys.current}", file=sys.stderr)
    return 0


def _missing(path: Path) -> bool:
    if path.exists():
        return False
    print(
        f"error: no file {path}: `kvpool capability-keys create {path}` makes one", file=sys.stderr
    )
    return True


@_refusing
def _rotate(args: argparse.Namespace) -> int:
    from kvpool.master.capability_keys import rotate

    if _missing(args.file):
        return 2
    keys = rotate(args.file)
    kept = ", ".join(str(key_id) for key_id, _ in keys.keys)
    print(
        f"{args.file}: key {keys.current} is current (keys {kept}); masters that read this "
        "file deliver it at once and sign with it one node TTL later",
        file=sys.stderr,
    )
    return 0


@_refusing
def _show(args: argparse.Namespace) -> int:
    from kvpool.master.capability_keys import read_key_file

    if _missing(args.file):
        return 2
    keys = read_key_file(args.file)
    print(f"keys: {' '.join(str(key_id) for key_id, _ in keys.keys)}; current: {keys.current}")
    return 0
