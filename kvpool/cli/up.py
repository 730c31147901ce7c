"""``kvpool up``: a master and N storage nodes on this machine until Ctrl-C.

It prints every endpoint it opened (the ports are picked free, so they cannot be guessed),
and keeps its processes' logs after it stops, in a folder it names at start and at exit:
a cluster that misbehaved is most often looked into after it was stopped.

The cluster is secure as a shared one would be: a throwaway CA signs the master's
certificate, and the tokens it makes (an admin's, a client's of tenant ``default``) are
written, with the master's address and the CA, to ``client.env`` and ``admin.env`` in the
run folder (readable by this user only): ``source`` one to talk to the cluster.
``--insecure`` runs it without.

A run folder given again (``--run-dir``, kept after exit) starts a fresh cluster there: the
throwaway CA, credentials and env files an earlier ``kvpool up`` left are replaced (they
belong to a cluster that is gone), the logs go on in the same files, and anything else in it
(an NVMe segment left by a crash) is left alone. ``kvpool-up.lock`` marks a folder as one
``kvpool up`` runs in: a second one at the same time is refused, as is a folder whose
credentials some other tool made. Errors are one ``error:`` line on stderr.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from kvpool.common import cli_numbers
from kvpool.common.memory_limit import memory_limit
from kvpool.common.sizes import format_size, parse_size
from kvpool.local_cluster import ClusterError, LocalCluster, ManagedProcess
from kvpool.security.tls import write_atomically
from kvpool.security.tokens import CredentialError

#: Kept open (locked) by the `kvpool up` that runs in a folder; marks it as one `kvpool up` made.
LOCK_FILE = "kvpool-up.lock"
#: What an earlier `kvpool up` made in its run folder for its throwaway cluster only: a new
#: run replaces it (the cluster it served is gone, and its CA may have expired).
THROWAWAY = ("credentials.json", "capability-keys.json", "client.env", "admin.env", "pki")


#: Nodes one ``kvpool up`` starts at most: each is a process with its own segment on this
#: machine.
MAX_NODES = 64


class RunDirError(Exception):
    """The run folder cannot be used; the message says why and what to do."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes",
        type=cli_numbers.integer(1, MAX_NODES),
        default=2,
        help="storage nodes to start (default 2)",
    )
    parser.add_argument(
        "--dram",
        type=_size_text(low=1),
        default="1GiB",
        help="DRAM segment per node (default 1GiB; all nodes' together at most this machine's "
        "memory)",
    )
    parser.add_argument(
        "--nvme-size",
        type=_size_text(low=1),
        default=None,
        metavar="SIZE",
        help="also give each node an NVMe-tier segment this large, a file in the run directory "
        "(removed at exit), to try tier='nvme' (default: none)",
    )
    parser.add_argument(
        "--port",
        type=cli_numbers.port(),
        default=50051,
        help="master gRPC port (default 50051; 0: free)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS and no tokens (anyone on this machine may do anything)",
    )
    parser.add_argument(
        "--run-dir",
        default=None,
        help="where the logs and ready files go, kept after exit (default: a new kvpool-up-* "
        "folder in the temporary directory)",
    )


def _size_text(*, low: int) -> Callable[[str], str]:
    """A byte size checked as argparse reads it (``cli_numbers.size``), kept as it was written:
    it is handed on to the nodes' command lines, and said back at start."""
    check = cli_numbers.size(low=low)

    def parse(text: str) -> str:
        check(text)
        return text

    return parse


def run(args: argparse.Namespace) -> int:
    memory, dram = memory_limit(), parse_size(args.dram)
    if args.nodes * dram > memory:
        return _error(
            f"--dram {args.dram} for each of --nodes {args.nodes} is "
            f"{format_size(args.nodes * dram)} in all, more than this machine's memory "
            f"({format_size(memory)}): give a smaller --dram or fewer --nodes",
            2,
        )
    try:
        # (absolute: client.env and admin.env name the CA by its path, to be sourced anywhere)
        run_dir = (
            _absolute(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="kvpool-up-"))
        )
        lock = _claim_run_dir(run_dir)
    except (OSError, RunDirError) as error:
        return _error(str(error), 1)
    try:
        return _serve(args, run_dir)
    finally:
        lock.close()


def _absolute(run_dir: str) -> Path:
    """``run_dir`` with ``~`` expanded, made absolute (links kept: the name given)."""
    try:
        expanded = Path(run_dir).expanduser()
    except RuntimeError as error:  # ("~user" of no such user, or no home folder known)
        raise RunDirError(
            f"--run-dir {run_dir}: {str(error).rstrip('.')}: give a full path"
        ) from None
    try:
        return expanded.absolute()
    except OSError as error:  # (a relative one, from a working folder removed since)
        raise RunDirError(
            f"--run-dir {run_dir}: cannot make it absolute ({error.strerror}): give a full path"
        ) from None


def _error(message: str, code: int) -> int:
    """Says ``message`` as an ``error:`` line on stderr; ``code`` is the exit status."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


def _serve(args: argparse.Namespace, run_dir: Path) -> int:
    """Starts the cluster in ``run_dir`` and serves until Ctrl-C (or a process exits)."""
    nvme_dirs = [run_dir / f"node{i}-nvme" for i in range(args.nodes)] if args.nvme_size else []
    cluster = LocalCluster(0, args.dram, port=args.port, run_dir=run_dir, secure=not args.insecure)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster.start()
        for i in range(args.nodes):
            nvme = ["--nvme", str(nvme_dirs[i]), "--nvme-size", args.nvme_size] if nvme_dirs else []
            cluster.add_node(extra=nvme)
        _write_env_files(cluster, run_dir)
    except ClusterError as error:
        _error(f"the cluster did not start:\n{error}", 1)
        _stop(cluster, run_dir, nvme_dirs)
        return 1
    except (OSError, CredentialError) as error:
        _error(f"the cluster did not start: {error}", 1)
        _stop(cluster, run_dir, nvme_dirs)
        return 1
    _announce(cluster, args, run_dir)
    left: set[str] = set()  # nodes drained (`kvpool drain`) that left: the rest serve on
    try:
        while not stop.wait(0.5):
            for node in cluster.nodes:
                if node.name not in left and _drained_and_left(node):
                    left.add(node.name)
                    print(f"{node.name} was drained and left; the others serve on", flush=True)
            watched = [cluster.master, *(n for n in cluster.nodes if n.name not in left)]
            dead = [p.name for p in watched if p and not p.alive()]
            if dead:
                return _error(f"{', '.join(dead)} exited; stopping\n{cluster.logs()}", 1)
    finally:
        print("stopping the cluster...", flush=True)
        _stop(cluster, run_dir, nvme_dirs)
    print("stopped", flush=True)
    return 0


def _claim_run_dir(run_dir: Path) -> IO[str]:
    """Makes ``run_dir`` this run's (made if missing, readable by this user only): locks its
    LOCK_FILE for as long as the file returned stays open, and clears what an earlier
    `kvpool up` left of its throwaway cluster. RunDirError when another `kvpool up` runs
    there, or when the folder holds credentials, keys or a CA (THROWAWAY) `kvpool up` did not
    make (never replaced: they may be someone's real ones); OSError when the folder cannot be
    made or written."""
    try:
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise RunDirError(f"--run-dir {run_dir} is a file, not a folder: give a folder") from None
    except OSError as error:
        raise RunDirError(
            f"cannot make the run folder {run_dir} (--run-dir): {error.strerror or error}"
        ) from None
    ours = (run_dir / LOCK_FILE).exists() or _left_by_earlier_up(run_dir)
    found = [name for name in THROWAWAY if (run_dir / name).exists()]
    if not ours and found:
        raise RunDirError(
            f"{run_dir} holds {', '.join(found)} that `kvpool up` did not make: kvpool up "
            "makes throwaway credentials and keys of its own in its run folder (--run-dir) "
            "and would replace them, so give it a new or empty folder"
        )
    lock = _lock(run_dir / LOCK_FILE)
    if ours:
        _clear_throwaway(run_dir)
    return lock


def _left_by_earlier_up(run_dir: Path) -> bool:
    """Whether ``run_dir`` is the folder of a `kvpool up` from before LOCK_FILE: its env
    files beside its throwaway CA."""
    return (run_dir / "admin.env").exists() and (run_dir / "pki" / "ca.key").exists()


def _lock(path: Path) -> IO[str]:
    """``path`` opened and locked (flock: released when this process ends, however it ends),
    with this process's id in it; RunDirError naming the holder when another has it."""
    try:
        file = open(path, "a+")  # noqa: SIM115 (held open for the whole run)
    except OSError as error:
        raise RunDirError(f"cannot use the run folder {path.parent}: {error.strerror}") from None
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = file.read().strip() or "?"
        file.close()
        raise RunDirError(
            f"another `kvpool up` (pid {holder}) runs in {path.parent}: stop it first (Ctrl-C), "
            "or give this one another --run-dir"
        ) from None
    file.truncate(0)
    file.write(f"{os.getpid()}\n")
    file.flush()
    return file


def _clear_throwaway(run_dir: Path) -> None:
    """Removes the CA, credentials and env files an earlier `kvpool up` made in ``run_dir``
    (see THROWAWAY): the new cluster makes its own, and a stale credentials file would stop
    it. Logs, the master's tombstones and NVMe segments stay."""
    for name in THROWAWAY:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


#: What a storage node logs when it leaves after a drain (storage_node/node.py): it drained,
#: or its drain's deadline passed.
DRAIN_ENDS = ("drained: leaving", "drain deadline passed: leaving")


def _drained_and_left(node: ManagedProcess) -> bool:
    """Whether ``node`` exited as a drain ends, on purpose (`kvpool drain`): with status 0,
    after logging that it leaves drained."""
    if node.alive() or node.popen.returncode != 0:
        return False
    try:
        text = node.log_path.read_text(errors="replace")
    except OSError:
        return False
    return any(end in text for end in DRAIN_ENDS)


def _announce(cluster: LocalCluster, args: argparse.Namespace, run_dir: Path) -> None:
    host = "127.0.0.1"
    lines = [
        f"kvpool master at {cluster.master_address}",
        f"  metadata lane  {host}:{cluster.lane_port}",
        f"  master HTTP    http://{host}:{cluster.master_http_port}  (/metrics /healthz /readyz)",
    ]
    for node in cluster.nodes:
        lines.append(f"  {node.name} HTTP     http://{host}:{node.ready['http_port']}")
    tiers = f"{args.dram} DRAM" + (f" + {args.nvme_size} NVMe" if args.nvme_size else "")
    lines += [
        f"  {args.nodes} node(s) with {tiers} each",
        f"  logs in {run_dir} (kept after exit)",
        *(
            [
                f"  a client of tenant 'default': source {run_dir / 'client.env'}; "
                "kvpool put hello --value world; kvpool get hello",
                f"  the admin: source {run_dir / 'admin.env'}; kvpool status",
            ]
            if cluster.secure
            else [
                "  INSECURE (--insecure): no TLS, no tokens",
                f"  try: export KVPOOL_MASTER={cluster.master_address}; kvpool status",
            ]
        ),
        "  Ctrl-C stops the cluster",
    ]
    print("\n".join(lines), flush=True)


def _write_env_files(cluster: LocalCluster, run_dir: Path) -> None:
    """client.env and admin.env: what a shell needs to reach the cluster (0600: tokens)."""
    for name, env in (("client.env", cluster.client_env()), ("admin.env", cluster.admin_env())):
        lines = [f"export KVPOOL_MASTER={cluster.master_address}"]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
        write_atomically(run_dir / name, ("\n".join(lines) + "\n").encode())


def _stop(cluster: LocalCluster, run_dir: Path, nvme_dirs: list[Path]) -> None:
    """Stops every process; removes the NVMe segments this run gave its nodes (--nvme-size:
    removed at exit), keeps the logs. Other NVMe folders in ``run_dir`` (an earlier run's,
    left by a crash) are not this run's to remove."""
    cluster.stop()
    for nvme in nvme_dirs:
        shutil.rmtree(nvme, ignore_errors=True)
    print(f"logs kept in {run_dir}", flush=True)
