"""Transfers that continue one another run as one; nothing else is merged."""

from __future__ import annotations

import random

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


def test_any_sequence_becomes_maximal_runs_that_carry_exactly_the_given_bytes():
    """Random batches, some back to back, some not: every merged transfer is exactly its
    members laid end to end, and no two neighbouring runs could have been one."""
    rng = random.Random(3)
    for _ in range(300):
        transfers: list[Transfer] = []
        for _ in range(rng.randrange(0, 40)):
            size = rng.choice([0, 1, 64, 4 * KiB, 3000])
            if transfers and rng.random() < 0.7:
                last = transfers[-1]
                segment, remote, local = (
                    last.segment_id,
                    last.remote_address + last.length,
                    last.local_address + last.length,
                )
            else:
                segment, remote, local = (
                    rng.choice("st"),
                    rng.randrange(1 << 20),
                    rng.randrange(1 << 20),
                )
            transfers.append(Transfer(segment, remote, local, size))
        merged, members = coalesce(transfers, limit=16 * KiB)

        assert [i for run in members for i in run] == list(range(len(transfers)))
        for transfer, run in zip(merged, members, strict=True):
            first = transfers[run.start]
            assert (transfer.segment_id, transfer.remote_address, transfer.local_address) == (
                first.segment_id,
                first.remote_address,
                first.local_address,
            )
            assert transfer.length == sum(transfers[i].length for i in run)
            assert len(run) == 1 or transfer.length <= 16 * KiB
            for i in run[1:]:
                before, this = transfers[i - 1], transfers[i]
                assert this.segment_id == before.segment_id
                assert this.remote_address == before.remote_address + before.length
                assert this.local_address == before.local_address + before.length
        for (a, run_a), b in zip(zip(merged, members, strict=True), merged[1:], strict=False):
            continues = (
                b.segment_id == a.segment_id
                and b.remote_address == a.remote_address + a.length
                and b.local_address == a.local_address + a.length
            )
            first_of_b = transfers[run_a.stop]
            assert not continues or a.length + first_of_b.length > 16 * KiB, "could have merged"
