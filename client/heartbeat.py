"""A background thread that tells the master this client is alive (while it may write)."""

from __future__ import annotations

import contextlib
import threading
import time

from kvpool.client.master_link import MasterLink
from kvpool.errors import KVPoolError
from kvpool.proto import master_pb2 as pb

INTERVAL = 1.0


class Heartbeat:
    def __init__(self, link: MasterLink, client_id: str, interval: float = INTERVAL) -> None:
        self._link = link
        self._request = pb.ClientHeartbeatRequest(client_id=client_id)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvpool-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            # the master may be away: puts will say so themselves
            with contextlib.suppress(KVPoolError):
                self._link.call("ClientHeartbeat", self._request, time.monotonic() + self._interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self._interval)
