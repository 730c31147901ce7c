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
