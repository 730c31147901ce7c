"""Mapping another process's memfd: what a same-host client does with a storage node's DRAM.

The owner is a real child process that creates a memfd, fills it, reports how to reach it, and
then does what it is told on stdin (read back a range, or exit). A node that hangs is a
process that accepts at its mapping socket and never answers.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from kvpool.transport.shared_memory import (
    MappedSegment,
    MappingRefused,
    Mappings,
    Reaper,
    SegmentFile,
    boot_id,
)

SIZE = 8 << 20

OWNER = f"""
import json, mmap, os, sys
fd = os.memfd_create("kvpool-test", os.MFD_CLOEXEC)
os.ftruncate(fd, {SIZE})
memory = mmap.mmap(fd, {SIZE}, flags=mmap.MAP_SHARED)
memory[:4096] = bytes(range(256)) * 16
st = os.fstat(fd)
info = dict(pid=os.getpid(), fd=fd, inode=st.st_ino, device=st.st_dev)
print(json.dumps(info), flush=True)
for line in sys.stdin:
    offset, length = map(int, line.split())
    print(memory[offset:offset + length].hex(), flush=True)
"""


@pytest.fixture
def owner():
    process = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    info = json.loads(process.stdout.readline())
    yield process, info
    process.kill()
    process.wait()


def _open(info: dict, **changes: int) -> MappedSegment:
    args = {**info, "size": SIZE, "remote_base": 0x7F0000000000, **changes}
    return MappedSegment.open(SegmentFile(**args))


def test_a_mapping_reads_what_the_owner_wrote_and_the_owner_sees_what_it_writes(owner):
    process, info = owner
    mapped = _open(info)
    try:
        local = mapped.local_address(0x7F0000000000, 4096)
        assert ctypes.string_at(local, 4096) == bytes(range(256)) * 16
        target = mapped.local_address(0x7F0000000000 + 5_000_000, 5)
        ctypes.memmove(target, b"hello", 5)
        process.stdin.write("5000000 5\n")
        process.stdin.flush()
        assert bytes.fromhex(process.stdout.readline().strip()) == b"hello"
        assert mapped.alive()
    finally:
        mapped.close()


def _resident_bytes(address: int) -> int:
    """Rss of the mapping that starts at ``address``, from /proc/self/smaps."""
    with open("/proc/self/smaps") as smaps:
        lines = smaps.read().splitlines()
    for i, line in enumerate(lines):
        if line.split("-")[0] == f"{address:x}":
            rss = next(entry for entry in lines[i + 1 :] if entry.startswith("Rss:"))
            return int(rss.split()[1]) * 1024
    raise AssertionError(f"no mapping at {address:#x}")


def test_the_page_tables_fill_in_the_background_before_any_copy(owner):
    """A first touch per page costs more than the copy: it is paid off the critical path."""
    _, info = owner
    mapped = _open(info)
    try:
        deadline = time.monotonic() + 5
        while _resident_bytes(mapped.address) < SIZE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _resident_bytes(mapped.address) == SIZE
    finally:
        mapped.close()


def test_clients_of_one_process_share_a_mapping_until_the_last_lets_go(owner):
    _, info = owner
    mappings = Mappings()
    where = SegmentFile(**info, size=SIZE, remote_base=0x7F0000000000)
    first = mappings.acquire(where)
    second = mappings.acquire(where)
    assert first is second and first.users == 2
    mappings.release(first)
    assert not first.closed  # the other client still copies through it
    assert ctypes.string_at(first.local_address(0x7F0000000000, 16), 16) == bytes(range(16))
    mappings.release(second)
    assert first.closed
    third = mappings.acquire(where)  # a later client maps afresh
    assert third is not first and not third.closed
    mappings.release(third)


def test_a_dead_nodes_mapping_stays_with_its_users_and_is_not_handed_out_again(owner):
    process, info = owner
    mappings = Mappings()
    where = SegmentFile(**info, size=SIZE, remote_base=0x7F0000000000)
    held = mappings.acquire(where)
    process.kill()
    process.wait()
    with pytest.raises(MappingRefused):
        mappings.acquire(where)
    assert not held.alive() and not held.closed  # its user lets go in its own time
    mappings.release(held)
    assert held.closed


def test_a_range_outside_the_segment_is_refused(owner):
    _, info = owner
    mapped = _open(info)
    try:
        with pytest.raises(ValueError, match="outside the segment"):
            mapped.local_address(0x7F0000000000 + SIZE - 10, 11)
        with pytest.raises(ValueError, match="outside the segment"):
            mapped.local_address(0x7F0000000000 - 1, 1)
    finally:
        mapped.close()


def test_a_file_that_is_not_the_advertised_one_is_refused(owner):
    """A reused pid or fd number shows up as another inode: never map the wrong memory."""
    _, info = owner
    with pytest.raises(MappingRefused, match="not the advertised segment"):
        _open(info, inode=info["inode"] + 1)
    with pytest.raises(MappingRefused, match="not the advertised segment"):
        _open(info, size=SIZE * 2)  # larger than the file: would fault past its end


def test_a_process_that_is_gone_or_unreachable_is_refused():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    with pytest.raises(MappingRefused):
        MappedSegment.open(SegmentFile(process.pid, 3, 1, 1, SIZE, 0))
    with pytest.raises(MappingRefused):
        MappedSegment.open(SegmentFile(os.getpid(), 999_999, 1, 1, SIZE, 0))


def test_the_reaper_reports_the_owners_exit_at_once_and_alive_turns_false(owner):
    process, info = owner
    mapped = _open(info)
    exited = threading.Event()
    reaper = Reaper(lambda segment_id: exited.set() if segment_id == "seg-1" else None)
    try:
        reaper.watch(mapped.pidfd, "seg-1")
        time.sleep(0.05)
        assert not exited.is_set()
        process.kill()
        assert exited.wait(timeout=5.0)
        assert not mapped.alive()
    finally:
        reaper.stop()
        mapped.close()
    assert not mapped.alive()  # closed


def test_boot_id_names_this_boot():
    with open("/proc/sys/kernel/random/boot_id") as file:
        assert boot_id() == file.read().strip() != ""


SILENT_NODE = """
import os, socket, sys, time
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind("\\0" + sys.argv[1])
listener.listen()
print(os.getpid(), flush=True)
held = []
while True:
    connection, _ = listener.accept()  # and never answers
    held.append(connection)
"""


@pytest.fixture
def silent_node():
    """A process that serves a mapping socket, accepts, and never answers (a node that hangs)."""
    name = f"kvpool-test-silent-{os.getpid()}-{time.monotonic_ns()}"
    process = subprocess.Popen(
        [sys.executable, "-c", SILENT_NODE, name], stdout=subprocess.PIPE, text=True
    )
    pid = int(process.stdout.readline())
    yield SegmentFile(pid, 3, 1, 1, SIZE, 0, socket_name=name, grant=b"grant")
    process.kill()
    process.wait()


def test_a_handover_that_hangs_ends_by_its_timeout_and_holds_up_no_other_mapping(
    owner, silent_node
):
    _, info = owner
    mappings = Mappings()
    outcome: list[BaseException] = []

    def hung() -> None:
        try:
            mappings.acquire(silent_node, timeout=1.5)
        except BaseException as error:
            outcome.append(error)

    started = time.monotonic()
    waiting = threading.Thread(target=hung)
    waiting.start()
    time.sleep(0.2)  # (the handover is under way)
    mapped = mappings.acquire(SegmentFile(**info, size=SIZE, remote_base=0))
    assert time.monotonic() - started < 1.0, "another segment was mapped meanwhile"
    assert waiting.is_alive()
    waiting.join(10)
    assert time.monotonic() - started < 3.0
    assert len(outcome) == 1 and isinstance(outcome[0], MappingRefused)
    mappings.release(mapped)
