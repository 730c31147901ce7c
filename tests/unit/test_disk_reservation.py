"""Reserving a segment file's blocks allocates every one of them and changes no byte: a
segment reopened after a restart keeps its objects, and its holes read as zeros. A size past
the largest file allowed is refused naming that limit (here the process's RLIMIT_FSIZE; a
file system's own: tests/integration/test_nvme_disk_reservation.py)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from kvpool.storage_node.disk_reservation import reserve

MiB = 1 << 20


def test_every_block_is_allocated_and_the_bytes_written_before_stay(tmp_path: Path):
    path = tmp_path / "segment.data"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 8 * MiB)
        os.pwrite(fd, b"object", 3 * MiB)  # (recorded before a restart)
        assert os.fstat(fd).st_blocks * 512 < MiB, "sparse to begin with"
        assert reserve(fd, 8 * MiB, str(tmp_path)) is True
        assert os.fstat(fd).st_blocks * 512 >= 8 * MiB
        assert os.fstat(fd).st_size == 8 * MiB
        assert os.pread(fd, 6, 3 * MiB) == b"object"
        assert os.pread(fd, 4096, 5 * MiB) == bytes(4096)
        assert reserve(fd, 8 * MiB, str(tmp_path)) is True, "again: nothing left to do"
    finally:
        os.close(fd)


_SET_SIZE = """
import os, sys
from kvpool.storage_node.disk_reservation import FileTooLarge, set_size
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    set_size(fd, 2 << 30, "there")
except FileTooLarge as error:
    print(error)
"""


def test_a_size_past_the_process_file_size_limit_is_refused_naming_the_limit(tmp_path: Path):
    """RLIMIT_FSIZE (``ulimit -f``) refuses a longer file with EFBIG, Python ignoring the
    SIGXFSZ that comes with it: the refusal names the limit, and the file keeps its bytes."""
    path = tmp_path / "segment.data"
    path.write_bytes(b"object")

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, resource.RLIM_INFINITY))

    done = subprocess.run(
        [sys.executable, "-c", _SET_SIZE, str(path)],
        preexec_fn=limited,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    message = done.stdout
    assert "the NVMe segment of 2.0 GiB is larger than one file may be in there" in message
    assert "RLIMIT_FSIZE, `ulimit -f`) is 1.0 GiB" in message, message
    assert "pass --nvme-size 1GiB or less" in message, message
    assert path.read_bytes() == b"object"
