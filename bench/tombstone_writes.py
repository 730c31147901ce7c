"""``python -m bench.tombstone_writes``: what the masters' tombstone records cost etcd.

While a node is away, each removal of an object it held adds a tombstone to its segment's
durable record, and each Forget answered late takes one off; the leader writes the record to
etcd before it answers (master/tombstone_store.py). etcd keeps every revision inside its
compaction window and its recent raft entries in memory, so what it holds grows with the bytes
written, not with the records' size. This measures it: a fresh etcd (plain HTTP on loopback,
compaction every 5 minutes as the tests' and the chart's etcd), one segment's record of
``--keys`` keys, then ``--changes`` changes, each one key removed and one added (the record
keeps its size), each written before the next, as a leader writes them:

- ``pieces``: through ``TombstoneStore`` (the record in pieces, only the changed ones put);
- ``whole``: the record written whole at every change, as masters before the pieces did.

Prints a table: bytes put into etcd, per change, milliseconds a write took (median), and
etcd's resident memory before and after (``VmRSS``, sampled every ``--sample-every`` changes;
the peak is shown).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.processes import resident_mib
from kvpool.etcd_process import EtcdProcess
from kvpool.master.tombstone_format import encode, whole_key
from kvpool.master.tombstone_store import TombstoneStore
from kvpool.master.tombstones import DurableRecord
from kvpool.security.etcd_tls import etcd_client

PREFIX = b"kvpool/bench"
LEADER_KEY = PREFIX + b"/leader"
ME = "127.0.0.1:50051"
SEGMENT = "node0/dram-0"


async def measure(layout: str, keys: int, changes: int, sample_every: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvpool-tombstones-") as directory:
        etcd = EtcdProcess(Path(directory) / "etcd").start()  # (its log beside: inside)
        try:
            assert etcd.process is not None
            pid = etcd.process.pid
            async with etcd_client(etcd.url, None, timeout=10) as client:
                await client.put(LEADER_KEY, ME.encode())
                record = {f"team/prompt-{i:08d}": 1 for i in range(keys)}
                store = TombstoneStore(lambda: client, PREFIX, LEADER_KEY, lambda: ME)
                store.begin(lambda _: DurableRecord(False, dict(record)))
                whole_bytes = 0

                async def write() -> None:
                    nonlocal whole_bytes
                    if layout == "pieces":
                        outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                        store.write({SEGMENT}, outcome.set_result)
                        if not await asyncio.wait_for(outcome, 10):
                            raise RuntimeError("the store could not write")
                        return
                    key = whole_key(PREFIX, SEGMENT)
                    value = encode(DurableRecord(False, record), time.time())
                    whole_bytes += len(key) + len(value)
                    await asyncio.wait_for(client.put(key, value), 10)

                await write()
                start_bytes = store.bytes_put + whole_bytes
                samples = [resident_mib(pid)]
                durations: list[float] = []
                for change in range(changes):
                    del record[f"team/prompt-{change:08d}"]
                    record[f"team/prompt-{keys + change:08d}"] = 2
                    began = time.perf_counter()
                    await write()
                    durations.append(time.perf_counter() - began)
                    if (change + 1) % sample_every == 0:
                        samples.append(resident_mib(pid))
                samples.append(resident_mib(pid))
                store.end()
                put = store.bytes_put + whole_bytes - start_bytes
        finally:
            etcd.close()
    return {
        "layout": layout,
        "bytes": put,
        "per_change": put / changes,
        "write_ms": statistics.median(durations) * 1000,
        "rss_start": samples[0],
        "rss_peak": max(samples),
        "rss_end": samples[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=4000, help="keys in the record (<= 4096)")
    parser.add_argument("--changes", type=int, default=3000)
    parser.add_argument("--layout", choices=["pieces", "whole", "both"], default="both")
    parser.add_argument("--sample-every", type=int, default=250)
    args = parser.parse_args()
    layouts = ["pieces", "whole"] if args.layout == "both" else [args.layout]
    rows = [
        asyncio.run(measure(layout, args.keys, args.changes, args.sample_every))
        for layout in layouts
    ]
    table = Table(title=f"a record of {args.keys} keys, {args.changes} changes")
    for column in (
        "layout",
        "put into etcd",
        "per change",
        "write (median)",
        "etcd RSS before",
        "peak",
        "after",
    ):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for row in rows:
        table.add_row(
            row["layout"],
            f"{row['bytes'] / 2**20:,.1f} MiB",
            f"{row['per_change'] / 1024:,.1f} KiB",
            f"{row['write_ms']:.2f} ms",
            f"{row['rss_start']:.0f} MiB",
            f"{row['rss_peak']:.0f} MiB",
            f"{row['rss_end']:.0f} MiB",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
