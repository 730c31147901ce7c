"""A group of Persists whose sync the disk fails is answered failed, every command of it, and
nothing of it is recorded (storage_node/commands.py ``execute_group``).

Linux reports a failed writeback once per file and marks the pages clean: the next msync of
the same range returns 0 with the bytes never on the disk. A group that retried its members
one at a time after such an error would answer them OK and index them as durable, and lose
them at the next restart. Real segments on this machine's disk; the disk's error is a
patched ``msync`` (or index ``fdatasync``) that fails once, as Linux reports it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvpool.common.status import Tier
from kvpool.proto import master_pb2 as pb
from kvpool.storage_node import object_index
from kvpool.storage_node import segment as segment_module
from kvpool.storage_node.commands import CommandExecutor
from kvpool.storage_node.object_index import live_entries
from kvpool.storage_node.segment import INDEX_SUFFIX, Segment, open_persistent_segment
from kvpool.transport import ucp

SIZE = 16 << 20
OBJECT = 65536


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[Segment]:
    context = ucp.Context({"TLS": "tcp"})
    opened = open_persistent_segment(context, "n1", tmp_path / "nvme", SIZE, Tier.NVME)
    yield opened
    opened.close()
    context.close()


def persist(command_id: int, segment_id: str, key: str, offset: int) -> pb.NodeCommand:
    command = pb.NodeCommand(command_id=command_id)
    command.persist.segment_id = segment_id
    command.persist.objects.add(key=key, offset=offset, size=OBJECT, generation=command_id)
    return command


def fails_once(real: Callable[..., None], what: str) -> Callable[..., None]:
    """``real``, but its first call raises EIO having done nothing: what a sync that met a
    writeback error looks like, the error reported once and the pages left clean."""
    calls = 0

    def failing(*args: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError(errno.EIO, f"{what}: Input/output error")
        real(*args)

    return failing


def recorded(segment: Segment) -> list[str]:
    return sorted(live_entries(Path(str(segment.path) + INDEX_SUFFIX)))


def a_group_of_two(segment: Segment) -> list[pb.NodeCommand]:
    for offset in (0, 1 << 20):
        segment.memory[offset : offset + OBJECT] = os.urandom(OBJECT)
    return [persist(1, segment.segment_id, "a", 0), persist(2, segment.segment_id, "b", 1 << 20)]


def test_a_group_whose_data_sync_fails_fails_every_command_and_records_none(
    segment: Segment, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = a_group_of_two(segment)
    monkeypatch.setattr(segment_module, "_msync", fails_once(segment_module._msync, "msync"))

    results = CommandExecutor([segment]).execute_group(commands)

    assert [(r.command_id, r.ok) for r in results] == [(1, False), (2, False)]
    for result in results:
        assert result.error.startswith("SyncFailed: [Errno 5]") and "msync" in result.error
        assert not result.crc32c
    assert recorded(segment) == [], "nothing of a group whose bytes failed to sync is durable"
    assert segment.index.entries() == []


def test_a_group_whose_index_sync_fails_fails_every_command_and_records_none(
    segment: Segment, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = a_group_of_two(segment)
    monkeypatch.setattr(
        object_index.os, "fdatasync", fails_once(object_index.os.fdatasync, "fdatasync")
    )

    results = CommandExecutor([segment]).execute_group(commands)

    assert [(r.command_id, r.ok) for r in results] == [(1, False), (2, False)]
    assert all("fdatasync" in r.error for r in results)
    assert recorded(segment) == []
    assert segment.index.entries() == []


def test_a_group_whose_sync_fails_is_answered_as_a_single_persist_would_be(
    segment: Segment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(The same error, so the master and the writer hear of the disk as they do for one.
    The group runs first: after it, the segment refuses every record, a single one too.)"""
    commands = a_group_of_two(segment)
    monkeypatch.setattr(segment_module, "_msync", fails_once(segment_module._msync, "msync"))
    grouped = CommandExecutor([segment]).execute_group(commands)

    single = CommandExecutor([segment]).execute(commands[0])

    assert not single.ok
    assert [(r.ok, r.error.split("]")[0], r.source_corrupt) for r in grouped] == [
        (single.ok, single.error.split("]")[0], single.source_corrupt)
    ] * 2
    assert grouped[0].error == grouped[1].error == "SyncFailed: [Errno 5] msync: Input/output error"


def test_an_object_out_of_bounds_still_fails_alone_when_no_sync_failed(
    segment: Segment,
) -> None:
    """(The per-command retry stays for errors raised before any sync.)"""
    commands = [*a_group_of_two(segment), persist(3, segment.segment_id, "beyond", SIZE - 10)]

    results = CommandExecutor([segment]).execute_group(commands)

    assert [r.ok for r in results] == [True, True, False]
    assert "outside segment" in results[2].error
    assert recorded(segment) == ["a", "b"]


def test_after_a_failed_sync_the_segment_records_nothing_more_even_alone(
    segment: Segment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the disk failed a sync of the segment, a later sync of the same file may return
    0 with bytes that never reached it (the error is reported once): a Persist sent again,
    or any later one, must not be recorded as durable on the kernel's word. Until the node
    restarts (its reopening checks every object), the segment records nothing more."""
    commands = a_group_of_two(segment)
    monkeypatch.setattr(segment_module, "_msync", fails_once(segment_module._msync, "msync"))
    executor = CommandExecutor([segment])
    assert not any(r.ok for r in executor.execute_group(commands))

    again = executor.execute(persist(3, segment.segment_id, "a", 0))  # (the master's retry)
    later = executor.execute(persist(4, segment.segment_id, "c", 2 << 20))
    assert not again.ok and not later.ok
    assert "records nothing more" in later.error and "Restart the node" in later.error
    assert recorded(segment) == []


def test_an_object_whose_bytes_cannot_be_read_fails_alone_before_any_sync(
    segment: Segment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A read of one object's bytes for its checksum fails before any sync: no writeback
    error is used up, so the others are recorded one at a time, as before.)"""
    commands = a_group_of_two(segment)
    real = segment_module._fault_in
    unreadable = segment.region.address + (1 << 20)  # (object b)

    def fault_in(address: int, size: int) -> None:
        if address == unreadable:
            raise OSError(errno.EIO, "a bad block")
        real(address, size)

    monkeypatch.setattr(segment_module, "_fault_in", fault_in)
    results = CommandExecutor([segment]).execute_group(commands)

    assert [r.ok for r in results] == [True, False]
    assert recorded(segment) == ["a"]
