"""``kvpool token create/list/revoke``: the bearer tokens of a credentials file.

Works on the file the master reads (``--credentials``, else ``$KVPOOL_CREDENTIALS``); a
running master picks changes up within a second. A token is printed once, when created, on
stdout alone (``kvpool token create ... > node-0.token``): the file keeps only its hash.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kvpool.cli.one_line_errors import OutputFailed, Refused, one_line_errors
from kvpool.cli.shown import cell

ROLES = ("node", "client", "admin")


def _credentials_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--credentials",
        metavar="FILE",
        default=None,
        help="the credentials file (default: $KVPOOL_CREDENTIALS)",
    )


def add_commands(commands: Any) -> None:
    token = commands.add_parser(
        "token", help="create, list and revoke bearer tokens (the file keeps only their hashes)"
    )
    actions = token.add_subparsers(dest="token_action", required=True, metavar="ACTION")

    create = actions.add_parser(
        "create", help="make a token and print it, once (the file is made if missing)"
    )
    _credentials_option(create)
    create.add_argument("--name", required=True, help="whom it is for: shown in logs")
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--tenant", default="", help="the tenant of a client token")
    create.add_argument("--node-id", default="", help="the node id a node token is bound to")
    create.set_defaults(run=_create)

    listing = actions.add_parser("list", help="the tokens of the file (never their secrets)")
    _credentials_option(listing)
    listing.set_defaults(run=_list)

    revoke = actions.add_parser(
        "revoke", help="remove a token by id, or every token of a name (effective in ~1 s)"
    )
    _credentials_option(revoke)
    revoke.add_argument("token", metavar="ID_OR_NAME")
    revoke.add_argument(
        "--every-identity",
        action="store_true",
        help="a name shared by tokens of different roles, tenants or nodes: revoke them all",
    )
    revoke.set_defaults(run=_revoke)


def _credentials_path(args: argparse.Namespace) -> str:
    path: str | None = args.credentials or os.environ.get("KVPOOL_CREDENTIALS")
    if not path:
        raise Refused("no credentials file: give --credentials FILE or set KVPOOL_CREDENTIALS")
    return path


def _credential_errors() -> tuple[type[Exception], ...]:
    from kvpool.security.tokens import CredentialError

    return (CredentialError,)


@one_line_errors(_credential_errors)
def _create(args: argparse.Namespace) -> int:
    """The token is shown before it is stored: a token stored but never shown (its output to
    a full disk, or a closed pipe) would be valid, with a secret nobody has, and nobody told
    to revoke it. So the file is checked first (a damaged one refuses before any token is
    shown), the token written and flushed, and only then added."""
    from kvpool.security.identity import Role
    from kvpool.security.tokens import MAX_TOKENS, CredentialError, CredentialStore, new_token

    path = _credentials_path(args)
    token, record = new_token(args.name, Role(args.role), args.tenant, args.node_id)
    if os.path.exists(path):
        # (unreadable, damaged, full or not writable: refused with nothing printed, not
        # after a token was shown that is then not stored)
        existing = CredentialStore(path)
        if len(existing.records()) >= MAX_TOKENS:
            raise CredentialError(
                f"credentials file {path} holds {MAX_TOKENS} tokens, the limit: revoke the "
                "ones no longer used"
            )
        if not os.access(path, os.W_OK):
            raise CredentialError(f"credentials file {path} cannot be written: check its owner")
    try:
        print(token)
        sys.stdout.flush()
    except OutputFailed as error:
        raise Refused(
            f"{error}: no token was made (its secret could not be shown); the credentials "
            "file is unchanged",
            status=1,
        ) from None
    try:
        store, made = CredentialStore.open_or_create(path)  # (several at once: one makes it)
        if made:
            print(f"created credentials file {path}", file=sys.stderr)
        store.add(record)
    except CredentialError as error:
        raise CredentialError(
            f"{error}; the token printed was not stored: it is not valid"
        ) from None
    print(
        f"token {record.token_id} for {record.identity().describe()}: shown this once, the "
        "file keeps only its hash; keep it secret (callers read it from $KVPOOL_TOKEN, "
        "or @FILE)",
        file=sys.stderr,
    )
    return 0


def _shown_time(created: float) -> str:
    """``created`` as a local date and time; the number itself where it is none (the file
    is checked when read, but a listing must never crash on what it shows)."""
    import datetime

    try:
        return datetime.datetime.fromtimestamp(created).astimezone().isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return repr(created)


@one_line_errors(_credential_errors)
def _list(args: argparse.Namespace) -> int:
    from kvpool.security.tokens import CredentialStore

    path = _credentials_path(args)
    records = CredentialStore(path).records()
    if not records:
        print(f"no tokens in {path}", file=sys.stderr)
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "name", "role", "tenant", "node id", "created", box=None)
    for record in records:
        cells = (record.token_id, record.name, record.role.value, record.tenant, record.node_id)
        table.add_row(*map(cell, cells), _shown_time(record.created))
    Console(soft_wrap=True).print(table)
    print(f"{len(records)} token(s)", file=sys.stderr)
    return 0


@one_line_errors(_credential_errors)
def _revoke(args: argparse.Namespace) -> int:
    from kvpool.security.tokens import CredentialStore, described

    path = _credentials_path(args)
    removed = CredentialStore(path).revoke(args.token, every_identity=args.every_identity)
    if not removed:
        raise Refused(f"no token with id or name {args.token!r} in {path}: see `kvpool token list`")
    for record in removed:
        print(f"revoked {described(record)}", file=sys.stderr)
    return 0
