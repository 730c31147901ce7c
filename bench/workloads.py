"""The client half of ``kvpool bench --compare``: one store, driven by JSON commands.

Each runner script (``kvpool_runner.py``, ``mooncake_runner.py``, ``memcpy_runner.py``) wraps
one store in the small interface below and hands it to ``serve``. ``serve`` gives it one
registered arena (a source half filled with random bytes, a destination half), then reads one
JSON command per line on stdin and answers each with one line ``@@ {json}`` on stdout (other
output, such as a library's logging, is ignored by the orchestrator).

A phase moves ``count`` objects of ``size`` bytes, ``batch`` keys per call, key ``i`` from
source slot ``i % slots`` and into destination slot ``i % slots``; with ``seconds`` it stops
at the first call that ends past that time. Times are ``time.monotonic()``: one clock for every
process on the machine, so that concurrent clients can start together (``start_at``) and their
aggregate can be taken from the earliest start to the latest end.

Calls in flight (``threads`` > 1 in a put or get command): the batches are handed out in key
order, one at a time, to ``threads`` threads sharing the store (``mode`` "threads"), or to as
many coroutines awaiting the store's ``aput``/``aget`` (``mode`` "asyncio", for a store that
has them). A worker takes no new batch once the time is up, so the batches done are always the
first ones, and a get phase can read exactly what its put phase stored.

Standard library and numpy only: this module also runs in Mooncake's virtualenv.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

#: Bytes of each half of the arena (source, destination): the largest batch must fit.
HALF = 64 * 1024 * 1024
PREFIX = "@@ "


class Store(Protocol):
    """What a runner must provide. ``views`` are numpy slices of the arena and ``addresses``
    their addresses, both computed before the clock starts. Failures raise."""

    def register(self, arena: np.ndarray) -> None: ...
    def put(self, keys: list[str], views: list[np.ndarray], addresses: list[int]) -> None: ...
    def get(self, keys: list[str], views: list[np.ndarray], addresses: list[int]) -> None: ...
    def exists(self, keys: list[str]) -> int: ...  # how many exist
    def remove(self, keys: list[str]) -> None: ...
    def close(self) -> None: ...


class AsyncStore(Store, Protocol):
    """A store with coroutines too, for phases with ``mode`` "asyncio": ``aopen`` readies
    them (called before each such phase, outside its clock)."""

    async def aopen(self) -> None: ...

    async def aput(
        self, keys: list[str], views: list[np.ndarray], addresses: list[int]
    ) -> None: ...
    async def aget(
        self, keys: list[str], views: list[np.ndarray], addresses: list[int]
    ) -> None: ...


class Slots:
    """An arena half cut into ``size``-byte slots: their views and addresses."""

    def __init__(self, half: np.ndarray, size: int) -> None:
        self.count = len(half) // size
        if self.count == 0:
            raise ValueError(f"objects of {size} bytes do not fit in a {len(half)}-byte arena")
        self.views = [half[j * size : (j + 1) * size] for j in range(self.count)]
        self.addresses = [int(v.ctypes.data) for v in self.views]


class Runner:
    def __init__(self, store: Store) -> None:
        self.store = store
        arena = np.empty(2 * HALF, dtype=np.uint8)
        rng = np.random.default_rng(os.getpid())
        arena[:HALF] = np.frombuffer(rng.bytes(HALF), dtype=np.uint8)
        arena[HALF:] = 0  # faults the pages in before anything is timed
        self.source, self.target = arena[:HALF], arena[HALF:]
        store.register(arena)
        self._slots: dict[tuple[str, int], Slots] = {}

    def slots(self, which: str, size: int) -> Slots:
        found = self._slots.get((which, size))
        if found is None:
            half = self.source if which == "source" else self.target
            found = self._slots[which, size] = Slots(half, size)
        return found

    # ---- phases

    def put(self, cmd: dict) -> dict:
        return self._move(cmd, self.slots("source", cmd["size"]), "put")

    def get(self, cmd: dict) -> dict:
        slots = self.slots("target", cmd["size"])
        self.target[:] = 0  # a get that moves nothing must fail the check below
        result = self._move(cmd, slots, "get")
        source = self.slots("source", cmd["size"])
        for j in range(min(result["ops"], slots.count)):
            if not np.array_equal(slots.views[j], source.views[j]):
                raise RuntimeError(f"{cmd['prefix']}: object in slot {j} read back wrong")
        return result

    def exists(self, cmd: dict) -> dict:
        keys = _keys(cmd["prefix"], cmd["count"])
        batches = [keys[i : i + cmd["batch"]] for i in range(0, len(keys), cmd["batch"])]
        found = checked = calls = 0
        _wait_until(cmd.get("start_at"))
        t0 = time.monotonic()
        end = t0 + cmd["seconds"]
        while True:
            batch = batches[calls % len(batches)]
            found += self.store.exists(batch)
            checked += len(batch)
            calls += 1
            t1 = time.monotonic()
            if t1 >= end:
                break
        if found != checked:
            raise RuntimeError(f"{cmd['prefix']}: {checked - found} of {checked} keys missing")
        return {"ops": checked, "bytes": 0, "calls": calls, "t0": t0, "t1": t1}

    def remove(self, cmd: dict) -> dict:
        keys = _keys(cmd["prefix"], cmd["count"])
        for i in range(0, len(keys), 1024):
            self.store.remove(keys[i : i + 1024])
        return {"removed": len(keys)}

    def _move(self, cmd: dict, slots: Slots, op: str) -> dict:
        size, batch = cmd["size"], cmd["batch"]
        if batch > slots.count:
            raise ValueError(f"a batch of {batch} x {size} bytes does not fit the arena")
        keys = _keys(cmd["prefix"], cmd["count"])
        calls = []
        for i in range(0, len(keys), batch):
            js = [j % slots.count for j in range(i, min(i + batch, len(keys)))]
            calls.append(
                (
                    keys[i : i + batch],
                    [slots.views[j] for j in js],
                    [slots.addresses[j] for j in js],
                )
            )
        seconds = cmd.get("seconds")
        threads, mode = cmd.get("threads", 1), cmd.get("mode", "threads")
        if mode == "asyncio" and hasattr(self.store, "aopen"):
            asyncio.run(self.store.aopen())
        _wait_until(cmd.get("start_at"))
        t0 = time.monotonic()
        end = t0 + seconds if seconds else float("inf")
        if mode == "asyncio":
            call = getattr(self.store, "a" + op, None)
            if call is None:
                raise ValueError(f"this store has no coroutines: no mode {mode!r}")
            done, t1 = asyncio.run(_in_flight_async(call, calls, threads, end))
        elif mode != "threads":
            raise ValueError(f"unknown mode {mode!r}: threads or asyncio")
        elif threads > 1:
            done, t1 = _in_flight_threads(getattr(self.store, op), calls, threads, end)
        else:
            done, t1 = _one_at_a_time(getattr(self.store, op), calls, end)
        ops = sum(len(keys) for keys, _, _ in calls[:done])
        return {"ops": ops, "bytes": ops * size, "calls": done, "t0": t0, "t1": t1}


def _one_at_a_time(call: Callable, calls: list, end: float) -> tuple[int, float]:
    done, t1 = 0, time.monotonic()
    for batch_keys, views, addresses in calls:
        call(batch_keys, views, addresses)
        done += 1
        t1 = time.monotonic()
        if t1 >= end:
            break
    return done, t1


def _in_flight_threads(call: Callable, calls: list, threads: int, end: float) -> tuple[int, float]:
    """``calls`` from ``threads`` threads, each taking the next batch until the time is up."""
    order = itertools.count()  # next() on it is atomic under the GIL
    errors: list[BaseException] = []
    done = [0] * threads

    def work(me: int) -> None:
        try:
            while not errors and time.monotonic() < end and (i := next(order)) < len(calls):
                call(*calls[i])
                done[me] += 1
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=work, args=(me,), daemon=True) for me in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return sum(done), time.monotonic()


async def _in_flight_async(
    call: Callable, calls: list, in_flight: int, end: float
) -> tuple[int, float]:
    """``calls`` as ``in_flight`` coroutines, each awaiting the next batch until time is up."""
    order = iter(range(len(calls)))
    done = 0

    async def work() -> None:
        nonlocal done
        for i in order:
            await call(*calls[i])
            done += 1
            if time.monotonic() >= end:
                break

    await asyncio.gather(*(work() for _ in range(in_flight)))
    return done, time.monotonic()


def _keys(prefix: str, count: int) -> list[str]:
    return [f"{prefix}/{i}" for i in range(count)]


def _wait_until(start_at: float | None) -> None:
    if start_at is not None:
        delay = start_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _answer(message: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


def serve(make_store: Callable[[], Store]) -> int:
    """Builds the store and runs commands from stdin until ``quit`` or end of input."""
    try:
        runner = Runner(make_store())
    except Exception as error:  # the orchestrator shows it with this runner's log
        _answer({"error": f"setup failed: {type(error).__name__}: {error}"})
        return 1
    _answer({"ready": True, "pid": os.getpid()})
    phases = {"put": runner.put, "get": runner.get, "exists": runner.exists}
    phases["remove"] = runner.remove
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            _answer(phases[cmd["op"]](cmd))
        except Exception as error:
            _answer({"error": f"{cmd['op']} failed: {type(error).__name__}: {error}"})
    runner.store.close()
    return 0


def config_from_argv() -> dict[str, Any]:
    """A runner's settings: one JSON object as its only argument."""
    return json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
