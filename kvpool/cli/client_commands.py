"""``kvpool put/get/ls/rm/status/bench``: the cluster from a shell.

``kvpool bench`` runs the benchmark harness of the source checkout (bench/, not installed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpool.cli.one_line_errors import OutputFailed, guarded_stdout, output_failed
from kvpool.cli.shown import cell, line, message, printable
from kvpool.common import cli_numbers
from kvpool.common.file_writes import write_all
from kvpool.common.keys import shown_key
from kvpool.common.sizes import format_size
from kvpool.errors import InvalidArgument, InvalidKey, KVPoolError, ObjectHasLease


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default=None, help="master HOST:PORT (default: $KVPOOL_MASTER)")
    parser.add_argument(
        "--timeout",
        type=cli_numbers.seconds(0),
        default=10.0,
        help="seconds per call (default 10)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="token, or @FILE holding it (default: $KVPOOL_TOKEN, or the file "
        "$KVPOOL_TOKEN_FILE); with a client's, `kvpool status` shows totals only (an admin's "
        "shows nodes and segments), and `kvpool drain` needs an admin's",
    )
    parser.add_argument(
        "--tls-ca", default=None, help="CA of the master's certificate (default: $KVPOOL_TLS_CA)"
    )
    parser.add_argument("--tls-cert", default=None, help="client certificate ($KVPOOL_TLS_CERT)")
    parser.add_argument("--tls-key", default=None, help="its private key ($KVPOOL_TLS_KEY)")


def add_commands(commands: Any) -> None:
    put = commands.add_parser("put", help="store a file, stdin or a string under a key")
    _client_options(put)
    put.add_argument("key")
    source = put.add_mutually_exclusive_group()
    source.add_argument("file", nargs="?", help="file to store ('-' or nothing: stdin)")
    source.add_argument("--value", help="store this string (UTF-8) instead of a file")
    put.add_argument(
        "--replicas",
        type=_replica_count,
        default=None,
        metavar="N",
        help="copies on distinct storage nodes, at least 1 (default: the master's "
        "--default-replicas); puts are best effort: where fewer nodes have room, fewer are "
        "stored, and the command says how many",
    )
    put.set_defaults(run=_with_client(_put))

    get = commands.add_parser("get", help="print an object (or write it to a file)")
    _client_options(get)
    get.add_argument("key")
    get.add_argument("-o", "--output", help="write here instead of stdout")
    get.set_defaults(run=_with_client(_get))

    ls = commands.add_parser("ls", help="list keys")
    _client_options(ls)
    ls.add_argument("--prefix", default="", help="only keys starting with this")
    ls.add_argument(
        "--limit",
        type=cli_numbers.integer(0, 2**32 - 1),
        default=0,
        help="at most this many keys (0: all)",
    )
    ls.set_defaults(run=_with_client(_ls))

    rm = commands.add_parser("rm", help="remove objects by key, by prefix, or all")
    _client_options(rm)
    rm.add_argument("keys", nargs="*")
    what = rm.add_mutually_exclusive_group()
    what.add_argument("--prefix", help="remove every object whose key starts with this")
    what.add_argument("--all", action="store_true", help="remove every object")
    rm.add_argument(
        "--force", action="store_true", help="remove even while leased or being written"
    )
    rm.set_defaults(run=_with_client(_rm))

    stat = commands.add_parser("stat", help="size, state, replicas, lease and pin of an object")
    _client_options(stat)
    stat.add_argument("key")
    stat.set_defaults(run=_with_client(_stat))

    story = commands.add_parser("story", help="what happened to a key lately, event by event")
    _client_options(story)
    story.add_argument("key")
    story.set_defaults(run=_with_client(_story))

    status = commands.add_parser("status", help="nodes, segments and their use")
    _client_options(status)
    status.set_defaults(run=_with_client(_status))

    # The harness (bench/) is not installed: it ships with the source checkout. Its arguments
    # are parsed by the harness itself (main() hands it the rest of the command line), so that
    # `kvpool --help` and every other command start without it.
    bench = commands.add_parser(
        "bench",
        help="measure put/get throughput of --master, else $KVPOOL_MASTER, else of a local "
        "cluster it starts (source checkout only)",
        add_help=False,
    )
    bench.set_defaults(run=_bench, forward_rest=True)


NO_HARNESS = (
    "kvpool bench: the benchmark harness ships with kvpool's source checkout, not with the "
    "installed package; clone the repository and run `python -m bench.throughput` from its "
    "root (or `pip install -e .` there, then `kvpool bench`)"
)


def _checkout() -> Path:
    """The source checkout of an editable install (``pip install -e .``): the folder above the
    ``kvpool`` package. For an installed wheel this is site-packages, which has no bench/."""
    import kvpool

    return Path(kvpool.__file__).resolve().parent.parent


def _bench(args: argparse.Namespace) -> int:
    checkout = _checkout()
    if not (checkout / "bench" / "throughput.py").is_file():
        if {"-h", "--help"} & set(args.rest):
            print(f"usage: kvpool bench [options]\n\n{NO_HARNESS}")
            return 0
        print(f"error: {NO_HARNESS}", file=sys.stderr)
        return 2
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    from bench import throughput

    return throughput.main(args.rest, prog="kvpool bench")


def _replica_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of copies, got {text!r}"
        ) from None
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"must be at least 1 (copies on distinct storage nodes), got {count}; leave it out "
            "for the master's --default-replicas"
        )
    return count


#: UCX settings of the one-shot client commands (the user's own UCX_* settings win). Memory
#: events feed UCX's registration cache, which a command moving one object has no use for,
#: and hooking them in costs every command a large share of its run time on some machines.
ONE_SHOT_UCX = {"UCX_MEM_EVENTS": "no"}


def _with_client(command: Callable[[Any, argparse.Namespace], int]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        for name, value in ONE_SHOT_UCX.items():
            os.environ.setdefault(name, value)  # before UCX loads, with the client
        from kvpool import Client

        try:
            with (
                Client(
                    args.master,
                    timeout=args.timeout,
                    token=args.token,
                    tls_ca=args.tls_ca,
                    tls_cert=args.tls_cert,
                    tls_key=args.tls_key,
                ) as client,
                guarded_stdout(),
            ):  # (flushed inside: a late failure is reported too)
                return command(client, args)
        except OutputFailed as error:  # (a reader that left, as `head` does: quietly)
            return output_failed(error)
        except (InvalidArgument, InvalidKey) as error:  # bad input, as argparse's own: 2
            print(f"error: {message(error)}", file=sys.stderr)
            return 2
        except KVPoolError as error:  # (its message may quote the master's, which may be odd)
            print(f"error: {message(error)}", file=sys.stderr)
            return 1
        except BrokenPipeError:  # (the output went to a reader that stopped, as `head` does)
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        except Exception as error:  # a bug: one line, not a traceback from deep inside
            print(
                f"error: {type(error).__name__}: {message(error)} (unexpected: please report it)",
                file=sys.stderr,
            )
            return 1

    return run


#: Bytes read at a time from a stream (standard input, a named pipe): its size is not known.
READ_CHUNK = 1 << 20


class _Unreadable(Exception):
    """What ``kvpool put`` was to store cannot be read: the message says why, and what to do."""


def _put(client: Any, args: argparse.Namespace) -> int:
    data: bytes | bytearray
    if args.value is not None:
        data = os.fsencode(args.value)  # (the bytes given, whatever the locale's encoding)
    else:
        try:
            data = _source_bytes(client, args.file)
        except _Unreadable as error:
            print(f"error: {message(error)}", file=sys.stderr)
            return 1
    stored = client.put(args.key, data, replicas=args.replicas)
    what = format_size(len(data))
    if args.replicas is not None and stored < args.replicas:
        what += (
            f", {stored} of {args.replicas} replicas: puts are best effort, and only {stored} "
            f"storage node{'s' if stored > 1 else ''} took it"
        )
    print(f"stored {shown_key(args.key)} ({what})", file=sys.stderr)
    return 0


def _source_bytes(client: Any, file: str | None) -> bytes | bytearray:
    """The bytes of ``file``, or of standard input (``-`` or none). A regular file is read
    whole: its size is known. A stream (standard input, a named pipe) has no size until it
    ends, and one may never end (``< /dev/zero``): it is read up to the largest object the
    cluster could store, and refused past it, not read until memory runs out. Any other path
    (a device, a socket) is refused before it is read: ``/dev/zero`` never ends."""
    what = "standard input" if file in (None, "-") else file
    try:
        if file in (None, "-"):
            if sys.stdin is None:  # (started with it closed: `kvpool put KEY <&-`)
                raise _Unreadable("standard input is closed: give a FILE to store, or --value TEXT")
            if stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):  # (`< FILE`)
                return sys.stdin.buffer.read()
            return _stream_bytes(sys.stdin.fileno(), what, _largest_object(client))
        kind = stat.S_IFMT(os.stat(file).st_mode)
        if kind == stat.S_IFREG:
            return Path(file).read_bytes()
        if kind != stat.S_IFIFO:
            device = kind in (stat.S_IFCHR, stat.S_IFBLK)
            raise _Unreadable(
                f"{file} is {_KINDS.get(kind, 'not a regular file')}, not a file: give a "
                "regular file, or standard input"
                + (f" (part of a device: `head -c SIZE {file} | kvpool put KEY`)" if device else "")
            )
        descriptor = os.open(file, os.O_RDONLY)
        try:
            return _stream_bytes(descriptor, what, _largest_object(client))
        finally:
            os.close(descriptor)
    except OSError as error:
        raise _Unreadable(f"cannot read {what}: {error.strerror or error}") from None
    except MemoryError:
        raise _Unreadable(
            f"not enough memory to hold {what}: kvpool put holds an object whole in memory; "
            "store it from a machine with more memory, or split it into several keys"
        ) from None


#: What a path is, by its type, for a refusal (``stat.S_IFMT``).
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _largest_object(client: Any) -> int:
    """The most bytes one object may have on this cluster: an object's copy lies in one
    segment, so what its largest segment holds (a tenant's client sees a tier's segments
    summed: what its largest tier holds, a looser bound). A stream longer than that could
    never be stored, so it is read no further."""
    status = client.cluster_status()
    return max((segment.capacity for segment in status.segments), default=0)


def _stream_bytes(descriptor: int, what: str, limit: int) -> bytearray:
    """All of a stream, or ``_Unreadable`` once it holds more than ``limit`` bytes."""
    data = bytearray()
    while True:
        chunk = os.read(descriptor, min(READ_CHUNK, limit + 1 - len(data)))
        if not chunk:
            return data
        data += chunk
        if len(data) > limit:
            if not limit:
                raise _Unreadable(
                    "the cluster has no storage yet (no storage node has joined it): nothing "
                    "was stored; start a node, then put again"
                )
            raise _Unreadable(
                f"{what} holds more than {format_size(limit)}, the most this cluster's "
                "storage could hold as one object: nothing was stored; store less (e.g. "
                "`head -c SIZE`), or add storage to the cluster"
            )


def _get(client: Any, args: argparse.Namespace) -> int:
    data = client.get(args.key)
    # (through the descriptor, every byte or an error: a buffered write that fails part way,
    # on a full disk or a pipe whose reader left, returns a short count instead of raising,
    # and the get would end with its output cut short, and exit 0)
    opened = False  # (a file this get truncated holds none of what was there: no use)
    try:
        if args.output:
            with open(args.output, "wb") as out:
                opened = True
                write_all(out.fileno(), data)
        else:
            sys.stdout.flush()
            write_all(sys.stdout.fileno(), data)
    except BrokenPipeError:
        raise  # (its reader stopped, as `head` does: see _with_client)
    except OSError as error:
        where = args.output or "standard output"
        print(f"error: cannot write {where}: {error.strerror or error}", file=sys.stderr)
        # (part of the object: removed; never a file that could not even be opened, a
        # running program's, a read-only one, which this get never touched)
        if opened and os.path.isfile(args.output):
            with contextlib.suppress(OSError):
                os.unlink(args.output)
        return 1
    return 0


def _ls(client: Any, args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table("key", "size", box=None)
    shown = 0
    start_after = ""
    while True:
        page = client.list_keys(args.prefix, start_after=start_after)
        for key, size in zip(page.keys, page.sizes, strict=True):
            if args.limit and shown >= args.limit:
                break
            table.add_row(cell(key), format_size(size))  # (keys are data, never markup)
            shown += 1
        if not page.next_start_after or (args.limit and shown >= args.limit):
            break
        if page.next_start_after <= start_after:  # (pages go forward: else it never ends)
            print(
                f"error: the master's listing went back (from {start_after!r} to "
                f"{page.next_start_after!r}): stopped after {shown} key(s)",
                file=sys.stderr,
            )
            Console().print(table)
            return 1
        start_after = page.next_start_after
    Console().print(table)
    print(f"{shown} key(s)", file=sys.stderr)
    return 0


def _rm(client: Any, args: argparse.Namespace) -> int:
    if args.prefix is not None or args.all:
        if args.keys:
            print("error: give keys, or --prefix, or --all; not both", file=sys.stderr)
            return 2
        if args.prefix == "":
            print(
                "error: an empty --prefix would remove everything: pass --all for that",
                file=sys.stderr,
            )
            return 2
        if args.all:
            result = client.remove_all(force=args.force)
        else:
            result = client.remove_prefix(args.prefix, force=args.force)
        print(f"removed {result.removed} object(s)", file=sys.stderr)
        kept = []
        if result.leased:
            kept.append(f"{result.leased} leased by readers")
        if result.not_ready:
            kept.append(f"{result.not_ready} being written")
        if kept:
            print(f"kept {', '.join(kept)}: retry later or pass --force", file=sys.stderr)
            return 1  # (documented: not everything asked for was removed)
        return 0
    if not args.keys:
        print("error: name the keys to remove, or pass --prefix or --all", file=sys.stderr)
        return 2
    failed = 0
    for key, result in zip(args.keys, client.remove_many(args.keys, force=args.force), strict=True):
        if result is None:
            print(f"removed {key!r}", file=sys.stderr)
        elif isinstance(result, ObjectHasLease):
            print(
                f"error: object {key!r} is leased by a reader: retry once its lease ends, or "
                "pass --force (its space is still kept until the lease ends)",
                file=sys.stderr,
            )
            failed += 1
        else:
            print(f"error: {message(result)}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _status(client: Any, args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    status = client.cluster_status()
    console = Console()
    # A client of one tenant gets use per tier summed, no segment, and no count of objects
    # per tier (which would be every tenant's): its rows name no node.
    per_segment = any(s.node_id for s in status.segments)
    if per_segment:
        console.print(_segment_table(status))
    columns = ("tier", "segments", "used", "capacity", "use")
    tiers = Table(*columns, "objects") if per_segment else Table(*columns)
    for wire_tier, name in ((1, "dram"), (2, "nvme")):
        segments = [s for s in status.segments if s.tier == wire_tier]
        if segments:
            used = sum(s.used for s in segments)
            capacity = sum(s.capacity for s in segments)
            row = [
                name,
                str(len(segments)) if per_segment else "-",
                format_size(used),
                format_size(capacity),
                f"{100 * used / capacity:.1f}%" if capacity else "-",
            ]
            if per_segment:
                row.append(str(sum(s.objects for s in segments)))
            tiers.add_row(*row)
    console.print(tiers)
    used = sum(s.used for s in status.segments)
    capacity = sum(s.capacity for s in status.segments)
    whose = "" if per_segment else " of this tenant"
    console.print(
        line(
            f"master {printable(client.master)}: {status.nodes} node(s), {status.objects} "
            f"object(s){whose}, {status.reservations} being written, {format_size(used)} of "
            f"{format_size(capacity)} used, up {status.uptime_s:.0f}s"
        )
    )
    if status.clients_refused:
        console.print(line(f"clients refused (they retry): {printable(status.clients_refused)}"))
    return 0


def _segment_table(status: Any) -> Any:
    from rich.table import Table

    table = Table("segment", "node", "host", "tier", "used", "capacity", "use", "objects")
    for s in sorted(status.segments, key=lambda s: s.segment_id):
        use = f"{100 * s.used / s.capacity:.1f}%" if s.capacity else "-"
        tier = {1: "dram", 2: "nvme"}.get(s.tier, "?")
        table.add_row(  # (what nodes call themselves: data, never markup)
            cell(s.segment_id),
            cell(s.node_id),
            cell(s.host),
            tier,
            format_size(s.used),
            format_size(s.capacity),
            use,
            str(s.objects),
        )
    return table


def _stat(client: Any, args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    info = client.stat(args.key)
    pins = {0: "none", 1: "soft", 2: "hard"}
    tiers = {1: "dram", 2: "nvme"}
    console = Console()
    console.print(line(f"key      {printable(args.key)}"))
    console.print(line(f"size     {format_size(info.size)} ({info.size} bytes)"))
    console.print(line(f"state    {printable(info.state)}"))
    console.print(line(f"lease    {info.lease_remaining_ms / 1000:.1f}s left"))
    pin = pins.get(info.pin, "?")
    if info.pin == 1:
        pin += f" ({info.pin_remaining_ms / 1000:.0f}s left)"
    console.print(line(f"pin      {pin}"))
    console.print(line(f"crc32c    {'-' if info.crc32c is None else f'{info.crc32c:#010x}'}"))
    console.print(line(f"age      {info.age_ms / 1000:.1f}s, idle {info.idle_ms / 1000:.1f}s"))
    table = Table("replica", "segment", "node", "host", "tier", "address")
    for i, replica in enumerate(info.replicas):
        table.add_row(
            str(i),
            cell(replica.segment_id),
            cell(replica.node_id),
            cell(replica.host),
            tiers.get(replica.tier, "?"),
            f"{replica.address:#x}",
        )
    console.print(table)
    return 0


def _story(client: Any, args: argparse.Namespace) -> int:
    import time
    from datetime import datetime

    from rich.console import Console
    from rich.table import Table

    events = client.story(args.key)
    if not events:
        print(
            f"error: the master has no story of {shown_key(args.key)}: it never saw that key, "
            "or no longer remembers it (it keeps the recent events of a bounded number of keys, "
            "and forgets them all when it restarts)",
            file=sys.stderr,
        )
        return 1
    now = time.time()  # the master's clock is its own: events come with their age
    table = Table("time", "ago", "event", "details")
    for event in events:
        at = datetime.fromtimestamp(now - event.age_s).isoformat(" ", timespec="milliseconds")
        names = sorted(event.details, key=lambda name: (name != "put_id", name))
        details = "  ".join(f"{printable(name)}={printable(event.details[name])}" for name in names)
        table.add_row(at, f"{event.age_s:.1f}s", cell(event.event), line(details))
    Console().print(table)
    return 0
