"""What every client operation needs: the master link, the data path, and the client's identity."""

from __future__ import annotations

import socket
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

    def writing(self) -> None:
        """Called before reserving: a client with reservations must heartbeat, or the master
        revokes them when it stops hearing from it."""
        if self.heartbeat is None:
            self.heartbeat = Heartbeat(self.link, self.client_id)
            self.heartbeat.start()

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.data.close()
        self.link.close()
