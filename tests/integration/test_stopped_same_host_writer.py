"""A same-host writer stopped in the middle of its copy never lands in another object.

A client that maps a node's memory (or writes its NVMe file) copies a put's bytes itself;
nothing can stop that copy from outside. Here the writer's process is stopped (SIGSTOP) in
the middle of its write, as the kernel may stop it at any instruction (a frozen cgroup, a
paused VM, heavy swapping), while its reservation is removed and the master's reclaim delay
passes. Before, the master then placed the next object there, and the writer, once
continued, finished its copy into that published object: read back wrong, with no error.
Now the writer holds a lock on the range while it copies (transport/writer_locks.py), the
node answers the Forget of the range only once the lock is gone, and the master keeps the
space out of use until then.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kvpool import Client

MIB = 1 << 20
SIZE = 4 * MIB
#: The master's --write-timeout: the writer reserves, then starts its copy within it.
WRITE_TIMEOUT = 3

#: The writer: reserves "victim/a", and on a line on stdin writes it. Into DRAM, its first
#: large memory copy is done in two halves with a SIGSTOP of its own process between them
#: (the name memory_copy.ctypes is pointed at a shim); into an NVMe file, it stops after a
#: piece's deadline check, before the piece's write. No kvpool code is changed.
WRITER = textwrap.dedent(
    """
    import ctypes, json, os, signal, sys, types
    from kvpool import Client
    from kvpool.transport import memory_copy
    from kvpool.transport.shared_file import SharedFile

    real = ctypes.memmove
    stopped = []

    def memmove(target, source, length):
        if length >= (1 << 20) and not stopped:
            stopped.append(True)
            real(target, source, length // 2)
            os.kill(os.getpid(), signal.SIGSTOP)  # (stopped here, mid-copy)
            return real(target + length // 2, source + length // 2, length - length // 2)
        return real(target, source, length)

    write_blocks = SharedFile._write_blocks

    def stopping_write_blocks(self, source, length, offset):
        if length >= (1 << 20) and not stopped:
            stopped.append(True)
            os.kill(os.getpid(), signal.SIGSTOP)  # (stopped here, its deadline checked)
        return write_blocks(self, source, length, offset)

    memory_copy.ctypes = types.SimpleNamespace(memmove=memmove)
    SharedFile._write_blocks = stopping_write_blocks
    master, credentials, size = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    tier = sys.argv[4]
    with Client(master, timeout=30, copy_threads=1, **credentials) as client:
        reservation = client.reserve("victim/a", size, tier=tier)
        print("RESERVED", flush=True)
        sys.stdin.readline()
        try:
            reservation.write(b"A" * size)
            reservation.commit()
            print("COMMITTED", flush=True)
        except Exception as error:
            print("REFUSED", type(error).__name__, flush=True)
    """
)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize(
    ("tier", "secure", "removed"),
    [
        ("dram", True, "mid-copy"),
        ("dram", False, "mid-copy"),
        ("dram", True, "before-copy"),
        ("nvme", True, "before-copy"),
    ],
    ids=["dram-secure", "dram-insecure", "dram-removed-first", "nvme-removed-first"],
)
def test_a_writer_stopped_mid_copy_past_the_reclaim_delay_spoils_no_other_object(
    cluster_factory, tmp_path, monkeypatch, tier, secure, removed
):
    """``removed``: the reservation is removed while the writer is stopped mid-copy, or
    before its copy begins (within its write window: it locks the range after the node
    first heard the reservation was gone)."""
    cluster = cluster_factory(
        0,
        "64MiB",
        secure=secure,
        master_args=["--reclaim-delay", "1", "--write-timeout", str(WRITE_TIMEOUT)],
    )
    nvme = ["--nvme", str(tmp_path / "nvme"), "--nvme-size", "256MiB"] if tier == "nvme" else []
    cluster.add_node(extra=nvme)
    credentials = cluster.client_credentials()
    if not secure:
        for name in ("KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE", "KVPOOL_TLS_CA"):
            monkeypatch.delenv(name, raising=False)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen(
        [
            sys.executable,
            str(script),
            cluster.master_address,
            json.dumps(credentials),
            str(SIZE),
            tier,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "RESERVED"
        reserved_at = time.monotonic()
        with Client(cluster.master_address, timeout=30, **credentials) as holder:
            holder.put("warm", b"w" * 4096, tier=tier)  # (maps the segment, or opens its file)
            holder.remove("warm")
            writes_itself = holder._session.data.mapped_for(writing=True)
            assert writes_itself, "the test needs a client that writes the segment itself"
            if removed == "before-copy":
                holder.remove("victim/a", force=True)
                time.sleep(0.3)  # (the node hears of it: no lock on the range yet)
            writer.stdin.write("go\n")
            writer.stdin.flush()
            deadline = time.monotonic() + 20
            while not _stopped(writer.pid):
                assert time.monotonic() < deadline, "the writer never reached its copy"
                time.sleep(0.005)
            if removed == "mid-copy":
                holder.remove("victim/a", force=True)
            # past the writer's window and the reclaim delay, and a Forget's answer
            time.sleep(max(0.0, reserved_at + WRITE_TIMEOUT + 3.0 - time.monotonic()))

            data = os.urandom(SIZE)
            assert holder.put("victim/b", data, tier=tier) == 1
            assert holder.get("victim/b") == data

            os.kill(writer.pid, signal.SIGCONT)
            outcome = writer.stdout.readline().split()
            assert writer.wait(timeout=30) == 0
            assert outcome[:1] == ["REFUSED"], f"its reservation was removed: {outcome}"
            got = holder.get("victim/b")
            spoilt = sum(got[at : at + 4096] != data[at : at + 4096] for at in range(0, SIZE, 4096))
            assert spoilt == 0, f"{spoilt} of {SIZE // 4096} pages of victim/b were overwritten"
    finally:
        if writer.poll() is None:
            os.kill(writer.pid, signal.SIGCONT)
            writer.kill()
            writer.wait()
