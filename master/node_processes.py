"""Which process of a node may hold its command stream: one at a time.

Two processes started with the same node id (a copy-paste in a deployment) would otherwise
take the stream from each other, and every put on that node would stall. A node's
heartbeats say which process (incarnation) sends them: a second process's stream is refused,
naming the first, while the first still heartbeats; once it has been silent for a node TTL
(it died, or is cut off and about to be declared dead) the new process takes over.
Sans-IO: times are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Processes remembered per node id (a node restarting in a loop must not grow the table).
MAX_REMEMBERED = 4
#: Node ids remembered at most (heartbeats come before a node mounts: on an ``--insecure``
#: master anyone may send them under any id); the one heard from least lately goes first.
MAX_NODES = 16_384
#: The longest process id (incarnation) a node may give: nodes make 32 hex digits.
MAX_INCARNATION = 128


def incarnation_problem(incarnation: str) -> str | None:
    """Why a node's process id (incarnation) is refused, or None."""
    if len(incarnation) > MAX_INCARNATION:
        return (
            f"a node's incarnation holds at most {MAX_INCARNATION} characters, got "
            f"{len(incarnation)}: leave it to kvpool's node, which makes one"
        )
    return None


@dataclass(frozen=True, slots=True)
class Attached:
    """The process holding a node's command stream, as a refusal names it."""

    incarnation: str
    peer: str


class NodeProcesses:
    def __init__(self, node_ttl: float) -> None:
        self.node_ttl = node_ttl
        #: node id -> incarnation -> when it last heartbeat.
        self._heard: dict[str, dict[str, float]] = {}

    def heard(self, node_id: str, incarnation: str, now: float) -> None:
        if not incarnation:
            return  # (an older node: it says nothing of its process)
        seen = self._heard.pop(node_id, None)  # (back in last: heard from most lately)
        if seen is None:
            seen = {}
            while len(self._heard) >= MAX_NODES:
                del self._heard[next(iter(self._heard))]
        self._heard[node_id] = seen
        seen.pop(incarnation, None)
        seen[incarnation] = now  # (last: the newest)
        while len(seen) > MAX_REMEMBERED:
            del seen[next(iter(seen))]

    def forget(self, node_id: str) -> None:
        self._heard.pop(node_id, None)

    def refusal(self, node_id: str, incarnation: str, attached: Attached, now: float) -> str | None:
        """Why process ``incarnation`` may not open node ``node_id``'s stream while
        ``attached`` holds it, or None when it may (the same process reconnecting, or the
        holder silent for a node TTL)."""
        if incarnation == attached.incarnation:
            return None
        last = self._heard.get(node_id, {}).get(attached.incarnation)
        if last is None or now - last > self.node_ttl:
            return None
        return (
            f"node {node_id!r} is already attached: process {attached.incarnation[:12]} holds "
            f"its command stream (from {attached.peer}) and heartbeats. Is a second node "
            f"process running with --node-id {node_id}? Stop one, or give it another id"
        )
