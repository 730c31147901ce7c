"""A persistent segment syncs the bytes of a Persist's objects one run at a time: objects that
lie back to back (as a batch is placed) share one sync, and no byte is left out."""

from __future__ import annotations

import itertools
import random

from kvpool.storage_node.segment import _runs


def test_objects_back_to_back_make_one_run_and_gaps_split_runs():
    assert _runs([(0, 4096), (4096, 8192), (8192, 9000)]) == [(0, 9000)]
    assert _runs([(8192, 9000), (0, 4096), (4096, 8192)]) == [(0, 9000)], "in any order"
    assert _runs([(0, 100), (200, 300)]) == [(0, 100), (200, 300)]
    assert _runs([(0, 100), (50, 80), (100, 100)]) == [(0, 100)], "inside, empty at the end"
    assert _runs([]) == []


def test_runs_cover_exactly_the_bytes_of_the_objects():
    rng = random.Random(9)
    for _ in range(200):
        ranges = []
        for _ in range(rng.randrange(1, 30)):
            start = rng.randrange(0, 10_000)
            ranges.append((start, start + rng.randrange(0, 500)))
        runs = _runs(ranges)
        covered = {b for start, end in ranges for b in range(start, end)}
        assert {b for start, end in runs for b in range(start, end)} == covered
        assert all(a_end < b_start for (_, a_end), (b_start, _) in itertools.pairwise(runs)), runs
