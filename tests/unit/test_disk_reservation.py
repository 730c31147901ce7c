"""Reserving a segment file's blocks allocates every one of them and changes no byte: a
segment reopened after a restart keeps its objects, and its holes read as zeros."""

from __future__ import annotations

import os
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
