"""The master's side of storage nodes' command streams: a queue per node, in order.

Commands for a node whose stream is not (yet, or no longer) open wait in its queue; the
service gives up on answers that do not come in time, so nothing waits forever.

A command written to a stream that then breaks may never have reached its node. Every command
is remembered until its node answers; when the node opens a new stream, the commands sent on
the old one and never answered go first on the new one (those the master still wants: a
Persist or Copy it stopped waiting for is not sent again, nor one meant for an earlier process
of the node, whose bytes died with it). Nodes carry out every command
idempotently, so one that did arrive and only lost its answer does no harm the second time;
that is what makes a Forget reliable, so that a node never keeps (and, on a remount to a new
master, reports) an object the master removed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvpool.proto import master_pb2 as pb

#: Commands about bytes a node process holds: never sent again to a restarted node.
BOUND_TO_PROCESS = ("persist", "copy")


class NodeChannels:
    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[pb.NodeCommand]] = {}
        self._owners: dict[str, object] = {}
        #: node id -> commands written to its streams and not answered yet, oldest first.
        self._unanswered: dict[str, dict[int, pb.NodeCommand]] = {}
        #: node id -> the node process (NodeHello.incarnation) of its latest stream.
        self._incarnations: dict[str, str] = {}
        #: node id -> how its open stream writes a command at once, where it can.
        self._send_now: dict[str, Callable[[pb.NodeCommand], None]] = {}

    def queue(self, node_id: str) -> asyncio.Queue[pb.NodeCommand]:
        queue = self._queues.get(node_id)
        if queue is None:
            queue = self._queues[node_id] = asyncio.Queue()
        return queue

    def send(self, node_id: str, command: pb.NodeCommand) -> None:
        """Queues a command for the node's stream, or writes it at once where the stream
        can and nothing waits before it (a pass of the event loop less on every put)."""
        queue = self.queue(node_id)
        send_now = self._send_now.get(node_id)
        if send_now is not None and queue.empty():
            self.written(node_id, command)
            send_now(command)
        else:
            queue.put_nowait(command)

    def written(self, node_id: str, command: pb.NodeCommand) -> None:
        """A command went out on the node's stream: remember it until it is answered."""
        self._unanswered.setdefault(node_id, {})[command.command_id] = command

    def answered(self, node_id: str, command_id: int) -> None:
        unanswered = self._unanswered.get(node_id)
        if unanswered is not None:
            unanswered.pop(command_id, None)

    def unanswered(self, node_id: str) -> list[int]:
        return list(self._unanswered.get(node_id, ()))

    def attach(
        self,
        node_id: str,
        session: object,
        still_wanted: Callable[[pb.NodeCommand], bool] = lambda command: True,
        incarnation: str = "",
        send_now: Callable[[pb.NodeCommand], None] | None = None,
    ) -> asyncio.Queue[pb.NodeCommand]:
        """A node opened its stream; a newer stream of the same node replaces older ones, and
        gets first what was written to them and never answered (if ``still_wanted``; a
        Persist or Copy only if the same process, ``incarnation``, opened both).
        ``send_now``: how the stream writes a command at once, if it can; commands go through
        the queue while it holds any, so that they keep their order."""
        self._owners[node_id] = session
        if send_now is None:
            self._send_now.pop(node_id, None)
        else:
            self._send_now[node_id] = send_now
        same_process = bool(incarnation) and self._incarnations.get(node_id) == incarnation
        self._incarnations[node_id] = incarnation
        queue = self.queue(node_id)
        resend = [
            command
            for command in self._unanswered.pop(node_id, {}).values()
            if (same_process or command.WhichOneof("kind") not in BOUND_TO_PROCESS)
            and still_wanted(command)
        ]
        if resend:
            waiting = []
            while not queue.empty():
                waiting.append(queue.get_nowait())
            for command in [*resend, *waiting]:
                queue.put_nowait(command)
        return queue

    def detach(self, node_id: str, session: object) -> None:
        if self._owners.get(node_id) is session:
            del self._owners[node_id]
            self._send_now.pop(node_id, None)

    def connected(self, node_id: str) -> bool:
        return node_id in self._owners

    def close_all(self) -> None:
        """Ends every open stream (a None in its queue tells its handler to finish)."""
        self._send_now.clear()
        for node_id in self._owners:
            self.queue(node_id).put_nowait(None)  # type: ignore[arg-type]

    def discard(self, node_id: str) -> None:
        """Drops what waits for a node that is gone."""
        self._queues.pop(node_id, None)
        self._unanswered.pop(node_id, None)
        self._incarnations.pop(node_id, None)
        self._send_now.pop(node_id, None)
