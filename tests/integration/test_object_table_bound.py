"""A master holds at most ``--max-objects`` objects, every tenant's together, so that no
stream of tiny objects can grow its memory past what it was given (the default comes from its
memory limit). With real processes: puts beyond the bound evict the least recently used
objects, and every object still held reads back exactly; while nothing may be evicted (here:
everything is being written), a put is refused with an error that says what to do.
"""

from __future__ import annotations

import os

import pytest

from kvpool import Client
from kvpool.errors import NoSpace, ObjectNotFound

BOUND = 8


@pytest.fixture
def bounded(cluster_factory):
    return cluster_factory(1, "64MiB", master_args=["--max-objects", str(BOUND)])


def test_puts_beyond_the_bound_evict_the_least_recently_used_and_the_rest_read_back(bounded):
    objects = {f"table/{i}": os.urandom(1000 + i) for i in range(20)}
    with Client(bounded.master_address, timeout=10) as client:
        for key, data in objects.items():
            client.put(key, data, checksum=True)
        held = [key for key in objects if client.exists(key, lease=False)]
        assert held == list(objects)[-BOUND:]
        for key in held:
            assert client.get(key, verify=True) == objects[key]
        with pytest.raises(ObjectNotFound):
            client.get("table/0")
        assert client.cluster_status().objects == BOUND


def test_a_put_into_a_table_of_objects_being_written_is_refused_with_what_to_do(bounded):
    with Client(bounded.master_address, timeout=10) as client:
        writing = [client.reserve(f"writing/{i}", 100) for i in range(BOUND)]
        with pytest.raises(NoSpace, match="--max-objects") as refused:
            client.put("one-more", b"x")
        assert "retry shortly" in str(refused.value)
        for reservation in writing:
            reservation.revoke()
        client.put("one-more", b"x")
        assert client.get("one-more") == b"x"
