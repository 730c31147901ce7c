"""``kvpool bench --metadata``: master round trips per second for key-only batches.

Measures ``Exists`` (what an inference engine's prefix lookup does) and ``GetReplicas`` (the
lookup half of a get, without moving bytes) for batches of 1, 32 and 256 keys, from one
client, in keys per second.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from kvpool.proto import master_pb2 as pb

BATCHES = (1, 32, 256)
KEYS = 4096


@dataclass
class MetadataResult:
    call: str
    batch: int
    calls_per_s: float
    keys_per_s: float
    p50_us: float


def measure(master: str, seconds: float = 2.0) -> list[MetadataResult]:
    from kvpool import Client

    results = []
    with Client(master, timeout=30) as client:
        prefix = f"meta/{uuid.uuid4().hex[:8]}/"
        keys = [f"{prefix}{i:06d}" for i in range(KEYS)]
        for start in range(0, KEYS, 512):
            client.put_many([(k, b"x") for k in keys[start : start + 512]])
        link = client._session.link  # the bare master call: no transfer, no Python wrapping
        for call in ("Exists", "GetReplicas"):
            request_type = getattr(pb, f"{call}Request")
            for batch in BATCHES:
                requests = [
                    request_type(client_id=client.client_id, keys=keys[i : i + batch])
                    for i in range(0, KEYS - batch + 1, batch)
                ]
                latencies = []
                end = time.perf_counter() + seconds
                i = 0
                while time.perf_counter() < end:
                    start = time.perf_counter()
                    link.call(call, requests[i % len(requests)], time.monotonic() + 10)
                    latencies.append(time.perf_counter() - start)
                    i += 1
                total = sum(latencies)
                latencies.sort()
                results.append(
                    MetadataResult(
                        call,
                        batch,
                        len(latencies) / total,
                        len(latencies) * batch / total,
                        latencies[len(latencies) // 2] * 1e6,
                    )
                )
        client.remove_prefix(prefix, force=True)
    return results


def report(results: list[MetadataResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="kvpool master: key-only batches from one client")
    for column in ("call", "batch", "calls/s", "keys/s", "p50 µs"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.call,
            str(r.batch),
            f"{r.calls_per_s:,.0f}",
            f"{r.keys_per_s:,.0f}",
            f"{r.p50_us:,.0f}",
        )
    Console().print(table)
