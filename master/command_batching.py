"""Forgets bound for one segment, one after another, travel as one command (sans-IO).

The core emits a Forget per object it drops: a removal of a thousand keys, or an eviction
pass, is a thousand Forgets for the same segment. Each would be a frame on the node's stream,
a command the node runs and answers, and an entry the forget barrier checks every new buffer
against until that answer comes. Merged before sending, they are one of each.

A node runs its commands in order, so only Forgets with no other command for the same node
between them merge (commands for other nodes go on other streams and do not count). The
merged command keeps the first one's id; the others' ids are never sent (the core waits for
no Forget's answer; the I/O layer tracks the ids it sends).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvpool.master.records import ForgetCommand, NodeCommand, StoredObject

#: Objects per merged Forget at most (a key is at most 1 KiB: a frame stays a few MiB).
MAX_OBJECTS = 4096


def merge_forgets(
    commands: Iterable[NodeCommand], absorbed: dict[int, int] | None = None
) -> list[NodeCommand]:
    """``commands`` in the same order per node, runs of Forgets for one segment merged (a
    merged Forget keeps the first one's id; ``absorbed`` gets the others': id -> that id)."""
    merged: list[NodeCommand] = []
    #: index in ``merged`` -> the objects of the Forget there, while more may join it
    objects: dict[int, list[StoredObject]] = {}
    last_of_node: dict[str, int] = {}  # node id -> index in ``merged`` of its latest command
    for command in commands:
        at = last_of_node.get(command.node_id)
        if isinstance(command, ForgetCommand) and at is not None and at in objects:
            previous = merged[at]
            assert isinstance(previous, ForgetCommand)  # (``objects`` holds Forgets only)
            joined = objects[at]
            if (
                previous.segment_id == command.segment_id
                and len(joined) + len(command.objects) <= MAX_OBJECTS
            ):
                joined.extend(command.objects)
                if absorbed is not None:
                    absorbed[command.command_id] = previous.command_id
                continue
        last_of_node[command.node_id] = len(merged)
        if isinstance(command, ForgetCommand):
            objects[len(merged)] = list(command.objects)
        merged.append(command)
    for at, joined in objects.items():
        forget = merged[at]
        assert isinstance(forget, ForgetCommand)
        if len(joined) != len(forget.objects):
            merged[at] = ForgetCommand(
                forget.command_id, forget.node_id, forget.segment_id, tuple(joined)
            )
    return merged
