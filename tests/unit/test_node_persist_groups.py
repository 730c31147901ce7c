"""Persists that wait back to back on a node run as one group (storage_node/commands.py):
the objects of a persistent segment are recorded together, one sync of their bytes and one of
the index for them all, and each command is answered as if it had run alone: its own
checksums, its own failure. Real segments on this machine's disk."""

from __future__ import annotations

import os
from pathlib import Path

import google_crc32c
import pytest
from prometheus_client import REGISTRY

from kvpool.common.status import Tier
from kvpool.proto import master_pb2 as pb
from kvpool.storage_node.commands import CommandExecutor
from kvpool.storage_node.object_index import live_entries
from kvpool.storage_node.segment import (
    INDEX_SUFFIX,
    allocate_dram_segment,
    open_persistent_segment,
)
from kvpool.transport import ucp

SIZE = 16 << 20


@pytest.fixture
def segment(tmp_path: Path):
    context = ucp.Context({"TLS": "tcp"})
    opened = open_persistent_segment(context, "n1", tmp_path / "nvme", SIZE, Tier.NVME)
    yield opened
    opened.close()
    context.close()


def persist(command_id: int, segment_id: str, key: str, offset: int, size: int) -> pb.NodeCommand:
    command = pb.NodeCommand(command_id=command_id)
    command.persist.segment_id = segment_id
    command.persist.objects.add(key=key, offset=offset, size=size, generation=command_id)
    return command


def index_syncs(segment_id: str) -> float:
    labels = {"segment": segment_id, "target": "index"}
    return REGISTRY.get_sample_value("kvpool_node_sync_seconds_count", labels) or 0.0


def written(segment, offset: int, size: int) -> int:
    data = os.urandom(size)
    segment.memory[offset : offset + size] = data
    return google_crc32c.value(data)


def test_a_group_records_every_object_with_one_index_sync_and_answers_each(segment):
    sid = segment.segment_id
    crcs = [written(segment, i * 100_000, 70_000 + i) for i in range(3)]
    commands = [persist(i + 1, sid, f"k{i}", i * 100_000, 70_000 + i) for i in range(3)]
    executor = CommandExecutor([segment])
    assert executor.groups_with(commands[0], commands[1])
    syncs = index_syncs(sid)

    results = executor.execute_group(commands)

    assert [(r.command_id, r.ok, list(r.crc32c)) for r in results] == [
        (i + 1, True, [crcs[i]]) for i in range(3)
    ]
    assert index_syncs(sid) == syncs + 1, "one sync of the index for the whole group"
    recorded = live_entries(Path(str(segment.path) + INDEX_SUFFIX))
    assert sorted(e.key for e in recorded.values()) == ["k0", "k1", "k2"]


def test_a_member_that_fails_fails_alone(segment):
    sid = segment.segment_id
    crc = written(segment, 0, 5000)
    later_crc = written(segment, 8192, 5000)
    commands = [
        persist(1, sid, "good", 0, 5000),
        persist(2, "n1/none", "elsewhere", 0, 10),  # a segment the node does not have
        persist(3, sid, "beyond", SIZE - 10, 100),  # past the segment's end: the group fails
        persist(4, sid, "good-too", 8192, 5000),
    ]
    results = CommandExecutor([segment]).execute_group(commands)

    assert [r.ok for r in results] == [True, False, False, True]
    assert "no segment" in results[1].error and "beyond" not in results[1].error
    assert list(results[0].crc32c) == [crc] and list(results[3].crc32c) == [later_crc]
    recorded = live_entries(Path(str(segment.path) + INDEX_SUFFIX))
    assert sorted(e.key for e in recorded.values()) == ["good", "good-too"]


def test_only_persists_and_prepares_group_each_with_its_own_kind(segment):
    forget = pb.NodeCommand(command_id=8)
    forget.forget.segment_id = segment.segment_id
    prepare = pb.NodeCommand(command_id=7)
    prepare.prepare.segment_id = segment.segment_id
    executor = CommandExecutor([segment])
    first = persist(1, segment.segment_id, "k", 0, 10)
    assert executor.groups_with(first, persist(2, segment.segment_id, "j", 64, 10))
    assert not executor.groups_with(first, forget)
    assert not executor.groups_with(first, prepare)
    assert executor.groups_with(prepare, prepare)
    assert not executor.groups_with(forget, forget)


def test_a_persist_past_a_dram_segments_end_fails_and_records_nothing():
    """The master is trusted, but a bug of its must not become an entry the node reports at
    its next mount (DRAM records only its index: nothing else would notice)."""
    context = ucp.Context({"TLS": "tcp"})
    segment = allocate_dram_segment(context, "n1", SIZE, prefault=False)
    try:
        sid = segment.segment_id
        executor = CommandExecutor([segment])
        [result] = executor.execute_group([persist(1, sid, "beyond", SIZE - 10, 100)])
        assert not result.ok and "outside segment" in result.error
        assert executor.execute(persist(2, sid, "inside", SIZE - 100, 100)).ok
        assert [e.key for e in segment.index.entries()] == ["inside"]
    finally:
        segment.close()
        context.close()


def test_where_writes_are_proven_a_persist_sent_again_is_answered_as_before(segment):
    """(A Persist the node ran and whose answer was lost with its stream is sent again when
    the node's process connects again: its proof was spent the first time, and the second
    run failed, and the master forgot a good object.)"""
    from kvpool.security import capabilities as caps
    from kvpool.storage_node.checked_writes import WrittenRanges

    sid = segment.segment_id
    proofs = WrittenRanges()
    written(segment, 0, 70_000)
    proofs.wrote(caps.segment_digest(sid), 0, 1, 0, 70_000)  # over the checked stream
    executor = CommandExecutor([segment], written=proofs)
    first = executor.execute(persist(1, sid, "k", 0, 70_000))
    again = executor.execute(persist(1, sid, "k", 0, 70_000))
    assert first.ok and again.ok, again.error
    unwritten = executor.execute(persist(2, sid, "never-written", 100_000, 4096))
    assert not unwritten.ok and "not written whole" in unwritten.error
