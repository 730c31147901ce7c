"""The locks a same-host writer holds on a node's file while it copies into it
(transport/writer_locks.py): the node sees them on exactly the ranges held, and they go
with the writer's process, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from kvpool.transport import writer_locks

SIZE = 1 << 20


def _node_file() -> tuple[int, int]:
    """A segment's file as the node holds it, and the node's description for asking."""
    fd = os.memfd_create("segment")
    os.ftruncate(fd, SIZE)
    probe = writer_locks.own_description(fd, writable=True)
    assert probe is not None
    return fd, probe


def test_the_node_sees_a_lock_on_exactly_the_ranges_held_until_they_are_let_go():
    fd, probe = _node_file()
    mine = writer_locks.own_description(fd)
    assert mine is not None
    held = [(4096, 8192), (12288, 100)]  # (adjacent: the kernel merges them)
    writer_locks.hold(mine, held)
    assert writer_locks.written_at(probe, 4096, 1)
    assert writer_locks.written_at(probe, 12387, 10)
    assert not writer_locks.written_at(probe, 0, 4096)
    assert not writer_locks.written_at(probe, 12388, 4096)
    writer_locks.let_go(mine, held[:1])
    assert not writer_locks.written_at(probe, 4096, 8192)
    assert writer_locks.written_at(probe, 12288, 1), "the other range stays held"
    writer_locks.let_go(mine, held[1:])
    assert not writer_locks.written_at(probe, 0, SIZE)
    for descriptor in (mine, probe, fd):
        os.close(descriptor)


def test_a_writer_killed_while_it_holds_a_lock_leaves_none_behind():
    """Through a description of its own: the node's (handed over, shared) would keep it."""
    fd, probe = _node_file()
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os, sys
                from kvpool.transport import writer_locks
                handed = os.open("/proc/{os.getpid()}/fd/{fd}", os.O_RDWR)
                mine = writer_locks.own_description(handed)
                writer_locks.hold(mine, [(0, 4096)])
                print("held", flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "held"
        assert writer_locks.written_at(probe, 0, 1)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
        assert not writer_locks.written_at(probe, 0, SIZE)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        os.close(probe)
        os.close(fd)


def test_a_zero_length_range_is_no_lock():
    fd, probe = _node_file()
    writer_locks.hold(probe, [(0, 0)])
    assert not writer_locks.written_at(probe, 0, 0) and not writer_locks.written_at(probe, 0, 1)
    os.close(probe)
    os.close(fd)


def test_the_node_copies_nothing_into_a_range_a_writer_still_holds():
    """A promotion or move the master placed where a stopped writer may still copy (its
    space freed as the Forget went out, which holds back puts, not copies) fails."""
    from kvpool.common.status import WRITER_HOLDS_RANGE
    from kvpool.proto import master_pb2 as pb
    from kvpool.storage_node import commands
    from kvpool.storage_node.commands import CommandExecutor

    class Held:
        segment_id, persistent = "n1/dram0", False

        def writer_copying(self, ranges) -> bool:
            return True

        def copy_from(self, *args):
            raise AssertionError("copied into a range a writer holds")

    copy = pb.NodeCommand(command_id=7)
    copy.copy.source_segment_id = copy.copy.target_segment_id = "n1/dram0"
    copy.copy.target.key, copy.copy.target.offset, copy.copy.target.size = "k", 0, 4096
    executor = CommandExecutor([Held()])  # type: ignore[list-item]
    commands.WRITER_GRACE, grace = 0.02, commands.WRITER_GRACE
    try:
        result = executor.execute(copy)
    finally:
        commands.WRITER_GRACE = grace
    assert not result.ok and WRITER_HOLDS_RANGE in result.error, result.error
