"""A client of the suite: threads that put, get, check and remove without pause, and write
down every call (``history.Op``, one JSON line each, as it ends).

``python -m bench.chaos.worker CONFIG`` (JSON: ``name``, ``master``, ``tls_ca``, ``seed``,
``threads``, ``timeout``, ``history``, ``sizes`` [min, max], ``big`` (size of every 20th put),
``live_keys`` (kept per thread before the oldest is removed), ``replicas``), the token in
``KVPOOL_TOKEN``. Runs in a namespace of its own, so UCX goes over TCP through the switch
and the client never maps a node's memory. Stops at SIGTERM, after the calls in flight.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.chaos.history import Op, digest, owner_of, value_of

DETAIL = 400  # characters of an error message kept


@dataclass
class Config:
    name: str
    master: str
    tls_ca: str
    seed: int
    threads: int = 3
    timeout: float = 10.0
    history: str = ""
    sizes: tuple[int, int] = (512, 96 * 1024)
    big: int = 2 * 1024 * 1024
    live_keys: int = 200
    replicas: int = 2


class Recorder:
    def __init__(self, path: Path) -> None:
        self._out = path.open("a", buffering=1)
        self._lock = threading.Lock()

    def record(self, op: Op) -> None:
        line = json.dumps(op.__dict__) + "\n"
        with self._lock:
            self._out.write(line)

    def close(self) -> None:
        self._out.close()


def call(recorder: Recorder, client_name: str, kind: str, key: str, size: int, fn) -> object:
    """Runs ``fn`` and records it; returns its result, or the exception it raised."""
    from kvpool.errors import KVPoolError

    start = time.monotonic()
    try:
        result = fn()
    except KVPoolError as error:
        recorder.record(
            Op(
                client_name,
                kind,
                key,
                size,
                start,
                time.monotonic(),
                type(error).__name__,
                str(error)[:DETAIL],
            )
        )
        return error
    except Exception as error:  # an untyped error is a finding, not a crash
        recorder.record(
            Op(
                client_name,
                kind,
                key,
                size,
                start,
                time.monotonic(),
                f"untyped:{type(error).__name__}",
                str(error)[:DETAIL],
            )
        )
        return error
    end = time.monotonic()
    op = Op(client_name, kind, key, size, start, end, "ok")
    if kind == "get":
        expected = value_of(key, size)
        op.digest, op.expected = digest(result), digest(expected)  # type: ignore[arg-type]
        if result != expected:
            op.detail = f"{len(result)} bytes, header of {owner_of(result)!r}"  # type: ignore[arg-type]
    elif kind == "exists":
        op.detail = str(result)
    recorder.record(op)
    return result


def run_thread(config: Config, index: int, client, recorder: Recorder, stop: threading.Event):
    from kvpool.errors import KVPoolError, ObjectHasLease

    rng = random.Random(config.seed * 1000 + index)
    tag = f"{config.name}-t{index}"
    live: list[tuple[str, int]] = []  # acknowledged and not removed
    refused: set[str] = set()  # removes refused for a lease: the next one forces
    maybe: list[tuple[str, int]] = []  # puts of unknown outcome
    n = 0
    while not stop.is_set():
        roll = rng.random()
        if roll < 0.45 or not live:
            n += 1
            size = config.big if n % 20 == 0 else rng.randint(*config.sizes)
            key = f"{tag}-{n:07d}"
            data = value_of(key, size)
            result = call(
                recorder,
                config.name,
                "put",
                key,
                size,
                lambda key=key, data=data: client.put(key, data, replicas=config.replicas),
            )
            if isinstance(result, KVPoolError):
                maybe.append((key, size))
                del maybe[:-50]
            else:
                live.append((key, size))
        elif roll < 0.9:
            key, size = rng.choice(maybe) if maybe and rng.random() < 0.1 else rng.choice(live)
            call(recorder, config.name, "get", key, size, lambda key=key: client.get(key))
        else:
            key, size = rng.choice(live)
            call(recorder, config.name, "exists", key, size, lambda key=key: client.exists(key))
        if len(live) > config.live_keys:
            key, size = live.pop(0)
            force = key in refused
            result = call(
                recorder,
                config.name,
                "remove",
                key,
                size,
                lambda key=key, force=force: client.remove(key, force=force),
            )
            if isinstance(result, ObjectHasLease):
                refused.add(key)
                live.append((key, size))  # still there: removed later, by force
            else:
                refused.discard(key)


def main() -> int:
    raw = json.loads(sys.argv[1])
    raw["sizes"] = tuple(raw.get("sizes", Config.sizes))
    config = Config(**raw)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from kvpool import Client

    recorder = Recorder(Path(config.history))
    client = Client(
        config.master,
        token=os.environ["KVPOOL_TOKEN"],
        tls_ca=config.tls_ca,
        timeout=config.timeout,
        ucx_config={"TLS": "tcp"},
        same_host_mapping=False,
    )
    threads = [
        threading.Thread(target=run_thread, args=(config, i, client, recorder, stop), daemon=True)
        for i in range(config.threads)
    ]
    for thread in threads:
        thread.start()
    print(json.dumps({"ready": True}), flush=True)
    while not stop.is_set():
        stop.wait(0.5)
    for thread in threads:
        thread.join(config.timeout * 3)
    client.close()
    recorder.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
