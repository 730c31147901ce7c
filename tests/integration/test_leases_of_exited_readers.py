"""A reader that exits gives its leases back: `kvpool get big; kvpool rm big` just works.

A read lease keeps an object from removal while a reader may still be copying it. The CLI's
`kvpool get` is a whole process that reads and exits; its lease used to hold the object for
the lease's full TTL, so an operator's `kvpool rm` right after failed. A client that closes
(as the CLI does at exit) now hands its leases back, while the leases of other readers that
are still reading hold as before (a client gives back only a lease no other reader took
after it: the master keeps one lessee per object, see master/state.py ``release_leases``).
"""

from __future__ import annotations

import os

from helpers import kvpool_cli

import kvpool
from kvpool.errors import ObjectHasLease


def test_a_get_that_exited_does_not_hold_up_a_removal(cluster_factory, tmp_path):
    cluster = cluster_factory(nodes=1, dram="64MiB", master_args=["--lease-ttl", "30"])
    payload = os.urandom(3 << 20)
    with kvpool.Client(cluster.master_address) as client:
        client.put("big", payload)

    got = kvpool_cli("get", "big", "-o", str(tmp_path / "out.bin"), master=cluster.master_address)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "out.bin").read_bytes() == payload

    removed = kvpool_cli("rm", "big", master=cluster.master_address)
    assert removed.returncode == 0, removed.stderr
    with kvpool.Client(cluster.master_address) as client:
        assert client.exists("big", lease=False) is False


def test_a_reader_still_reading_keeps_its_lease_and_the_cli_says_how_to_go_on(cluster_factory):
    cluster = cluster_factory(nodes=1, dram="64MiB", master_args=["--lease-ttl", "30"])
    with kvpool.Client(cluster.master_address) as reader:
        reader.put("shared", b"x" * 4096)
        done = kvpool_cli("get", "shared", "-o", os.devnull, master=cluster.master_address)
        assert done.returncode == 0, done.stderr  # a reader came and went
        assert reader.get("shared") == b"x" * 4096  # leased by a reader that stays open

        refused = kvpool_cli("rm", "shared", master=cluster.master_address)
        assert refused.returncode == 1
        assert "--force" in refused.stderr and "force=True" not in refused.stderr

        kept = kvpool_cli("rm", "--all", master=cluster.master_address)
        assert kept.returncode == 1, "not everything asked for was removed"
        assert "kept 1 leased by readers" in kept.stderr
    gone = kvpool_cli("rm", "--all", master=cluster.master_address)
    assert gone.returncode == 0, gone.stderr  # the open reader closed: its lease went with it
    assert "removed 1 object(s)" in gone.stderr


def test_a_reader_done_with_objects_gives_their_leases_back_without_closing(cluster_factory):
    """``release_leases``: a long-lived reader (an engine's load client) that has copied what
    it read lets it be removed or evicted at once, and stops counting it against its
    tenant's leases quota, instead of holding it for the lease's TTL."""
    cluster = cluster_factory(nodes=1, dram="64MiB", master_args=["--lease-ttl", "30"])
    keys = [f"page{i}" for i in range(4)]
    with (
        kvpool.Client(cluster.master_address) as admin,
        kvpool.Client(cluster.master_address) as reader,
    ):
        admin.put_many([(key, key.encode()) for key in keys])
        assert reader.get_many(keys[:2]) == [b"page0", b"page1"]
        assert reader.exists_many(keys[2:]) == [True, True]
        assert all(isinstance(r, ObjectHasLease) for r in admin.remove_many(keys))

        assert reader.release_leases([*keys[:3], "", "never-leased"]) == 3
        removed = admin.remove_many(keys)
        assert removed[:3] == [None, None, None]
        assert isinstance(removed[3], ObjectHasLease), removed[3]  # (not released: held)
