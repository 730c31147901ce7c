"""A wait for the NVMe disk stalls the thread that waits, never the whole node.

Recording an object on NVMe syncs its bytes, and copying into (or out of) the NVMe mapping
faults its pages in: both wait for the disk. A thread that waits holding Python's GIL stops
every other thread of the node meanwhile (its heartbeats, its DRAM tier, its metrics), and a
disk that hangs then makes the master declare the whole node dead. So every such wait runs
with the GIL released. Shown on this machine's disk, with a ticker thread that wakes every
millisecond: while the node's thread waits, the ticker keeps ticking.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import google_crc32c
import pytest

from kvpool.common.status import Tier
from kvpool.storage_node.object_index import Entry
from kvpool.storage_node.segment import (
    Segment,
    allocate_dram_segment,
    open_persistent_segment,
)
from kvpool.transport import ucp

OBJECT = 64 << 20
#: An operation shorter than this cannot tell a held GIL from a released one.
MEASURABLE = 0.02


@pytest.fixture
def context() -> Iterator[ucp.Context]:
    context = ucp.Context({"TLS": "tcp"})
    yield context
    context.close()


@pytest.fixture
def nvme(context: ucp.Context, tmp_path: Path) -> Iterator[Segment]:
    segment = open_persistent_segment(context, "n1", tmp_path / "nvme", 2 * OBJECT, Tier.NVME)
    yield segment
    segment.close()


def longest_stall(operation: Callable[[], object]) -> tuple[float, float]:
    """(how long ``operation`` took, the longest another thread went without running
    meanwhile)."""
    ticks: list[float] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.02)
    began = time.monotonic()
    operation()
    took = time.monotonic() - began
    time.sleep(0.02)
    stop.set()
    thread.join()
    gaps = [later - earlier for earlier, later in itertools.pairwise(ticks)]
    return took, max(gaps)


def assert_other_threads_ran(took: float, stall: float, what: str) -> None:
    if took < MEASURABLE:
        pytest.skip(f"{what} took {took:.3f} s here: too quick to tell")
    assert stall < took / 2, (
        f"{what} took {took:.3f} s and stopped every other thread for {stall:.3f} s of it: "
        "it waited for the disk holding the GIL"
    )


def test_recording_an_nvme_object_lets_other_threads_run_while_its_bytes_sync(nvme):
    data = os.urandom(1 << 20) * (OBJECT >> 20)
    ctypes.memmove(nvme.region.address, data, OBJECT)  # (as a client's one-sided write lands)
    entry = Entry("k", 0, OBJECT, 1)

    took, stall = longest_stall(lambda: nvme.record([entry]))

    assert nvme.index.entries() == [entry._replace(crc32c=google_crc32c.value(data))]
    assert_other_threads_ran(took, stall, "recording (checksum, sync of bytes and index)")


def test_a_copy_into_nvme_lets_other_threads_run_while_its_pages_fault_in(context, nvme):
    dram = allocate_dram_segment(context, "n1", OBJECT)
    try:
        data = os.urandom(1 << 20) * (OBJECT >> 20)
        dram.memory[:OBJECT] = data
        target = Entry("k", OBJECT, OBJECT, 1)

        took, stall = longest_stall(lambda: nvme.copy_from(dram, 0, target))

        assert nvme.memory[OBJECT : 2 * OBJECT] == data
        assert nvme.index.entries() == [target._replace(crc32c=google_crc32c.value(data))]
        assert_other_threads_ran(took, stall, "a demotion to NVMe (copy, checksum, sync)")
    finally:
        dram.close()
