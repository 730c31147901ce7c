"""Transfers that continue one another run as one; nothing else is merged."""

from __future__ import annotations

from kvpool.client.coalescing import coalesce
from kvpool.client.data_path import Transfer

KiB = 1024


def back_to_back(count: int, size: int, segment: str = "s", remote: int = 0x1000, local: int = 0):
    return [Transfer(segment, remote + i * size, local + i * size, size) for i in range(count)]


def test_consecutive_transfers_merge_into_one():
    merged, members = coalesce(back_to_back(32, 4 * KiB))
    assert merged == [Transfer("s", 0x1000, 0, 128 * KiB)]
    assert members == [range(0, 32)]


def test_nothing_merges_across_segments_gaps_or_reordered_memory():
    a, b = back_to_back(2, 4 * KiB)
    other_segment = Transfer("t", b.remote_address, b.local_address, b.length)
    remote_gap = Transfer("s", b.remote_address + 64, b.local_address, b.length)
    local_gap = Transfer("s", b.remote_address, b.local_address + 64, b.length)
    for second in (other_segment, remote_gap, local_gap):
        merged, members = coalesce([a, second])
        assert merged == [a, second]
        assert members == [range(0, 1), range(1, 2)]
    merged, _ = coalesce([b, a])  # the order given is kept, never sorted
    assert merged == [b, a]


def test_merges_stop_at_the_limit_and_every_index_is_accounted_for():
    transfers = back_to_back(10, 1000) + back_to_back(3, 10, segment="x")
    merged, members = coalesce(transfers, limit=4000)
    assert [t.length for t in merged] == [4000, 4000, 2000, 30]
    assert [list(m) for m in members] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12]]
    assert transfers[0].length == 1000, "the caller's transfers are left as they were"
