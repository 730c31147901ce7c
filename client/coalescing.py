"""Merging transfers that continue one another into one (sans-IO).

A batch of small objects written together is usually placed back to back in one segment
(the master carves consecutive buffers out of one free extent) and often read into, or
written from, consecutive slots of one buffer (a KV cache's pages). Each transfer costs a
UCX operation, or a Python-level copy on a mapped segment, whatever its size: 32 transfers of
4 KiB cost several times one of 128 KiB. Transfers are merged only where both sides continue
exactly (same segment, remote and local addresses each following on), in the order given,
and only up to ``limit`` bytes: large transfers gain nothing from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

#: Merged transfers grow up to this many bytes.
COALESCE_LIMIT = 4 * 1024 * 1024


class TransferLike(Protocol):
    segment_id: str
    remote_address: int
    local_address: int
    length: int

    # A merged transfer is made as ``type(first)(segment_id, remote, local, length)``.
    def __init__(
        self, segment_id: str, remote_address: int, local_address: int, length: int
    ) -> None: ...


T = TypeVar("T", bound=TransferLike)


def coalesce(transfers: Sequence[T], limit: int = COALESCE_LIMIT) -> tuple[list[T], list[range]]:
    """The transfers to run, and for each the indexes of the given ones it carries out."""
    merged: list[T] = []
    members: list[range] = []
    run_start = 0  # the run of transfers merging into merged[-1]: run_start .. i - 1
    length = 0  # its bytes so far
    for i, transfer in enumerate(transfers):
        if i:
            last = merged[-1]
            if (
                transfer.segment_id == last.segment_id
                and transfer.remote_address == last.remote_address + length
                and transfer.local_address == last.local_address + length
                and length + transfer.length <= limit
            ):
                length += transfer.length
                continue
            _close_run(merged, members, run_start, i, length)
        merged.append(transfer)
        run_start, length = i, transfer.length
    if transfers:
        _close_run(merged, members, run_start, len(transfers), length)
    return merged, members


def _close_run(merged: list[T], members: list[range], start: int, end: int, length: int) -> None:
    """merged[-1] now carries transfers start .. end - 1: ``length`` bytes in all."""
    if end - start > 1:
        last = merged[-1]
        merged[-1] = type(last)(last.segment_id, last.remote_address, last.local_address, length)
    members.append(range(start, end))
