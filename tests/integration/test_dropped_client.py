"""A Client dropped without ``close()`` lets go of what it held once it is collected: its
connections, UCX worker, mapped memory and threads. Before, each one left a long-running
process about a dozen descriptors (hundreds with mapped segments) and a thread for good,
until it ran out of descriptors."""

from __future__ import annotations

import gc
import os
import threading
import warnings

import pytest
from helpers import wait_until

from kvpool import Client


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("mapping", [True, False], ids=["mapped", "ucx"])
def test_clients_dropped_without_close_give_back_their_descriptors_and_threads(
    shared_cluster, mapping
):
    credentials = shared_cluster.client_credentials()
    with Client(shared_cluster.master_address, **credentials) as owner:
        owner.put(f"dropped-client-{mapping}", b"d" * 4096)

    def read_and_drop() -> None:
        client = Client(shared_cluster.master_address, same_host_mapping=mapping, **credentials)
        assert client.get(f"dropped-client-{mapping}") == b"d" * 4096

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        read_and_drop()  # (whatever a first client sets up once per process)
        gc.collect()
        assert wait_until(_closed_all, 10)
        descriptors, threads = _descriptors(), threading.active_count()
        for _ in range(8):
            read_and_drop()
        gc.collect()
        assert wait_until(lambda: _descriptors() <= descriptors + 2, 10), (
            f"{_descriptors() - descriptors} descriptors more after 8 clients were dropped"
        )
        assert wait_until(_closed_all, 10)
        assert threading.active_count() <= threads
    unclosed = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(unclosed) == 9 and "was never closed" in str(unclosed[0].message)


def _closed_all() -> bool:
    """Whether no dropped client is still being closed."""
    return not any(t.name == "kvpool-client-close" for t in threading.enumerate())


def test_a_reservation_keeps_the_client_it_came_from_open(shared_cluster):
    """A reservation works through its client's session: the client, dropped while the
    reservation lives, must not be collected (and closed) under its writes."""
    credentials = shared_cluster.client_credentials()
    reservation = Client(shared_cluster.master_address, **credentials).reserve("kept-open", 4096)
    gc.collect()
    reservation.write(b"k" * 4096)
    assert reservation.commit() >= 1
    with Client(shared_cluster.master_address, **credentials) as reader:
        assert reader.get("kept-open") == b"k" * 4096
    del reservation
    gc.collect()
