"""When the master hands freed memory back to the system (common/memory_trim.py).

glibc keeps freed heap memory resident; ``malloc_trim`` releases it. The rule trims once the
resident size has grown by its ``growth`` since the last trim, looking no more often than
every ``every`` seconds.
"""

from __future__ import annotations

import threading

import pytest

from kvpool.common.memory_trim import TrimRule, malloc_trim, resident_bytes

MiB = 1 << 20


class Resident:
    """A resident size the test sets, counting how often the rule read it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.size


def test_it_is_time_to_trim_once_the_resident_size_grew_by_the_growth():
    rule, resident = TrimRule(growth=64 * MiB, every=10.0), Resident(100 * MiB)
    assert not rule.due(0.0, resident)  # the first look sets where growth counts from
    resident.size = 163 * MiB
    assert not rule.due(10.0, resident)
    resident.size = 164 * MiB
    assert rule.due(20.0, resident)


def test_growth_counts_from_what_stayed_resident_after_the_last_trim():
    rule, resident = TrimRule(growth=64 * MiB, every=1.0), Resident(100 * MiB)
    rule.due(0.0, resident)
    resident.size = 400 * MiB
    assert rule.due(1.0, resident)
    rule.trimmed(300 * MiB)  # (the rest is live)
    resident.size = 350 * MiB
    assert not rule.due(2.0, resident)
    resident.size = 364 * MiB
    assert rule.due(3.0, resident)


def test_a_smaller_resident_size_lowers_where_growth_counts_from():
    rule, resident = TrimRule(growth=64 * MiB, every=1.0), Resident(300 * MiB)
    rule.due(0.0, resident)
    resident.size = 100 * MiB  # (given back by itself)
    assert not rule.due(1.0, resident)
    resident.size = 170 * MiB
    assert rule.due(2.0, resident)


def test_the_resident_size_is_read_at_most_once_every_interval():
    rule, resident = TrimRule(growth=64 * MiB, every=10.0), Resident(100 * MiB)
    for tick in range(100):  # ten ticks a second for ten seconds
        rule.due(tick / 10, resident)
    assert resident.reads == 1
    rule.due(10.0, resident)
    assert resident.reads == 2


@pytest.mark.skipif(malloc_trim is None, reason="the C library is not glibc")
def test_after_a_trim_what_another_thread_freed_is_no_longer_resident():
    """What the rule is for. (Whether ``free`` alone would have given it back depends on the
    heap's state, which other threads of this process share: here, freed blocks sit between
    live small ones, which it usually does not give back.)"""
    kept: list[bytes] = []
    freed: list[bytes] = []

    def allocate() -> None:
        for _ in range(1500):  # 100 KiB blocks: below the size glibc maps on its own
            freed.append(b"x" * (100 << 10))
            kept.append(b"y" * 600)  # (past pymalloc's 512 bytes: from the same heap)

    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join()
    before = resident_bytes()
    freed.clear()
    malloc_trim()
    after = resident_bytes()
    # (146 MiB freed; most of it given back, not all: a few blocks stay in glibc's caches
    # of the thread, and a busy test worker's heap holds more of them; 94 MiB was seen)
    assert before - after > 64 * MiB, (before, after)
