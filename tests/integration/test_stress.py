"""Eight client processes doing mixed puts and gets for 20 s: no wrong byte, no hang.

Nothing here measures speed (that is for the benchmarks): a busy machine only makes the run
do fewer operations, and each worker goes on past the 20 s until it did a minimum of each.
A fast machine fills the cache instead: a forced removal's space waits for the read leases on
it (kept short here), so the cluster may evict. An object missing is then allowed only as one
of those the master counted as evicted; every other error fails the test.
"""

from __future__ import annotations

import multiprocessing
import random
import time

import numpy as np
from helpers import metric

from kvpool.errors import KVPoolError, ObjectNotFound

WORKERS = 8
DURATION = 20.0
#: Each worker's minimum of puts and of gets, however slow the machine.
MIN_OPS = 15
#: Generous: on a loaded machine a call may wait long for the CPU, and a timeout would count
#: as an error. A hang is still caught: no call outlives it.
OP_TIMEOUT = 30.0
#: Read leases (s): long enough for any transfer here, short so that the space of forced
#: removals (held until the leases on it end) comes back within the run however fast the
#: machine reads (with the master's default of 10 s, a fast one filled the cluster).
LEASE_TTL = 2.0


def content_of(key: str) -> bytes:
    """Every key names its own bytes, so any process can check what it reads."""
    _, _, size, seed = key.split("/")
    return np.random.default_rng(int(seed)).bytes(int(size))


def worker(master: str, wid: int, duration: float, results) -> None:
    from kvpool import Client

    rng = random.Random(wid)
    mine: list[str] = []
    stats = {"puts": 0, "gets": 0, "mismatches": 0, "errors": 0, "missing": 0, "slowest": 0.0}
    why: dict[str, int] = {}
    with Client(master, timeout=OP_TIMEOUT, lease_ttl=LEASE_TTL) as client:
        end = time.monotonic() + duration
        while time.monotonic() < end or stats["puts"] < MIN_OPS or stats["gets"] < MIN_OPS:
            start = time.monotonic()
            try:
                roll = rng.random()
                if roll < 0.4 or not mine:
                    size = rng.choice([1, 100, 4096, 65536, 1 << 20])
                    key = f"w{wid}/{len(mine)}/{size}/{rng.getrandbits(32)}"
                    client.put(key, content_of(key))
                    mine.append(key)
                    stats["puts"] += 1
                elif roll < 0.9:
                    key = rng.choice(mine)
                    try:
                        if client.get(key) != content_of(key):
                            stats["mismatches"] += 1
                    except ObjectNotFound:
                        stats["missing"] += 1  # evicted (checked against the master's count)
                        mine.remove(key)
                    stats["gets"] += 1
                else:
                    page = client.list_keys(f"w{rng.randrange(WORKERS)}/", limit=20)
                    keys = list(page.keys)
                    for key, got in zip(keys, client.get_many(keys), strict=True):
                        if isinstance(got, bytes) and got != content_of(key):
                            stats["mismatches"] += 1
                    stats["gets"] += len(keys)
                if len(mine) > 200:
                    client.remove_many(mine[:100], force=True)
                    del mine[:100]
            except KVPoolError as error:
                stats["errors"] += 1
                what = f"{type(error).__name__}: {str(error)[:160]}"
                why[what] = why.get(what, 0) + 1
            stats["slowest"] = max(stats["slowest"], time.monotonic() - start)
    results.put((wid, {**stats, "why": why}))


def test_eight_clients_for_twenty_seconds_read_only_what_was_written(cluster_factory):
    cluster = cluster_factory(2, "512MiB")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(target=worker, args=(cluster.master_address, wid, DURATION, results))
        for wid in range(WORKERS)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + DURATION + 180  # a hang, not a slow machine, runs past it
    collected = dict(results.get(timeout=max(0.0, deadline - time.monotonic())) for _ in processes)
    for process in processes:
        process.join(timeout=10)
        assert process.exitcode == 0
    totals = {
        k: sum(s[k] for s in collected.values())
        for k in ("puts", "gets", "mismatches", "errors", "missing")
    }
    print(f"\nstress totals: {totals}")
    assert totals["mismatches"] == 0
    assert totals["errors"] == 0, [s["why"] for s in collected.values()]
    assert totals["missing"] <= metric(cluster.master_http_port, "kvpool_evictions_total")
    assert totals["puts"] >= WORKERS * MIN_OPS and totals["gets"] >= WORKERS * MIN_OPS
    # no hang: an iteration makes three calls at most, each ended by its timeout
    assert max(s["slowest"] for s in collected.values()) < 3 * OP_TIMEOUT
