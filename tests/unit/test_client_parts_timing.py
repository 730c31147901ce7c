"""Which parts of a put of more than 4096 keys are sent (``Client._store_in_parts``): a part
whose turn comes with too little time left is not, judged by what it would take at the last
part's time per key. Driven with a stand-in for a part's store, whose time is proportional to
its keys (a healthy cluster), so that no master is needed."""

from __future__ import annotations

import time
from typing import Any

from kvpool.client.client import Client
from kvpool.common import lane_protocol as lp
from kvpool.errors import TransferError

PART = lp.MAX_BATCH_KEYS
PER_KEY = 0.0002  # (a whole part: 0.82 s)


class PartsOnly:
    """A client reduced to ``_store_in_parts``, its parts stored by ``_store`` below."""

    timeout = 0.0
    _not_sent = Client._not_sent
    _store_in_parts = Client._store_in_parts

    def _store(self, pairs: Any, part: dict, results: list, *_: Any) -> list:
        time.sleep(PER_KEY * len(part))
        for i in part:
            results[i] = 1
        return results


def stored_of(count: int, timeout: float) -> list[Any]:
    client = PartsOnly()
    client.timeout = timeout
    pairs = [(f"k{i}", b"x") for i in range(count)]
    results: list[Any] = [None] * count
    sources = {i: (0, 1, None) for i in range(count)}
    return client._store_in_parts(pairs, sources, results, None, time.monotonic() + timeout, None)


def test_a_small_last_part_with_time_enough_for_it_is_sent():
    # two whole parts, then 8 keys, with less than half a whole part's time to spare
    results = stored_of(2 * PART + 8, timeout=2 * PART * PER_KEY + 0.3)
    assert results == [1] * (2 * PART + 8)


def test_a_whole_part_with_too_little_time_left_is_not_sent():
    results = stored_of(3 * PART, timeout=2 * PART * PER_KEY + 0.2)
    assert results[: 2 * PART] == [1] * (2 * PART)
    assert all(isinstance(r, TransferError) for r in results[2 * PART :])
    assert "was not sent, and nothing was stored" in str(results[-1])
