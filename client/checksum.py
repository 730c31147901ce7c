"""End-to-end checksums: computed by the writer, stored by the master, checked by readers."""

from __future__ import annotations

import zlib
from typing import Any


def crc32_of(buffer: Any) -> int:
    """CRC-32 of any contiguous buffer (zlib releases the GIL for large ones)."""
    return zlib.crc32(memoryview(buffer).cast("B"))
