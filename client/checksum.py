"""End-to-end checksums: CRC-32C, computed by the writer, stored by the master, checked by
readers (and by storage nodes for what they keep across restarts). Hardware-accelerated."""

from __future__ import annotations

from collections.abc import Iterable

import google_crc32c

from kvpool.transport import ucp


def crc32c_at(address: int, length: int) -> int:
    """CRC-32C of ``length`` bytes at ``address``."""
    return google_crc32c.value(ucp.view_of(address, length))


def crc32c_of_pieces(pieces: Iterable[tuple[int, int]]) -> int:
    """CRC-32C of the bytes of ``pieces`` ((address, length) each) one after another: that of
    the object they make up together."""
    crc = 0
    for address, length in pieces:
        if length:
            crc = google_crc32c.extend(crc, ucp.view_of(address, length))
    return crc
