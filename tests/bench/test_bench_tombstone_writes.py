"""``python -m bench.tombstone_writes`` measures what it says on a real etcd: the pieces put
a fraction of what whole records put, and etcd's memory is read from the live process."""

from __future__ import annotations

import asyncio

from bench import tombstone_writes


def test_pieces_put_a_fraction_of_whole_records_into_etcd():
    pieces, whole = (
        asyncio.run(tombstone_writes.measure(layout, keys=800, changes=40, sample_every=10))
        for layout in ("pieces", "whole")
    )
    assert whole["bytes"] > 5 * pieces["bytes"] > 0
    for row in (pieces, whole):
        assert 0 < row["rss_start"] <= row["rss_peak"]
        assert row["write_ms"] > 0
