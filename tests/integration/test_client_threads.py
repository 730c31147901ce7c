"""One ``Client`` shared by threads: every thread gets its own bytes back, and the calls of
different threads run side by side rather than one after another, over both data paths (the
same-host mapping, and UCX with ``same_host_mapping=False``)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kvpool import Client
from kvpool.client import data_path

THREADS = 12
ROUNDS = 8


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("same_host_mapping", [True, False], ids=["mapped", "ucx"])
def test_threads_sharing_a_client_each_read_back_exactly_their_own_bytes(
    shared_cluster, same_host_mapping
):
    """12 threads, each putting and reading back batches of its own (whole objects, into
    buffers, ranges, parts) at the same time; every byte checked."""
    prefix = unique("threads")

    def worker(thread: int) -> int:
        checked = 0
        for round_ in range(ROUNDS):
            keys = [f"{prefix}/{thread}/{round_}/{i}" for i in range(16)]
            values = [os.urandom(4096 + 97 * i + thread) for i in range(16)]
            assert client.put_many(list(zip(keys, values, strict=True))) == [1] * 16
            assert client.get_many(keys) == values
            buffers = [bytearray(len(v)) for v in values]
            assert client.get_into_many(keys, buffers) == [len(v) for v in values]
            assert buffers == values
            assert client.get_range(keys[3], 100, 50) == values[3][100:150]
            parts_key = f"{prefix}/{thread}/{round_}/parts"
            client.put_parts(parts_key, [values[0], values[1]])
            head, tail = bytearray(len(values[0])), bytearray(len(values[1]))
            client.get_into_parts(parts_key, [head, tail])
            assert (head, tail) == (values[0], values[1])
            checked += 16
        return checked

    with Client(
        shared_cluster.master_address, timeout=60, same_host_mapping=same_host_mapping
    ) as client:
        with ThreadPoolExecutor(THREADS) as pool:
            assert sum(pool.map(worker, range(THREADS))) == THREADS * ROUNDS * 16
        assert bool(client.mapped_segments) == same_host_mapping, "the path meant to be taken"
        workers = client._session.data._lanes
        assert len(workers) <= data_path.MAX_WORKERS
        client.remove_prefix(f"{prefix}/", force=True)


@pytest.mark.parametrize("same_host_mapping", [True, False], ids=["mapped", "ucx"])
def test_a_small_read_is_not_held_up_by_another_threads_large_one(
    cluster_factory, same_host_mapping
):
    """While one thread reads 512 MiB, another thread's 4 KiB read completes: it does not
    wait for the large transfer to end. (The large read's buffer starts as canary bytes:
    its last byte still holding them shows the large read is still under way.)"""
    cluster = cluster_factory(1, "1GiB")
    size = 512 << 20
    with Client(
        cluster.master_address, timeout=120, same_host_mapping=same_host_mapping, copy_threads=1
    ) as client:
        client.put("large", np.full(size, 7, dtype=np.uint8))
        client.put("small", b"s" * 4096)
        big = np.zeros(size, dtype=np.uint8)
        small = bytearray(4096)
        overlapped = []
        for _ in range(3):  # (the large read may, rarely, be done first on a busy machine)
            big[:] = 0xA5
            reader = threading.Thread(target=client.get_into, args=("large", big))
            reader.start()
            while big[0] == 0xA5 and reader.is_alive():  # until its bytes begin to land
                time.sleep(0.0002)
            client.get_into("small", small)
            overlapped.append(big[-1] == 0xA5)
            reader.join()
            assert (big == 7).all() and small == b"s" * 4096
            if overlapped[-1]:
                break
        assert any(overlapped), "the small read waited for the large one each time"


def test_threads_that_write_first_together_start_one_heartbeat(shared_cluster):
    """A client with reservations tells the master it is alive: one heartbeat thread per
    client, however many threads put first at the same moment."""
    prefix = unique("heartbeat")
    barrier = threading.Barrier(8)

    def put(i: int) -> int:
        barrier.wait()
        return client.put(f"{prefix}/{i}", b"x")

    before = {t for t in threading.enumerate() if t.name == "kvpool-heartbeat"}
    with Client(shared_cluster.master_address) as client:
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(put, range(8))) == [1] * 8
        beating = {t for t in threading.enumerate() if t.name == "kvpool-heartbeat"} - before
        assert len(beating) == 1
        client.remove_prefix(f"{prefix}/", force=True)


def test_closing_waits_for_the_transfers_other_threads_run(cluster_factory):
    """``close`` while another thread reads 256 MiB: the read completes with its bytes (its
    mapping and worker are not taken from under it), and calls after close are refused."""
    cluster = cluster_factory(1, "512MiB")
    size = 256 << 20
    client = Client(cluster.master_address, timeout=60, copy_threads=1)
    client.put("large", np.full(size, 3, dtype=np.uint8))
    big = np.zeros(size, dtype=np.uint8)
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(client.get_into("large", big))
        except Exception as error:  # (recorded: the assertion below says what it was)
            outcome.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    while big[0] == 0 and reader.is_alive():
        time.sleep(0.0002)
    client.close()
    reader.join()
    assert outcome == [size]
    assert (big == 3).all()
    with pytest.raises(RuntimeError, match="closed"):
        client.get_into("large", big)
