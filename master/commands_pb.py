"""Translation between the core's node commands and their protobuf form."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kvpool.master.records import (
    CopyCommand,
    ForgetCommand,
    NodeCommand,
    PersistCommand,
    PrepareCommand,
    SegmentInfo,
    StoredObject,
)
from kvpool.proto import master_pb2 as pb


def stored_to_pb(item: StoredObject) -> pb.StoredObject:
    message = pb.StoredObject(
        key=item.key,
        offset=item.offset,
        size=item.size,
        generation=item.generation,
        replicas=item.replicas,
    )
    if item.crc32c is not None:
        message.crc32c = item.crc32c
    return message


def stored_from_pb(message: pb.StoredObject) -> StoredObject:
    crc = message.crc32c if message.HasField("crc32c") else None
    return StoredObject(
        message.key,
        message.offset,
        message.size,
        message.generation,
        crc,
        message.replicas,
        message.unconfirmed,
    )


def command_to_pb(
    command: NodeCommand,
    copy_grant: Callable[[CopyCommand], bytes] | None = None,
    grants_end_ms: Callable[[str], tuple[int, int]] | None = None,
) -> pb.NodeCommand:
    """``copy_grant``: the READ capability for a copy's source range on another node that
    serves the checked stream (the copying node reads over it); None: this master grants
    none (the copy goes over UCX). ``grants_end_ms``: when the capabilities for a segment's
    space end (wall-clock ms: ``MasterState.grants_end``) and the term they were granted in,
    which a Forget tells its node."""
    message = pb.NodeCommand(command_id=command.command_id)
    if isinstance(command, PersistCommand):
        message.persist.segment_id = command.segment_id
        _add_stored(message.persist.objects, command.objects)
    elif isinstance(command, ForgetCommand):
        message.forget.segment_id = command.segment_id
        _add_stored(message.forget.objects, command.objects)
        if grants_end_ms is not None:
            message.forget.grants_end_ms, message.forget.term = grants_end_ms(command.segment_id)
    elif isinstance(command, CopyCommand):
        message.copy.source_segment_id = command.source_segment_id
        message.copy.source.CopyFrom(stored_to_pb(command.source))
        message.copy.target_segment_id = command.target_segment_id
        message.copy.target.CopyFrom(stored_to_pb(command.target))
        source = command.source_segment
        if source is not None:
            segment_to_pb(source, message.copy.source_segment)
            if copy_grant is not None and source.checked_address:
                message.copy.capability = copy_grant(command)
    elif isinstance(command, PrepareCommand):
        message.prepare.segment_id = command.segment_id
        message.prepare.offset = command.offset
        message.prepare.size = command.size
    return message


def segment_to_pb(info: SegmentInfo, message: pb.Segment | None = None) -> pb.Segment:
    """A segment as clients (and copying nodes) reach it, written into ``message`` if given."""
    if message is None:
        message = pb.Segment()
    message.segment_id = info.segment_id
    message.node_id = info.node_id
    message.host = info.host
    message.worker_address = info.worker_address
    message.base_address = info.base_address
    message.size = info.size
    message.rkey = info.rkey
    message.tier = info.tier  # type: ignore[assignment]
    message.persistent = info.persistent
    message.checked_address = info.checked_address
    message.tenant = info.tenant
    if info.shared_memory:
        message.shared_memory.ParseFromString(info.shared_memory)
    return message


def _add_stored(container: Any, objects: Iterable[StoredObject]) -> None:
    """Appends ``objects`` in place (a Persist names every object of a put batch: building
    each message apart and copying it in costs twice as much)."""
    add = container.add
    for o in objects:
        if o.crc32c is None:
            add(
                key=o.key,
                offset=o.offset,
                size=o.size,
                generation=o.generation,
                replicas=o.replicas,
            )
        else:
            add(
                key=o.key,
                offset=o.offset,
                size=o.size,
                generation=o.generation,
                crc32c=o.crc32c,
                replicas=o.replicas,
            )
