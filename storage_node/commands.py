"""A storage node carrying out the master's commands on its segments."""

from __future__ import annotations

import time

from kvpool.proto import master_pb2 as pb
from kvpool.storage_node import metrics
from kvpool.storage_node.object_index import Entry
from kvpool.storage_node.segment import Segment


class CommandExecutor:
    def __init__(self, segments: list[Segment]) -> None:
        self._segments = {s.segment_id: s for s in segments}

    def quick(self, command: pb.NodeCommand) -> bool:
        """Whether a command only touches memory (no disk sync, no bulk copy): such commands
        run on the event loop, sparing a thread hand-off on every put's critical path."""
        kind = command.WhichOneof("kind")
        if kind in ("persist", "forget"):
            segment = self._segments.get(getattr(command, kind).segment_id)
            return segment is not None and not segment.persistent
        return False

    def execute(self, command: pb.NodeCommand) -> pb.CommandResult:
        """Runs one command (blocking: persistent segments sync to disk)."""
        began = time.perf_counter()
        result = pb.CommandResult(command_id=command.command_id, ok=True)
        kind = command.WhichOneof("kind")
        try:
            if kind == "persist":
                segment = self._segment(command.persist.segment_id)
                entries = [_entry(o) for o in command.persist.objects]
                result.crc32c.extend(segment.record(entries))
                metrics.persisted(segment, entries)
            elif kind == "forget":
                segment = self._segment(command.forget.segment_id)
                segment.forget([_entry(o) for o in command.forget.objects])
            elif kind == "prepare":
                prepare = command.prepare
                self._segment(prepare.segment_id).prepare(prepare.offset, prepare.size)
            elif kind == "copy":
                copy = command.copy
                target = self._segment(copy.target_segment_id)
                source = self._segment(copy.source_segment_id)
                result.crc32c.extend(
                    target.copy_from(source, copy.source.offset, _entry(copy.target))
                )
                metrics.copied(source.tier, target.tier, copy.target.size)
            else:
                raise ValueError(f"unknown command {kind!r}")
        except Exception as error:
            result.ok = False
            result.error = f"{type(error).__name__}: {error}"
        metrics.command_done(metrics.command_kind(kind), result.ok, time.perf_counter() - began)
        return result

    def _segment(self, segment_id: str) -> Segment:
        try:
            return self._segments[segment_id]
        except KeyError:
            raise KeyError(f"this node has no segment {segment_id!r}") from None


def _entry(message: pb.StoredObject) -> Entry:
    crc = message.crc32c if message.HasField("crc32c") else None
    return Entry(message.key, message.offset, message.size, message.generation, crc)
