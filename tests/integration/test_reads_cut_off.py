"""A read cut off on its node (its replica removed or moved away meanwhile) is not taken for
a node out of reach: the client locates the object again, once, and reads it where it is
now, or says it is gone.

Over the checked stream (the secure default), a node ends a read in flight whose range it
is told to forget by closing the connection, and refuses one not begun (SEALED). Before,
the client reported such a read as "no storage node holding it can be reached" and avoided
that healthy node for its next puts.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kvpool import Client
from kvpool.errors import KVPoolError, ObjectNotFound

SIZE = 128 << 20


@pytest.fixture(scope="module")
def clients(shared_cluster):
    address = shared_cluster.master_address
    with (
        Client(address, timeout=20, same_host_mapping=False) as reader,
        Client(address, timeout=20) as remover,
    ):
        yield reader, remover


def test_a_read_cut_off_by_a_forced_removal_ends_object_not_found_and_keeps_the_node(clients):
    reader, remover = clients
    buffer = np.empty(SIZE, np.uint8)
    outcomes = []
    for attempt in range(8):
        key = f"cut-off/{attempt}-{time.monotonic_ns()}"
        remover.put(key, np.full(SIZE, attempt + 1, np.uint8), tier="dram")
        outcome: dict[str, object] = {}

        def read(key: str = key, outcome: dict[str, object] = outcome) -> None:
            try:
                outcome["got"] = reader.get_into(key, buffer)
            except KVPoolError as error:
                outcome["got"] = error

        thread = threading.Thread(target=read)
        thread.start()
        time.sleep(0.01 * (attempt % 4))
        remover.remove(key, force=True)
        thread.join(30)
        got = outcome["got"]
        if got == SIZE:  # read whole before the removal reached it: every byte its own
            assert (buffer == attempt + 1).all()
        else:
            assert isinstance(got, ObjectNotFound), repr(got)
        outcomes.append(got)
        assert reader._session.data.unreachable.current() == [], "a healthy node avoided"
    assert any(isinstance(got, ObjectNotFound) for got in outcomes), "no read was cut off"
    # and the reader's node is as good as ever
    reader.put(f"cut-off/after-{time.monotonic_ns()}", b"still here")
