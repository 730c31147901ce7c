"""Get, exists and remove batches larger than one master call takes (4096 keys) go in parts,
within one deadline. Once a part is answered its keys are leased or removed, so a later part
that fails gives its error to its own keys: the call still returns the answered parts' bytes
and statuses, and the leases they took are given back when the client closes (before, the
call raised and those leases held every object until they ran out)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kvpool import Client
from kvpool.common import lane_protocol as lp
from kvpool.errors import InvalidKey, MasterUnavailable, ObjectHasLease
from kvpool.local_cluster import LocalCluster

PART = lp.MAX_BATCH_KEYS
#: Long enough that no lease runs out while a test looks at it.
LEASE_TTL = 120.0


@pytest.fixture(scope="module")
def admin(shared_cluster: LocalCluster) -> Iterator[Client]:
    with Client(shared_cluster.master_address, timeout=60) as client:
        yield client


@pytest.fixture
def stored(admin: Client) -> Iterator[list[tuple[str, bytes]]]:
    """Three parts' worth of small objects, each bytes of its own."""
    prefix = f"reads-{uuid.uuid4().hex[:8]}/"
    items = [(f"{prefix}{i:06d}", b"value %06d" % i) for i in range(3 * PART)]
    assert admin.put_many(items) == [1] * len(items)
    yield items
    admin.remove_prefix(prefix, force=True)


def fail_call(client: Client, method: str, which: int) -> None:
    """Makes the ``which``-th call (from 1) of ``method`` by ``client`` fail as a whole,
    before it reaches the master."""
    link = client._session.link
    real = link.call
    calls = 0

    def call(called: str, request: Any, deadline: float) -> Any:
        nonlocal calls
        if called == method:
            calls += 1
            if calls == which:
                raise MasterUnavailable("the master did not answer (made up by the test)")
        return real(called, request, deadline)

    link.call = call  # type: ignore[method-assign]


def assert_part_failed(results: list[Any], keys: list[str], first: int, last: int) -> None:
    """Entries ``first`` to ``last`` each hold the part's error, named for its key."""
    for i in range(first, last + 1):
        assert isinstance(results[i], MasterUnavailable), (i, results[i])
        assert results[i].key == keys[i]
    assert f"(entries {first} to {last}) failed" in str(results[first])
    assert "made up by the test" in str(results[last])


def test_get_many_returns_the_parts_answered_when_a_later_part_fails(
    shared_cluster: LocalCluster, admin: Client, stored: list[tuple[str, bytes]]
) -> None:
    keys = [key for key, _ in stored]
    with Client(shared_cluster.master_address, timeout=60, lease_ttl=LEASE_TTL) as reader:
        fail_call(reader, "GetReplicas", 2)
        results = reader.get_many(keys)
        assert results[:PART] == [data for _, data in stored[:PART]]
        assert results[2 * PART :] == [data for _, data in stored[2 * PART :]]
        assert_part_failed(results, keys, PART, 2 * PART - 1)
        # The answered parts' objects are leased to the reader until it closes.
        assert isinstance(admin.remove_many(keys[:1])[0], ObjectHasLease)
    assert admin.remove_many(keys) == [None] * len(keys)  # given back at close


def test_get_many_fails_as_a_whole_when_its_first_part_fails(
    shared_cluster: LocalCluster, stored: list[tuple[str, bytes]]
) -> None:
    """Nothing is leased yet then: the call raises, as any call's failure."""
    with Client(shared_cluster.master_address, timeout=60) as reader:
        fail_call(reader, "GetReplicas", 1)
        with pytest.raises(MasterUnavailable, match="made up by the test"):
            reader.get_many([key for key, _ in stored])


def test_exists_many_answers_the_parts_answered_when_a_later_part_fails(
    shared_cluster: LocalCluster, admin: Client, stored: list[tuple[str, bytes]]
) -> None:
    keys = [key for key, _ in stored]
    with Client(shared_cluster.master_address, timeout=60, lease_ttl=LEASE_TTL) as reader:
        fail_call(reader, "Exists", 3)
        found = reader.exists_many(keys)
        assert found[: 2 * PART] == [True] * (2 * PART)
        assert_part_failed(found, keys, 2 * PART, 3 * PART - 1)
        assert admin.remove_many(keys[-1:]) == [None]  # (never leased)
        assert isinstance(admin.remove_many(keys[:1])[0], ObjectHasLease)
    assert admin.remove_many(keys[: 2 * PART]) == [None] * (2 * PART)  # given back at close


def test_remove_many_answers_per_key_when_a_later_part_fails(
    shared_cluster: LocalCluster, admin: Client, stored: list[tuple[str, bytes]]
) -> None:
    """The entries named are the caller's, counting keys refused before any call."""
    keys = ["", *(key for key, _ in stored)]  # (an invalid key first: never sent)
    with Client(shared_cluster.master_address, timeout=60) as remover:
        fail_call(remover, "Remove", 2)
        results = remover.remove_many(keys)
    assert isinstance(results[0], InvalidKey)
    assert results[1 : PART + 1] == [None] * PART
    assert_part_failed(results, keys, PART + 1, 2 * PART)
    assert results[2 * PART + 1 :] == [None] * PART
    still = admin.exists_many(keys[1:], lease=False)
    assert still == [False] * PART + [True] * PART + [False] * PART


def test_every_lease_of_a_get_many_larger_than_the_client_remembers_is_given_back_at_close(
    shared_cluster: LocalCluster, admin: Client, stored: list[tuple[str, bytes]]
) -> None:
    """A client remembers its latest 4096 leases at least (a bound on its memory), and every
    key of the call at hand: 12,288 leased at once are all given back."""
    keys = [key for key, _ in stored]
    with Client(shared_cluster.master_address, timeout=60, lease_ttl=LEASE_TTL) as reader:
        assert reader.get_many(keys) == [data for _, data in stored]
    assert admin.remove_many(keys) == [None] * len(keys)


def test_leases_a_failed_release_did_not_end_are_given_back_at_close(
    shared_cluster: LocalCluster, admin: Client, stored: list[tuple[str, bytes]]
) -> None:
    keys = [key for key, _ in stored[:8]]
    with Client(shared_cluster.master_address, timeout=60, lease_ttl=LEASE_TTL) as reader:
        assert reader.exists_many(keys) == [True] * len(keys)
        fail_call(reader, "ReleaseLeases", 1)
        with pytest.raises(MasterUnavailable, match="made up by the test"):
            reader.release_leases(keys)
        assert isinstance(admin.remove_many(keys[:1])[0], ObjectHasLease)
    assert admin.remove_many(keys) == [None] * len(keys)
