"""Finding the leading master, and finding it again after a failover.

With one master there is nothing to find. With a list, a standby's refusal names the leader
(its hint is taken), else the next one is tried. With etcd, the leader key is read through
etcd's JSON gateway (plain HTTP: clients need no etcd library). Thread-safe.
"""

from __future__ import annotations

import base64
import threading

from kvpool.common.master_address import MasterTarget

LOOKUP_TIMEOUT = 1.0
#: Trailing metadata a standby master sets to name the leader.
LEADER_METADATA = "kvpool-leader"


def leader_key(cluster: str) -> bytes:
    return f"/kvpool/{cluster}/leader".encode()


class LeaderResolver:
    def __init__(self, target: MasterTarget) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._index = 0
        self._current = target.masters[0] if target.masters else ""

    @property
    def current(self) -> str:
        """The master to call now ("" when etcd knows no leader yet)."""
        with self._lock:
            if not self._current and self.target.etcd:
                self._current = self._ask_etcd()
            return self._current

    def failed(self, hint: str = "") -> str:
        """The current master refused or did not answer: picks another (``hint`` first)."""
        with self._lock:
            if hint:
                self._current = hint
            elif self.target.etcd:
                self._current = self._ask_etcd()
            elif len(self.target.masters) > 1:
                self._index = (self._index + 1) % len(self.target.masters)
                self._current = self.target.masters[self._index]
            return self._current

    def _ask_etcd(self) -> str:
        # imported here: only etcd-mode processes need HTTP (and a `kvpool get` waits for
        # every import of every call)
        import json
        import urllib.error
        import urllib.request

        body = json.dumps({"key": base64.b64encode(leader_key(self.target.cluster)).decode()})
        for endpoint in self.target.etcd:
            request = urllib.request.Request(
                f"http://{endpoint}/v3/kv/range",
                data=body.encode(),
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=LOOKUP_TIMEOUT) as response:
                    kvs = json.loads(response.read()).get("kvs", [])
            except (OSError, urllib.error.URLError, ValueError):
                continue
            if kvs:
                return base64.b64decode(kvs[0]["value"]).decode()
            return ""
        return ""
