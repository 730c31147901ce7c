"""``kvpool bench --nvme-disk``: the NVMe tier against the disk under it.

An NVMe tier is chosen for capacity at disk speed, so its figures only mean something next to
what the same file system gives a plain program: ``dd`` with direct I/O (8 MiB blocks, no page
cache) writing and reading a file in the directory the segment lives in, measured in every
round beside kvpool, so both see the same machine state.

A local cluster (one master, ``--nodes`` nodes, each with an NVMe segment in ``--nvme-dir``,
else a temporary directory) is measured in ``--runs`` rounds. Each round: ``dd`` write and
read; then for every object size, puts into the NVMe tier one at a time, from ``--in-flight``
client threads at once, and in ``put_many`` batches of ``--batch`` from as many threads
(several batches in flight, as LMCache issues them); then gets of the last objects put,
twice: after the segment files' pages are dropped with ``posix_fadvise(DONTNEED)`` (cold,
from the disk), then again (warm, from the page cache). Every put returns only once its
bytes and index record are on the disk; every get is checked for the object it is (a byte
per page), and the last one byte for byte. The table gives each figure's median over the
rounds, its spread (min-max) and its share of the median ``dd`` figure of the same
direction.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvpool.common.sizes import format_size, parse_size

#: ``dd``'s block: 8 MiB, as the issue measured the disk.
DD_BLOCK = 8 << 20
#: Bytes ``dd`` moves per direction and round.
DD_BYTES = 1 << 30
#: A put_many batch carries at most this many bytes (32 MiB objects go two by two).
BATCH_BYTES = 64 << 20
#: Read lease of the gets (s): long enough for a loaded machine's transfers; a removed
#: object's space returns when its last lease ends (puts take none).
LEASE = 10.0


@dataclass
class Row:
    workload: str  # "put", "put xT threads", "put_many xB, T threads", "get cold", "get warm"
    size: int
    in_flight: int  # puts or gets under way at once
    gbps: list[float] = field(default_factory=list)  # one per round
    p50_ms: list[float] = field(default_factory=list)  # per call, one per round
    direction: str = "write"  # which dd figure it is compared with


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "--nvme-disk (the NVMe tier against dd on its file system; bench/nvme_disk.py)"
    )
    group.add_argument(
        "--nvme-disk",
        action="store_true",
        help="measure NVMe puts (one at a time, from several threads, in batches) and warm "
        "and cold gets of a local cluster beside dd with direct I/O in the same directory "
        "(rounds: --runs; sizes: --sizes; bytes per workload: --bytes; segment: --nvme-size)",
    )
    group.add_argument(
        "--nvme-dir",
        default=None,
        help="where the segments and dd's file go (default: a temporary directory)",
    )
    group.add_argument(
        "--in-flight", type=int, default=4, help="client threads putting at once (default 4)"
    )
    group.add_argument("--batch", type=int, default=8, help="keys per put_many (default 8)")


def run(args: argparse.Namespace) -> int:
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    per_workload = parse_size(args.bytes)
    segment = args.nvme_size or "4GiB"
    if args.in_flight < 1 or args.batch < 1 or args.runs < 1:
        raise SystemExit("bench: --in-flight, --batch and --runs must be at least 1")
    if args.master:
        raise SystemExit("bench: --nvme-disk measures a local cluster (its files): no --master")
    from kvpool.local_cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="kvpool-nvme-", dir=args.nvme_dir) as scratch:
        where = Path(scratch)
        print(f"local cluster: {args.nodes} node(s) x {segment} NVMe in {where}", flush=True)
        with LocalCluster(0, args.dram) as cluster:
            for i in range(args.nodes):
                cluster.add_node(extra=["--nvme", str(where / f"nvme{i}"), "--nvme-size", segment])
            cluster.export_client_env()
            rows, dd = _rounds(cluster.master_address, where, sizes, per_workload, args)
    _report(rows, dd, args.json)
    return 0


def _rounds(
    master: str, where: Path, sizes: list[int], per_workload: int, args: argparse.Namespace
) -> tuple[list[Row], dict[str, list[float]]]:
    from kvpool import Client

    rows: dict[tuple[str, int], Row] = {}
    dd: dict[str, list[float]] = {"write": [], "read": []}
    data_files = sorted(where.glob("nvme*/kvpool-nvme/segment.data"))
    with Client(master, timeout=120, lease_ttl=LEASE) as client:
        for round_ in range(args.runs):
            write, read = dd_direct(where / "dd.bin")
            dd["write"].append(write)
            dd["read"].append(read)
            print(f"round {round_ + 1}: dd direct write {write:.2f} GB/s, read {read:.2f} GB/s")
            for size in sizes:
                for row, gbps, p50 in _one_size(client, size, per_workload, args, data_files):
                    mine = rows.setdefault((row.workload, row.size), row)
                    mine.gbps.append(gbps)
                    mine.p50_ms.append(p50)
                    print(f"  {row.workload} {format_size(size)}: {gbps:.2f} GB/s", flush=True)
    return list(rows.values()), dd


def _one_size(
    client, size: int, per_workload: int, args: argparse.Namespace, data_files: list[Path]
) -> list[tuple[Row, float, float]]:
    import numpy as np

    threads, batch = args.in_flight, max(1, min(args.batch, BATCH_BYTES // size))
    count = max(threads * batch, per_workload // size)
    count -= count % (threads * batch)  # every thread and batch full
    slots = max(threads, batch)
    source = np.frombuffer(os.urandom(size * slots), dtype=np.uint8).copy()
    target = np.ones(size * threads, dtype=np.uint8)  # (its pages faulted in before timing)
    regions = [client.register_buffer(source), client.register_buffer(target)]
    sources = [source[i * size : (i + 1) * size] for i in range(slots)]
    targets = [target[i * size : (i + 1) * size] for i in range(threads)]
    out = []
    try:
        plans: list[tuple[str, int, int]] = [
            ("put", 1, 1),
            (f"put x{threads} threads", threads, 1),
            (f"put_many x{batch}, {threads} threads", threads, batch),
        ]
        for name, n_threads, n_batch in plans:
            keys = [f"bench-nvme/{uuid.uuid4().hex[:8]}/{i}" for i in range(count)]
            seconds, p50 = _puts(client, keys, sources, n_threads, n_batch)
            out.append((Row(name, size, n_threads * n_batch), size * count / seconds / 1e9, p50))
            if name != plans[-1][0]:
                _remove(client, keys)
        # gets of the last workload's objects: cold first (a read maps the pages it reads
        # into the node again, and pages mapped stay cached), then warm
        for name in ("get cold", "get warm"):
            if name == "get cold":
                _drop_page_cache(data_files)
            seconds, p50 = _gets(client, keys, targets, sources, batch)
            row = Row(name, size, threads, direction="read")
            out.append((row, size * count / seconds / 1e9, p50))
        _remove(client, keys)
    finally:
        for region in regions:
            client.unregister_buffer(region)
    return out


def _puts(client, keys: list[str], sources, threads: int, batch: int) -> tuple[float, float]:
    """Puts ``keys`` into the NVMe tier from ``threads`` threads, ``batch`` keys per call."""
    calls = [keys[i : i + batch] for i in range(0, len(keys), batch)]

    def put(call: list[str], thread: int) -> None:
        if batch == 1:
            client.put(call[0], sources[thread], tier="nvme")
            return
        results = client.put_many(list(zip(call, sources, strict=False)), tier="nvme")
        if results != [1] * len(call):
            raise SystemExit(f"bench: a put_many into the NVMe tier failed: {results}")

    return _threaded(calls, threads, put)


def _gets(client, keys: list[str], targets, sources, batch: int) -> tuple[float, float]:
    """Reads every key back from as many threads as there are targets, checking a sample of
    each (one byte per page: which object came back) and the last one whole."""
    import numpy as np

    def expected(key: str):
        return sources[int(key.rsplit("/", 1)[1]) % batch]

    def get(call: list[str], thread: int) -> None:
        [key] = call
        client.get_into(key, targets[thread])
        if not np.array_equal(targets[thread][::4096], expected(key)[::4096]):
            raise SystemExit(f"bench: {key} read back differs from what was put")

    timed = _threaded([[k] for k in keys], len(targets), get)
    client.get_into(keys[-1], targets[0])
    if not np.array_equal(targets[0], expected(keys[-1])):
        raise SystemExit(f"bench: {keys[-1]} read back differs from what was put")
    return timed


def _threaded(
    calls: list[list[str]], threads: int, call: Callable[[list[str], int], None]
) -> tuple[float, float]:
    """Runs ``calls`` on ``threads`` threads (call i on thread i % threads); returns the wall
    time and the median time of a call."""
    times: list[float] = []
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            for i in range(thread, len(calls), threads):
                began = time.perf_counter()
                call(calls[i], thread)
                times.append(time.perf_counter() - began)
        except BaseException as error:  # shown by the main thread
            errors.append(error)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return elapsed, statistics.median(times) * 1e3


def _remove(client, keys: list[str]) -> None:
    client.remove_many(keys, force=True)


def dd_direct(path: Path) -> tuple[float, float]:
    """GB/s of ``dd`` writing (``oflag=direct``, then one fdatasync) and reading back
    (``iflag=direct``) ``DD_BYTES`` in 8 MiB blocks at ``path``, a new file."""
    path.unlink(missing_ok=True)
    count = DD_BYTES // DD_BLOCK
    try:
        write = _dd(
            f"of={path}", "if=/dev/zero", f"count={count}", "oflag=direct", "conv=fdatasync"
        )
        read = _dd(f"if={path}", "of=/dev/null", "iflag=direct")
    finally:
        path.unlink(missing_ok=True)
    return write, read


def _dd(*operands: str) -> float:
    done = subprocess.run(
        ["dd", f"bs={DD_BLOCK}", *operands], capture_output=True, text=True, timeout=600
    )
    # "1073741824 bytes (1.1 GB, 1.0 GiB) copied, 0.61 s, 1.8 GB/s"
    found = re.search(r"^(\d+) bytes .* copied, ([\d.]+) s", done.stderr, re.MULTILINE)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"bench: dd {' '.join(operands)} failed: {done.stderr.strip()}")
    return int(found[1]) / float(found[2]) / 1e9


def _drop_page_cache(paths: list[Path]) -> None:
    """Drops the cached pages of ``paths`` (the node keeps none of a recorded object's pages
    mapped, so that they can go); says how much stayed."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # (dirty pages are not dropped; a recorded object has none)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        left = cached_bytes(path)
        if left > 1 << 20:
            print(f"  note: {format_size(left)} of {path} stayed in the page cache")


def cached_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache (mincore over a mapping that touches nothing)."""
    import mmap

    size = path.stat().st_size
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return 0
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vector = ctypes.create_string_buffer(pages)
            if libc.mincore(address, size, vector) != 0:
                return 0
            return sum(b & 1 for b in vector.raw) * mmap.PAGESIZE
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def _report(rows: list[Row], dd: dict[str, list[float]], json_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    reference = {d: statistics.median(v) for d, v in dd.items()}
    table = Table(title="NVMe tier against dd with direct I/O on the same file system")
    for column in ("workload", "object", "in flight", "GB/s", "spread", "% of dd", "p50 ms"):
        table.add_column(column, justify="right")
    for name, values in dd.items():
        table.add_row(f"dd {name} direct", "8.0 MiB", "1", *_figures(values, reference[name]), "")
    for row in rows:
        table.add_row(
            row.workload,
            format_size(row.size),
            str(row.in_flight),
            *_figures(row.gbps, reference[row.direction]),
            f"{statistics.median(row.p50_ms):.2f}",
        )
    Console().print(table)
    print(f"median of {len(dd['write'])} round(s); spread: min-max over the rounds")
    if json_path:
        with open(json_path, "w") as out:
            json.dump({"dd": dd, "rows": [asdict(r) for r in rows]}, out, indent=2)


def _figures(values: list[float], reference: float) -> tuple[str, str, str]:
    median = statistics.median(values)
    return (
        f"{median:.2f}",
        f"{min(values):.2f}-{max(values):.2f}",
        f"{100 * median / reference:.0f} %",
    )
