"""Tenants of one cluster never reach each other's objects.

The rules, for a real secure cluster with client tokens of tenants ``a`` and ``b``:

- tenant B cannot see, read, stat, list, lease, remove, commit, revoke or trace tenant A's
  objects: not with A's exact key strings, not with the master's internal form of them
  (``a/<key>``), not by prefix, and not by removing "everything" (``remove_all``), over the
  metadata lane and over gRPC alike; what it gets is what a key never put gets (not found),
  never a hint that A holds the key;
- B cannot give back the read leases of A's client, even by naming A's client id;
- after B's attempts every object of A is still there, readable by A, byte for byte;
- the same key string in A and in B names two objects, with their own bytes;
- an admin lists the keys of every tenant, each behind its tenant's prefix; a client may not
  ask for the cluster's status (PERMISSION_DENIED).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from helpers import bearer

from kvpool import Client
from kvpool.common.status import KeyStatus
from kvpool.errors import ObjectHasLease, ObjectNotFound
from kvpool.local_cluster import LocalCluster
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc

#: Tenant A's objects, put once for the module; every test checks they are still whole.
A_OBJECTS = {
    "shared/one": b"A-one " * 500,
    "shared/two": b"A-two " * 700,
    "secret": b"A-secret " * 300,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with LocalCluster(
        1, "64MiB", tenants=("a", "b"), run_dir=tmp_path_factory.mktemp("tenants")
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def a(cluster) -> Iterator[Client]:
    with Client(cluster.master_address, **cluster.client_credentials("a")) as client:
        for key, value in A_OBJECTS.items():
            client.put(key, value)
        yield client


@pytest.fixture(scope="module", params=["lane", "grpc"])
def b(request, cluster, a) -> Iterator[Client]:
    """Tenant B's client, over the metadata lane and over gRPC only."""
    lane = request.param == "lane"
    with Client(
        cluster.master_address, metadata_lane=lane, **cluster.client_credentials("b")
    ) as client:
        yield client


@pytest.fixture(scope="module")
def stub(cluster) -> Iterator[master_pb2_grpc.MasterStub]:
    assert cluster.pki is not None
    credentials = grpc.ssl_channel_credentials(root_certificates=cluster.pki.ca.read_bytes())
    with grpc.secure_channel(cluster.master_address, credentials) as channel:
        yield master_pb2_grpc.MasterStub(channel)


def as_b(cluster) -> tuple[tuple[str, str], ...]:
    return bearer(cluster.tenant_tokens["b"])


def assert_a_objects_whole(cluster) -> None:
    """A's objects, read by a fresh client of A (no cache, no lease of its own before)."""
    with Client(cluster.master_address, **cluster.client_credentials("a")) as client:
        assert client.get_many(list(A_OBJECTS)) == list(A_OBJECTS.values())


def not_found(error: object) -> bool:
    """Exactly "no such key": not "being written", which would say that the key is held."""
    return type(error) is ObjectNotFound


def a_keys_as_b_might_name_them() -> list[str]:
    return [*A_OBJECTS, *(f"a/{key}" for key in A_OBJECTS), *(f"../a/{key}" for key in A_OBJECTS)]


def test_tenant_b_cannot_see_read_or_stat_tenant_a_objects_by_their_keys(cluster, a, b):
    keys = a_keys_as_b_might_name_them()
    assert b.exists_many(keys, lease=False) == [False] * len(keys)
    assert all(not_found(outcome) for outcome in b.get_many(keys))
    for key in keys:
        with pytest.raises(ObjectNotFound) as caught:
            b.stat(key)
        assert not_found(caught.value)
        assert b.story(key) == [], "B is told nothing of what happened to A's keys"
    assert_a_objects_whole(cluster)


def test_tenant_b_lists_none_of_tenant_a_keys_with_or_without_a_prefix(cluster, a, b):
    b.put(f"b-own-{b.client_id}", b"mine")
    for prefix in ("", "shared/", "shared", "s", "a/", "a", "secret"):
        listed = b.list_keys(prefix)
        assert not set(listed.keys) & {*A_OBJECTS, *(f"a/{key}" for key in A_OBJECTS)}, prefix
        assert all(not key.startswith("a/") for key in listed.keys)
    assert f"b-own-{b.client_id}" in b.list_keys().keys, "B's listing works: it holds B's own"
    assert set(A_OBJECTS) <= set(a.list_keys().keys)


def test_tenant_b_cannot_remove_tenant_a_objects_by_key_or_prefix(cluster, a, b):
    keys = a_keys_as_b_might_name_them()
    assert all(not_found(outcome) for outcome in b.remove_many(keys))
    assert all(not_found(outcome) for outcome in b.remove_many(keys, force=True))
    for prefix in (*A_OBJECTS, "shared/", "shared", "s", "a/", "a", "../a/"):
        assert b.remove_prefix(prefix, force=True).removed == 0, prefix
    b.put(f"b-doomed-{b.client_id}", b"doomed")
    removed = b.remove_all(force=True)
    assert removed.removed >= 1
    assert b.list_keys().keys == [], "B removed all of B's objects, and only those"
    assert_a_objects_whole(cluster)
    assert sorted(a.list_keys().keys) == sorted(A_OBJECTS)


def test_tenant_b_takes_no_lease_on_tenant_a_objects(cluster, a, b, stub):
    keys = [f"lease-target-{b.client_id}-{i}" for i in range(3)]
    for key in keys:
        a.put(key, key.encode())
    assert b.exists_many(keys, lease=True) == [False] * len(keys)
    assert all(not_found(outcome) for outcome in b.get_many(keys))
    for request, method in (
        (pb.GetReplicasRequest(client_id=b.client_id, keys=keys, lease_ms=600_000), "GetReplicas"),
        (pb.ExistsRequest(client_id=b.client_id, keys=keys, lease_ms=600_000), "Exists"),
    ):
        answer = getattr(stub, method)(request, metadata=as_b(cluster), timeout=10)
        statuses = (
            [o.status for o in answer.objects] if method == "GetReplicas" else answer.statuses
        )
        assert list(statuses) == [KeyStatus.NOT_FOUND] * len(keys), method
    # Were any of those a lease on A's object, this removal (without force) would be refused.
    assert a.remove_many(keys) == [None] * len(keys)
    assert_a_objects_whole(cluster)


def test_tenant_b_cannot_release_the_leases_of_a_client_of_tenant_a(cluster, a, stub):
    key = "held-by-a-reader"
    a.put(key, b"held")
    with Client(cluster.master_address, **cluster.client_credentials("a")) as reader:
        assert reader.get(key) == b"held"  # a read lease, under the reader's client id
        for client_id in (reader.client_id, f"a/a-client:{reader.client_id}"):
            request = pb.ReleaseLeasesRequest(client_id=client_id, keys=[key, f"a/{key}"])
            answer = stub.ReleaseLeases(request, metadata=as_b(cluster), timeout=10)
            assert answer.released == 0
        with pytest.raises(ObjectHasLease):
            a.remove(key)  # still leased by the reader
        # The reader's own tenant can give it back by the same call: B's try was a real one.
        request = pb.ReleaseLeasesRequest(client_id=reader.client_id, keys=[key])
        mine = bearer(cluster.tenant_tokens["a"])
        assert stub.ReleaseLeases(request, metadata=mine, timeout=10).released == 1
    a.remove(key)
    assert_a_objects_whole(cluster)


def test_tenant_b_cannot_commit_or_revoke_a_put_of_tenant_a(cluster, a, stub):
    key = "being-written-by-a"
    value = b"A writes this " * 100
    reservation = a.reserve(key, len(value))

    def end_and_revoke(name: str) -> tuple[list[int], list[int], int]:
        """What B is answered committing, revoking and statting A's put under ``name``."""
        commit = pb.PutCommit(key=name, put_id=reservation.put_id, replica_ok=[True])
        ended = stub.PutEnd(pb.PutEndRequest(commits=[commit]), metadata=as_b(cluster), timeout=10)
        revoke = pb.PutRevokeRequest(keys=[name], put_ids=[reservation.put_id])
        revoked = stub.PutRevoke(revoke, metadata=as_b(cluster), timeout=10)
        stat = stub.Stat(pb.StatRequest(key=name), metadata=as_b(cluster), timeout=10)
        return list(ended.statuses), list(revoked.statuses), stat.status

    never_put = end_and_revoke("a-key-nobody-ever-put")
    assert never_put[0] != [KeyStatus.OK] and never_put[1] != [KeyStatus.OK]
    assert never_put[2] == KeyStatus.NOT_FOUND
    for name in (key, f"a/{key}"):
        assert end_and_revoke(name) == never_put, "B is answered as for a key never put"
    with Client(cluster.master_address, **cluster.client_credentials("b")) as b:
        assert not_found(b.get_many([key])[0])
        assert b.put(key, b"B's own") == 1, "B's key of the same name is B's own"
        assert b.get(key) == b"B's own"
        b.remove(key, force=True)
    reservation.write(value)
    assert reservation.commit() == 1
    assert a.get(key) == value
    a.remove(key, force=True)
    assert_a_objects_whole(cluster)


def test_the_same_key_in_two_tenants_is_two_objects_with_their_own_bytes(cluster, a):
    key = "the-same-key"
    with Client(cluster.master_address, **cluster.client_credentials("b")) as b:
        a.put(key, b"A" * 4096)
        b.put(key, b"B" * 1000)
        assert a.get(key) == b"A" * 4096
        assert b.get(key) == b"B" * 1000
        assert (a.stat(key).size, b.stat(key).size) == (4096, 1000)
        a.remove(key, force=True)
        assert b.get(key) == b"B" * 1000, "A's removal removed A's object only"
        assert not a.exists(key)
        b.remove(key, force=True)


def test_an_admin_lists_the_keys_of_every_tenant_behind_its_prefix(cluster, a, stub):
    with Client(cluster.master_address, **cluster.client_credentials("b")) as b:
        b.put("b-listed", b"b")
        admin = bearer(cluster.admin_token)
        everything = stub.ListKeys(pb.ListKeysRequest(), metadata=admin, timeout=10).keys
        assert {f"a/{key}" for key in A_OBJECTS} | {"b/b-listed"} <= set(everything)
        only_a = stub.ListKeys(pb.ListKeysRequest(prefix="a/"), metadata=admin, timeout=10).keys
        assert set(only_a) == {f"a/{key}" for key in A_OBJECTS}
        b.remove("b-listed")


def test_a_client_learns_only_totals_and_its_own_tenants_count_from_the_cluster_status(
    cluster, a, stub
):
    admin = stub.ClusterStatus(pb.ClusterStatusRequest(), metadata=bearer(cluster.admin_token))
    assert admin.nodes == 1
    counts = {}
    for tenant in ("a", "b"):
        own = len(a.list_keys().keys) if tenant == "a" else None
        status = stub.ClusterStatus(
            pb.ClusterStatusRequest(), metadata=bearer(cluster.tenant_tokens[tenant])
        )
        assert status.nodes == admin.nodes
        assert sum(s.capacity for s in status.segments) == sum(s.capacity for s in admin.segments)
        for segment in status.segments:  # per tier, summed: no segment, node or host
            assert segment.segment_id.startswith("(every ")
            assert not segment.node_id and not segment.host and not segment.objects
        if own is not None:
            assert status.objects == own, "its own objects, not the cluster's"
        counts[tenant] = status.objects
    assert counts["a"] + counts["b"] <= admin.objects


def test_a_put_committed_as_written_without_its_bytes_is_never_published(cluster, a):
    """(Freed space keeps the bytes of what lay there. A client that reserved it, wrote
    nothing and told the master it had, would have had those bytes, maybe another
    tenant's, published as its own object, and read them back. On a node holding several
    tenants' objects only what the writer wrote over the checked stream is recorded.)"""
    left = b"bytes tenant A removed " * 500
    a.put("left-behind", left)
    a.remove("left-behind", force=True)
    with Client(cluster.master_address, **cluster.client_credentials("b")) as b:
        key = "claims-it-wrote"
        reservation = b.reserve(key, len(left))
        commit = pb.PutCommit(key=key, put_id=reservation.put_id, replica_ok=[True])
        request = pb.PutEndRequest(client_id=b.client_id, commits=[commit])
        ended = b._session.link.call("PutEnd", request, time.monotonic() + 10)
        assert list(ended.statuses) != [KeyStatus.OK]
        assert not_found(b.get_many([key])[0]), "published with bytes nobody wrote"
        # a put that writes its bytes is recorded as ever, there and then
        assert b.put(key, b"B wrote these") == 1
        assert b.get(key) == b"B wrote these"
        b.remove(key, force=True)
    assert_a_objects_whole(cluster)
