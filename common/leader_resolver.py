"""Finding the leading master, and finding it again after a failover.

With one master there is nothing to find. With a list, a standby's refusal names the leader
(its hint is taken), else the next one is tried. With etcd, the leader key is read through
etcd's JSON gateway (plain HTTP: clients need no etcd library). Thread-safe.

A hint is only a hint: a leader named by a standby that then fails (it does not answer, it
went away, or its certificate does not name the address it advertises) sends the caller back
to the addresses it was given, never leaves it stuck on the hint. Given one address (a
Kubernetes Service in front of every master), that address is tried again, and reaches the
leader, or a standby that names the leader of now.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

from kvpool.common.master_address import MasterTarget

#: Seconds one etcd endpoint gets to answer a lookup.
LOOKUP_TIMEOUT = 1.0
#: Seconds a whole lookup (every endpoint in turn) takes at most, whatever the caller's
#: deadline: the caller retries with backoff, and a node's heartbeat waits meanwhile.
LOOKUP_BUDGET = 2.0
#: The most bytes of an answer to one range request read: the leader key's value is an
#: address, and an endpoint that sends more is not etcd.
MAX_REPLY = 64 * 1024
#: Trailing metadata a standby master sets to name the leader.
LEADER_METADATA = "kvpool-leader"


def leader_key(cluster: str) -> bytes:
    return f"/kvpool/{cluster}/leader".encode()


class LeaderResolver:
    """Thread-safe; etcd is asked outside the lock, so one slow endpoint does not hold up the
    threads that already know the leader."""

    def __init__(self, target: MasterTarget) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._index = 0
        self._current = target.masters[0] if target.masters else ""

    @property
    def current(self) -> str:
        return self.leader()

    def leader(self, deadline: float | None = None) -> str:
        """The master to call now ("" when etcd knows no leader yet); an etcd lookup ends by
        ``deadline`` (monotonic) or after LOOKUP_BUDGET, whichever comes first."""
        with self._lock:
            if self._current or not self.target.etcd:
                return self._current
        found = self._ask_etcd(deadline)
        with self._lock:
            if not self._current:
                self._current = found
            return self._current

    def failed(self, hint: str = "", deadline: float | None = None, tried: str = "") -> str:
        """The current master refused or did not answer: picks another (``hint`` first).
        ``tried``: the master that failed; when another thread has moved on from it
        meanwhile, the current one stands (two threads failing on the same master move on
        once, not back to it)."""
        if not hint and self.target.etcd:
            found = self._ask_etcd(deadline)
            with self._lock:
                self._current = found
                return found
        with self._lock:
            if tried and tried != self._current:
                return self._current
            masters = self.target.masters
            if hint:
                self._current = hint
                if hint in masters:  # (a listed master: the list goes on from there)
                    self._index = masters.index(hint)
            elif masters and self._current not in masters:
                # a hinted leader failed: back to the masters as given, the next of them
                # (with one, a Service, that one: it reaches the leader of now, or a standby
                # that names it)
                self._index = (self._index + 1) % len(masters)
                self._current = masters[self._index]
            elif len(masters) > 1:
                self._index = (self._index + 1) % len(masters)
                self._current = masters[self._index]
            return self._current

    def hinted(self, address: str) -> bool:
        """Whether ``address`` is a leader a standby named rather than a master as given (a
        failure there is the hint's, and ``failed`` goes back to those given). Never where
        etcd names the leader: there is nothing else to go back to."""
        return bool(address) and not self.target.etcd and address not in self.target.masters

    def _ask_etcd(self, deadline: float | None) -> str:
        """The leader key's value as the first etcd endpoint that answers has it ("" when
        none answers in time, or it holds none)."""
        # imported here: only etcd-mode processes need HTTP (and a `kvpool get` waits for
        # every import of every call)
        import binascii
        import json
        import urllib.error
        import urllib.request

        end = time.monotonic() + LOOKUP_BUDGET
        if deadline is not None:
            end = min(end, deadline)
        body = json.dumps({"key": base64.b64encode(leader_key(self.target.cluster)).decode()})
        for endpoint in self.target.etcd:
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            request = urllib.request.Request(
                f"http://{endpoint}/v3/kv/range",
                data=body.encode(),
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(
                    request, timeout=min(LOOKUP_TIMEOUT, remaining)
                ) as response:
                    reply = _read_reply(response, end)
                kvs = json.loads(reply).get("kvs", [])
                if kvs:
                    return base64.b64decode(kvs[0]["value"], validate=True).decode()
                return ""
            except (
                OSError,
                urllib.error.URLError,
                ValueError,  # (json's errors, UnicodeDecodeError and binascii.Error among them)
                binascii.Error,
                AttributeError,  # (an answer that is JSON but not an object)
                KeyError,
                IndexError,
                TypeError,
            ):
                continue
        return ""


def _read_reply(response: Any, end: float) -> bytes:
    """The answer's body, read one receive at a time until it ends; TimeoutError past ``end``
    (an endpoint that trickles bytes keeps each receive within its timeout), ValueError past
    MAX_REPLY bytes."""
    parts: list[bytes] = []
    size = 0
    while chunk := response.read1(16 * 1024):
        size += len(chunk)
        if size > MAX_REPLY:
            raise ValueError(f"an etcd answer of more than {MAX_REPLY} bytes")
        if time.monotonic() > end:
            raise TimeoutError("the etcd answer did not arrive in time")
        parts.append(chunk)
    return b"".join(parts)
