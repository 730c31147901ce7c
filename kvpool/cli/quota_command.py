"""``kvpool quota set/show/unset``: the per-tenant quotas of a quotas file.

Works on the file the master reads (``--quotas``, else ``$KVPOOL_QUOTAS``); a running master
picks changes up within a second or two. ``set`` changes only the quotas it is given (the
others of the tenant stay as they were; ``--objects none`` makes one unlimited again) and
makes the file when it is missing; ``--default`` instead of ``--tenant T`` sets the quota of
every tenant the file does not list. Only the master's modules that hold no state are
imported (quotas.py, quota_file.py), and only when a command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from kvpool.cli.one_line_errors import Refused, one_line_errors
from kvpool.cli.shown import cell

#: The options of ``set``: (quota, is a size).
#: The largest count or size a quota may name (what a 64-bit counter holds).
MAX_QUOTA = 2**64 - 1
QUOTA_OPTIONS = (
    ("objects", False),
    ("dram_bytes", True),
    ("nvme_bytes", True),
    ("reserved_bytes", True),
    ("leases", False),
    ("inflight", False),
    ("guaranteed_dram_bytes", True),
    ("guaranteed_nvme_bytes", True),
)


def _quotas_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quotas",
        metavar="FILE",
        default=None,
        help="the quotas file (default: $KVPOOL_QUOTAS)",
    )


def _whom(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--tenant", help="the tenant")
    group.add_argument(
        "--default", action="store_true", help="the quota of every tenant the file does not list"
    )


def add_commands(commands: Any) -> None:
    quota = commands.add_parser(
        "quota", help="set, show and unset per-tenant quotas (the master's --quotas file)"
    )
    actions = quota.add_subparsers(dest="quota_action", required=True, metavar="ACTION")

    set_ = actions.add_parser(
        "set",
        help="set quotas of a tenant (the others it has stay; effective in ~1 s)",
        description="Sets the quotas given; NUMBER or SIZE 'none' makes one unlimited again.",
    )
    _quotas_option(set_)
    _whom(set_)
    for name, size in QUOTA_OPTIONS:
        flag = "--" + name.replace("_", "-")
        if size:
            set_.add_argument(flag, metavar="SIZE", help=f"{name} (bytes, or e.g. 10GiB)")
        else:
            set_.add_argument(flag, metavar="NUMBER", help=name)
    set_.set_defaults(run=_set)

    show = actions.add_parser("show", help="the quotas of the file")
    _quotas_option(show)
    show.set_defaults(run=_show)

    unset = actions.add_parser(
        "unset", help="drop a tenant's entry (it gets the default quota again)"
    )
    _quotas_option(unset)
    unset.add_argument("--tenant", required=True)
    unset.set_defaults(run=_unset)


def _path(args: argparse.Namespace) -> str:
    path: str | None = args.quotas or os.environ.get("KVPOOL_QUOTAS")
    if not path:
        raise Refused("no quotas file: give --quotas FILE or set KVPOOL_QUOTAS")
    return path


def _value_errors() -> tuple[type[Exception], ...]:
    return (ValueError,)


def _load(path: str, *, missing_ok: bool) -> Any:
    from kvpool.master.quota_file import read_quotas
    from kvpool.master.quotas import Quotas

    if missing_ok and not os.path.exists(path):
        return Quotas()
    return read_quotas(path)


@contextlib.contextmanager
def _changing(path: str) -> Iterator[None]:
    """Held from reading the file to writing it back (``exclusive_change``, a lock beside
    it): two ``kvpool quota set`` at once must both land, not the last one alone."""
    from pathlib import Path

    from kvpool.security.file_lock import exclusive_change

    def cannot(error: OSError) -> Refused:
        return Refused(f"cannot lock quotas file {path} (its lock {path}.lock): {error.strerror}")

    with exclusive_change(Path(path), cannot):
        yield


def _save(path: str, quotas: Any) -> None:
    from pathlib import Path

    from kvpool.security.tls import write_atomically

    content = json.dumps(quotas.to_json(), indent=1).encode() + b"\n"
    try:
        write_atomically(Path(path), content, new_file_mode=0o644)
    except OSError as error:
        raise Refused(f"cannot write quotas file {path}: {error.strerror}") from None


def _value(name: str, size: bool, text: str) -> int | None:
    from kvpool.common.sizes import parse_size

    if text.strip().lower() in ("none", "unlimited"):
        return None
    if size:
        try:
            return parse_size(text)
        except ValueError as error:
            raise Refused(f"--{name.replace('_', '-')}: {error}") from None
    digits = text.strip()
    if (
        not (digits.isascii() and digits.isdigit())
        or len(digits.lstrip("0")) > len(str(MAX_QUOTA))  # (Python reads at most 4,300)
        or int(digits) > MAX_QUOTA
    ):
        raise Refused(
            f"--{name.replace('_', '-')}: {text!r} is not a whole number from 0 to {MAX_QUOTA} "
            "(or 'none': unlimited)"
        )
    return int(digits)


@one_line_errors(_value_errors)
def _set(args: argparse.Namespace) -> int:
    path = _path(args)
    changes = {
        name: _value(name, size, getattr(args, name))
        for name, size in QUOTA_OPTIONS
        if getattr(args, name) is not None
    }
    if not changes:
        raise Refused("give at least one quota to set (--objects, --dram-bytes, ...)")
    with _changing(path):
        whom = _apply(path, args, changes)
    shown = ", ".join(f"{name}={'unlimited' if v is None else v}" for name, v in changes.items())
    print(f"{whom}: {shown} (in {path})", file=sys.stderr)
    return 0


def _apply(path: str, args: argparse.Namespace, changes: dict[str, int | None]) -> str:
    """Sets ``changes`` in the file as it is now (the caller holds its lock); whose they are."""
    import dataclasses

    quotas = _load(path, missing_ok=True)
    if args.default:
        quotas = dataclasses.replace(quotas, default=dataclasses.replace(quotas.default, **changes))
        whom = "the default quota"
    else:
        quota = dataclasses.replace(quotas.of(args.tenant), **changes)
        if args.tenant not in quotas.tenants:  # a new entry: from nothing, not the default
            from kvpool.master.quotas import TenantQuota

            quota = TenantQuota(**changes)
        quotas = quotas.with_tenant(args.tenant, quota)
        whom = f"tenant {args.tenant!r}"
    _save(path, quotas)
    return whom


@one_line_errors(_value_errors)
def _show(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from kvpool.common.sizes import format_size

    path = _path(args)
    quotas = _load(path, missing_ok=False)
    headers = (
        name.replace("_bytes", "").replace("guaranteed_", "min ") for name, _ in QUOTA_OPTIONS
    )
    table = Table("tenant", *headers, box=None)
    rows = [("(default)", quotas.default)] + [
        (t, quotas.tenants[t]) for t in sorted(quotas.tenants)
    ]
    for tenant, quota in rows:
        cells = []
        for name, size in QUOTA_OPTIONS:
            value = getattr(quota, name)
            cells.append("-" if value is None else format_size(value) if size else str(value))
        table.add_row(cell(tenant), *cells)
    console = Console(soft_wrap=True)
    console.width = max(console.width, 132)  # (a row per tenant: never wrapped in a pipe)
    console.print(table)
    print(f"{len(quotas.tenants)} tenant(s) listed; '-': unlimited", file=sys.stderr)
    return 0


@one_line_errors(_value_errors)
def _unset(args: argparse.Namespace) -> int:
    path = _path(args)
    with _changing(path):
        quotas = _load(path, missing_ok=False)
        if args.tenant not in quotas.tenants:
            raise Refused(
                f"tenant {args.tenant!r} is not listed in {path}: see `kvpool quota show`"
            )
        _save(path, quotas.without_tenant(args.tenant))
    print(f"tenant {args.tenant!r} now gets the default quota", file=sys.stderr)
    return 0
