"""``python -m bench.checked_stream_micro``: the checked stream alone, node and client in two
processes on this host: how long one call of ``--count`` x ``--size`` gets or puts takes.

No master, no UCX: the transport's own cost per call (transport/checked_stream.py and
storage_node/checked_server.py), to cut it without a cluster. ``--profile client`` (or
``server``) prints that side's cProfile, sorted by own time. Prints one JSON line: the
median, the 10th and the 90th percentile in microseconds per call, for get and put.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import json
import mmap
import multiprocessing
import pstats
import statistics
import time
from dataclasses import dataclass

from kvpool.security import capabilities as caps

SEGMENT = "bench/dram0"
SECRET = bytes(range(32))


@dataclass
class _Segment:
    segment_id: str
    memory: mmap.mmap

    @property
    def size(self) -> int:
        return len(self.memory)


def _serve(port_out: multiprocessing.Queue, stop: multiprocessing.Event, profile: bool) -> None:  # type: ignore[type-arg]
    from kvpool.storage_node.checked_server import CheckedServer, NodeKeys

    ring = caps.KeyRing([(1, SECRET)], current=1)
    keys = NodeKeys(ring, 0, 1000)
    segment = _Segment(SEGMENT, mmap.mmap(-1, 64 << 20))
    server = CheckedServer([segment], lambda: keys, host="127.0.0.1")  # type: ignore[list-item]
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        import threading

        threading.setprofile(lambda *_: None)  # (replaced below on the connection threads)
        original = server._serve

        def profiled(connection):  # type: ignore[no-untyped-def]
            profiler.enable()
            try:
                original(connection)
            finally:
                profiler.disable()

        server._serve = profiled  # type: ignore[method-assign]
    server.start()
    port_out.put(server.port)
    stop.wait()
    server.stop()
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", choices=["client", "server"], default=None)
    args = parser.parse_args()

    from kvpool.transport.checked_stream import CheckedStreams, Job

    context = multiprocessing.get_context("spawn")
    port_out: multiprocessing.Queue = context.Queue()  # type: ignore[type-arg]
    stop = context.Event()
    server = context.Process(target=_serve, args=(port_out, stop, args.profile == "server"))
    server.start()
    port = port_out.get(timeout=30)
    ring = caps.KeyRing([(1, SECRET)], current=1)
    buffer = ctypes.create_string_buffer(args.count * args.size)
    base = ctypes.addressof(buffer)

    def jobs() -> list[Job]:
        expiry_ms = int((time.time() + 60) * 1000)
        return [
            Job(
                f"127.0.0.1:{port}",
                ring.grant(
                    segment_id=SEGMENT,
                    offset=i * args.size,
                    length=args.size,
                    rights=caps.Rights.READ | caps.Rights.WRITE,
                    expiry_ms=expiry_ms,
                    term=0,
                    tenant="bench",
                    grant_id=1,
                ),
                i * args.size,
                args.size,
                base + i * args.size,
            )
            for i in range(args.count)
        ]

    streams = CheckedStreams()
    batch = jobs()
    profiler = cProfile.Profile() if args.profile == "client" else None
    figures: dict[str, list[float]] = {"get": [], "put": []}
    try:
        for _ in range(50):  # warm
            streams.run(batch, is_get=False, deadline=time.monotonic() + 10)
        for i in range(args.calls):
            op = "get" if i % 2 else "put"  # (alternated: the machine's load moves)
            if profiler is not None:
                profiler.enable()
            began = time.perf_counter()
            results = streams.run(batch, is_get=op == "get", deadline=time.monotonic() + 10)
            figures[op].append((time.perf_counter() - began) * 1e6)
            if profiler is not None:
                profiler.disable()
            assert all(r.outcome.value == "ok" for r in results), results
    finally:
        streams.close()
        stop.set()
        server.join(30)
    out = {}
    for op, values in figures.items():
        deciles = statistics.quantiles(values, n=10)
        out[op] = {
            "median_us": round(statistics.median(values), 1),
            "p10_us": round(deciles[0], 1),
            "p90_us": round(deciles[-1], 1),
        }
    print(json.dumps({"count": args.count, "size": args.size, **out}))
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
