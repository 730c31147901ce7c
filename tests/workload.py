"""A background workload for tests that restart or kill storage nodes while clients work.

``Workload`` puts new objects (and reads back earlier ones) on a thread of its own, with its
own client, until stopped; it remembers every object whose put succeeded, with its bytes and
the replicas the put stored, so that a test can check afterwards that none was lost. A put or
a get may fail while a node goes away (a transfer to it fails, the master has not noticed
yet): those are counted, not raised. Every wait in it has a deadline (the client's timeout).
"""

from __future__ import annotations

import os
import random
import threading

from kvpool import Client
from kvpool.errors import KVPoolError


class Workload:
    def __init__(
        self,
        master: str,
        *,
        prefix: str = "load/",
        size: int = 64 << 10,
        replicas: int = 1,
        pause: float = 0.02,
    ) -> None:
        self.master = master
        self.prefix = prefix
        self.size = size
        self.replicas = replicas
        self.pause = pause
        #: key -> (bytes, replicas the put stored), for every put that succeeded.
        self.published: dict[str, tuple[bytes, int]] = {}
        self.put_failures = 0
        self.get_failures = 0
        self.gets = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> Workload:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the workload did not stop"
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        rng = random.Random(0)
        try:
            with Client(self.master, timeout=10) as client:
                i = 0
                while not self._stop.is_set():
                    key = f"{self.prefix}{i}"
                    data = os.urandom(self.size)
                    try:
                        stored = client.put(key, data, replicas=self.replicas, checksum=True)
                        self.published[key] = (data, stored)
                    except KVPoolError:
                        self.put_failures += 1
                    if self.published:
                        earlier = rng.choice(list(self.published))
                        try:
                            self.gets += 1
                            if client.get(earlier) != self.published[earlier][0]:
                                raise AssertionError(f"{earlier}: a get returned other bytes")
                        except KVPoolError:
                            self.get_failures += 1
                    i += 1
                    self._stop.wait(self.pause)
        except BaseException as error:  # (raised again by stop())
            self._error = error
