"""The master's side of storage nodes' command streams: a queue per node, in order.

Commands for a node whose stream is not (yet, or no longer) open wait in its queue; the
service gives up on answers that do not come in time, so nothing waits forever.
"""

from __future__ import annotations

import asyncio

from kvpool.proto import master_pb2 as pb


class NodeChannels:
    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[pb.NodeCommand]] = {}
        self._owners: dict[str, object] = {}

    def queue(self, node_id: str) -> asyncio.Queue[pb.NodeCommand]:
        queue = self._queues.get(node_id)
        if queue is None:
            queue = self._queues[node_id] = asyncio.Queue()
        return queue

    def send(self, node_id: str, command: pb.NodeCommand) -> None:
        self.queue(node_id).put_nowait(command)

    def attach(self, node_id: str, session: object) -> asyncio.Queue[pb.NodeCommand]:
        """A node opened its stream; a newer stream of the same node replaces older ones."""
        self._owners[node_id] = session
        return self.queue(node_id)

    def detach(self, node_id: str, session: object) -> None:
        if self._owners.get(node_id) is session:
            del self._owners[node_id]

    def connected(self, node_id: str) -> bool:
        return node_id in self._owners

    def close_all(self) -> None:
        """Ends every open stream (a None in its queue tells its handler to finish)."""
        for node_id in self._owners:
            self.queue(node_id).put_nowait(None)  # type: ignore[arg-type]

    def discard(self, node_id: str) -> None:
        """Drops what waits for a node that is gone."""
        self._queues.pop(node_id, None)
