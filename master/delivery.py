"""Delivery of the core's commands to storage nodes, in order, across broken streams (sans-IO).

A node has at most one open command stream at a time. A command for a node with an open
stream is written at once; one for a node without waits here until the node opens one. A
command written to a stream that then breaks may never have reached its node, so every command
is remembered until its node answers; when the node opens a new stream, the commands sent on
the old one and never answered go first on the new one (those the master still wants: a
Persist or Copy it stopped waiting for is not sent again, nor one meant for an earlier process
of the node, whose bytes died with it). Nodes carry out every command idempotently, so one
that did arrive and only lost its answer does no harm the second time; that is what makes a
Forget reliable, so that a node never keeps (and, on a remount to a new master, reports) an
object the master removed.

An answer counts only from the node the command was sent to.

A Persist or Copy whose answer the core stopped waiting for (``expired``) is let go at once,
wherever it waits: it would never be sent again, and a node that reads its commands and
answers none (its heartbeats keep it alive) would otherwise grow this table by every put
placed on it. What stays until answered are Forgets, which the core stops placing space
behind (their space is quarantined): at most about one per buffer its segments can hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvpool.master.records import CopyCommand, NodeCommand, PersistCommand

#: Commands about bytes a node process holds: never sent again to a restarted node.
BOUND_TO_PROCESS = (PersistCommand, CopyCommand)


@dataclass(slots=True)
class _Node:
    #: The node's open stream (whatever token the I/O layer uses for it), or None.
    stream: object | None = None
    #: The node process (NodeHello.incarnation) of its latest stream.
    incarnation: str = ""
    #: Commands for it while it had no stream, oldest first.
    unsent: list[NodeCommand] = field(default_factory=list)
    #: Commands written to its streams and not answered yet, oldest first.
    unanswered: dict[int, NodeCommand] = field(default_factory=dict)


class CommandDelivery:
    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}

    def send(self, command: NodeCommand) -> bool:
        """True when the command is to be written on its node's stream now; else it waits
        for the node's next stream."""
        node = self._nodes.get(command.node_id)
        if node is None:
            node = self._nodes[command.node_id] = _Node()
        if node.stream is None:
            node.unsent.append(command)
            return False
        node.unanswered[command.command_id] = command
        return True

    def connected(
        self,
        node_id: str,
        stream: object,
        incarnation: str,
        still_wanted: Callable[[NodeCommand], bool],
    ) -> list[NodeCommand]:
        """A node opened a stream (replacing any older one); returns what to write on it
        first, in order: the unanswered commands it should get again (``still_wanted``; a
        Persist or Copy only if the same process, ``incarnation``, opened both streams), then
        those that waited for it."""
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node()
        same_process = bool(incarnation) and node.incarnation == incarnation
        node.stream = stream
        node.incarnation = incarnation
        again = [
            command
            for command in node.unanswered.values()
            if (same_process or not isinstance(command, BOUND_TO_PROCESS)) and still_wanted(command)
        ]
        out = [*again, *node.unsent]
        node.unsent = []
        node.unanswered = {command.command_id: command for command in out}
        return out

    def disconnected(self, node_id: str, stream: object) -> None:
        node = self._nodes.get(node_id)
        if node is not None and node.stream is stream:
            node.stream = None

    def answered(self, node_id: str, command_id: int) -> NodeCommand | None:
        """The node answered; returns the command, or None when it was not one written to
        that node and unanswered (a duplicate, or an answer from the wrong node)."""
        node = self._nodes.get(node_id)
        if node is None:
            return None
        return node.unanswered.pop(command_id, None)

    def expired(self, command: NodeCommand) -> None:
        """The core gave up on this Persist or Copy's answer: it is sent again nowhere, and a
        late answer counts for nothing (the core's state has already let it go)."""
        node = self._nodes.get(command.node_id)
        if node is None:
            return
        if node.unanswered.pop(command.command_id, None) is None and node.unsent:
            node.unsent = [c for c in node.unsent if c.command_id != command.command_id]

    def discard(self, node_id: str) -> None:
        """The node was declared dead: what waited for it goes (its segments went with it);
        an open stream stays, for commands about segments it mounts again."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.unsent = []
            node.unanswered = {}
            node.incarnation = ""

    def stream_of(self, node_id: str) -> object | None:
        node = self._nodes.get(node_id)
        return None if node is None else node.stream

    def unanswered(self, node_id: str) -> list[int]:
        node = self._nodes.get(node_id)
        return [] if node is None else list(node.unanswered)

    def unsent(self, node_id: str) -> list[int]:
        node = self._nodes.get(node_id)
        return [] if node is None else [command.command_id for command in node.unsent]
