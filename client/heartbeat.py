"""A background thread that tells the master this client is alive (while it may write)."""

from __future__ import annotations

import threading
import time

from kvpool.client.master_link import MasterLink
from kvpool.common.log_throttle import LogThrottle
from kvpool.common.logging import get_logger
from kvpool.errors import ClientClosed, KVPoolError
from kvpool.proto import master_pb2 as pb

INTERVAL = 1.0

log = get_logger(__name__)


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
        throttle = LogThrottle(burst=1, interval=60.0)
        while not self._stop.wait(self._interval):
            try:
                self._link.call("ClientHeartbeat", self._request, time.monotonic() + self._interval)
            except ClientClosed:
                return
            except KVPoolError:
                pass  # the master may be away: puts will say so themselves
            except Exception as error:  # (a bug, or a master of another version: keep beating)
                dropped = throttle.allow(type(error).__name__)
                if dropped is not None:
                    log.warning("client heartbeat failed", error=repr(error), suppressed=dropped)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self._interval)
