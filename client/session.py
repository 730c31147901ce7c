"""What every client operation needs: the master link, the data path, and the client's identity."""

from __future__ import annotations

import socket
import threading
import uuid
from dataclasses import dataclass, field

from kvpool.client.data_path import DataPath
from kvpool.client.heartbeat import Heartbeat
from kvpool.client.master_link import MasterLink


@dataclass
class Session:
    link: MasterLink
    data: DataPath
    timeout: float
    lease_ttl: float = 0.0
    client_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    host: str = field(default_factory=socket.gethostname)
    heartbeat: Heartbeat | None = None
    #: Starts the heartbeat once, however many threads write first at the same time.
    _heartbeat_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def writing(self) -> None:
        """Called before reserving: a client with reservations must heartbeat, or the master
        revokes them when it stops hearing from it."""
        if self.heartbeat is None:  # (as a rule it runs: no lock taken)
            with self._heartbeat_lock:
                if self.heartbeat is None:
                    heartbeat = Heartbeat(self.link, self.client_id)
                    heartbeat.start()
                    self.heartbeat = heartbeat

    def close(self) -> None:
        with self._heartbeat_lock:
            heartbeat = self.heartbeat
        if heartbeat is not None:
            heartbeat.stop()
        self.data.close()
        self.link.close()
