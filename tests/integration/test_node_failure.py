"""Storage nodes die or stall: reads fail fast or use another replica, nothing hangs."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from helpers import cluster_status, wait_until

from kvpool import Client
from kvpool.errors import LeaseExpired, ObjectNotFound, TransferError
from kvpool.local_cluster import LocalCluster, ManagedProcess


def node_read_first(cluster: LocalCluster, client: Client, key: str) -> ManagedProcess:
    """The node holding the replica a get of ``key`` tries first.

    A get tries the replicas in the order GetReplicas lists them, those on the client's host
    first (client/get_path.py, by_nearness: a stable sort). Stat lists them in the same order
    (both come from the master's record of the object), and every node of a LocalCluster is
    on this host, so the first one Stat lists is the first one read.
    """
    replicas = client.stat(key).replicas
    assert len({r.node_id for r in replicas}) == len(replicas) >= 2, "replicas on distinct nodes"
    assert len({r.host == client.host for r in replicas}) == 1, "all replicas equally near"
    (node,) = [n for n in cluster.nodes if n.ready["node_id"] == replicas[0].node_id]
    return node


@pytest.mark.parametrize("same_host_mapping", [True, False], ids=["mapped", "ucx"])
def test_a_two_replica_object_survives_a_node_killed_with_sigkill(
    cluster_factory, same_host_mapping
):
    """The node killed is the one holding the replica a get tries first: the get must fall
    over to the next replica (mapped: the node's exit is seen; UCX: the transfer fails)."""
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", "1.5"])
    data = os.urandom(4 << 20)
    with Client(cluster.master_address, timeout=5, same_host_mapping=same_host_mapping) as client:
        client.put("precious", data, replicas=2)
        assert {s.objects for s in cluster_status(client.master).segments} == {1}
        victim = node_read_first(cluster, client, "precious")
        (survivor,) = [n.ready["node_id"] for n in cluster.nodes if n is not victim]
        victim.kill()
        # before the master notices: the first replica's transfer fails, the next one serves
        assert client.get("precious") == data
        assert wait_until(lambda: cluster_status(client.master).nodes == 1, timeout=30.0)
        assert [r.node_id for r in client.stat("precious").replicas] == [survivor]
        assert client.get("precious") == data  # after: the master lists only the survivor


def test_the_master_drops_a_dead_nodes_objects_within_the_heartbeat_ttl(cluster_factory):
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", "1.5"])
    with Client(cluster.master_address, timeout=5) as client:
        keys = [f"k{i}" for i in range(20)]
        client.put_many([(k, os.urandom(10_000)) for k in keys])
        victim = cluster.nodes[0].ready["node_id"]
        on_victim = next(
            s.objects for s in cluster_status(client.master).segments if s.node_id == victim
        )
        assert on_victim > 0
        killed_at = time.monotonic()
        cluster.nodes[0].kill()
        # no get hangs while the master has not noticed yet
        for key in keys:
            start = time.monotonic()
            with contextlib.suppress(TransferError, ObjectNotFound):
                client.get(key)
            assert time.monotonic() - start < 5
        assert wait_until(lambda: cluster_status(client.master).nodes == 1, timeout=4.0)
        assert time.monotonic() - killed_at < 1.5 + 2.0
        results = client.get_many(keys)
        lost = [k for k, r in zip(keys, results, strict=True) if isinstance(r, ObjectNotFound)]
        assert len(lost) == on_victim
        assert all(isinstance(r, bytes) for r in results if not isinstance(r, ObjectNotFound))


def test_a_node_restarted_under_its_id_at_once_leaves_no_segment_of_its_earlier_process(
    cluster_factory,
):
    """A crash and a restart within the node TTL (the master never declares the node dead):
    the new process's mount drops the DRAM the killed one had (a new segment id in every
    process). Left, puts of two replicas would often get one (placed in memory that no
    longer exists), and copies there would still count as replicas."""
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", "5"])
    with Client(cluster.master_address, timeout=5) as client:
        before = {f"before-{i}": os.urandom(8192) for i in range(10)}
        assert client.put_many(list(before.items()), replicas=2) == [2] * 10
        victim = cluster.nodes[1]
        for _ in range(2):
            victim.kill()
            victim.restart()
        segments = cluster_status(client.master).segments
        assert len(segments) == 2, [s.segment_id for s in segments]
        assert all(len(client.stat(key).replicas) == 1 for key in before), "gone copies"
        assert client.get_many(list(before)) == list(before.values())
        after = [(f"after-{i}", os.urandom(8192)) for i in range(20)]
        assert client.put_many(after, replicas=2) == [2] * 20


@pytest.mark.parametrize("path", ["checked stream", "ucx"])
def test_a_stalled_node_gives_a_transfer_error_within_the_deadline(
    cluster_factory, monkeypatch, path
):
    """Over TCP a node must progress for a transfer to finish: stop it. The get ends at its
    deadline on either path. Over UCX (the chaos suite's finding, seed 7: a get ended 3.4 s
    past its deadline) a worker whose operations cannot be cancelled is drained for at most
    ``LATE_GRACE``, then given up."""
    node_args: tuple[str, ...] = ()
    if path == "ucx":  # a client that opts out, a node that offers UCX over TCP
        monkeypatch.setenv("KVPOOL_CHECKED_STREAM", "0")
        node_args = ("--ucx-tcp",)
    cluster = cluster_factory(1, "64MiB", node_args=node_args)
    with Client(
        cluster.master_address,
        timeout=2.0,
        ucx_config={"TLS": "tcp"},
        same_host_mapping=False,  # a mapping reads a stopped node's memory regardless
    ) as client:
        data = os.urandom(8 << 20)
        client.put("stalled", data)
        assert client.get("stalled") == data
        cluster.nodes[0].signal(signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(TransferError, match="deadline"):
                client.get("stalled")
            assert time.monotonic() - start < 3.0
        finally:
            cluster.nodes[0].signal(signal.SIGCONT)
        assert client.get("stalled") == data  # a fresh endpoint once the node is back


def test_a_put_to_a_stalled_node_ends_within_the_write_timeout_with_no_late_bytes(
    cluster_factory,
):
    """A writer stops copying at the master's write timeout (client/put_path.py): the put to a
    stopped node fails then, nothing is published, and once the node runs again no byte of
    the abandoned put lands in an object written afterwards (the failed put's space is free
    again once no node honours its write capability any more, so the objects written after
    it reuse it)."""
    write_timeout = 1.5
    cluster = cluster_factory(
        1,
        "64MiB",
        # the node stays alive to the master throughout: only the write timeout ends the put;
        # and the store may fill up without evictions
        master_args=[
            *("--write-timeout", str(write_timeout), "--node-ttl", "60"),
            *("--high-watermark", "0.99"),
        ],
    )
    with Client(
        cluster.master_address,
        timeout=30.0,  # far past the write timeout: that is what must end the put
        ucx_config={"TLS": "tcp"},  # over TCP the node must progress for a transfer to finish
        same_host_mapping=False,  # a mapping writes into a stopped node's memory regardless
    ) as client:
        warm = os.urandom(1 << 20)
        assert client.put("warm", warm) == 1  # an endpoint to the node exists before it stops
        data = os.urandom(8 << 20)  # more than the sockets buffer: the write cannot finish
        node = cluster.nodes[0]
        node.signal(signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(TransferError, match="no replica") as caught:
                client.put("stalled-put", data)
            elapsed = time.monotonic() - start
        finally:
            node.signal(signal.SIGCONT)
        assert caught.value.key == "stalled-put"
        assert "deadline" in str(caught.value), "the write was stopped at its deadline"
        assert elapsed < write_timeout + 5.0, f"the put took {elapsed:.1f}s"

        assert read_again(client, "warm") == warm  # the node serves again
        with pytest.raises(ObjectNotFound):
            client.get("stalled-put")  # nothing was published
        # (its space returns when its write grant has ended: write timeout + clock allowance)
        assert wait_until(
            lambda: (
                sum(s.used for s in cluster_status(cluster.master_address).segments) <= len(warm)
            ),
            timeout=30,
        )
        # 7 objects of the failed put's size, one under its key: 56 of the 63 MiB left, so
        # one of them at least takes space the abandoned write aimed at
        later = {f"later-{i}": os.urandom(8 << 20) for i in range(6)}
        later["stalled-put"] = os.urandom(8 << 20)
        assert client.put_many(list(later.items())) == [1] * len(later)
        assert client.get("warm") == warm
        for key, value in later.items():
            assert client.get(key) == value, f"{key} holds other bytes than were put"


def read_again(client: Client, key: str, attempts: int = 3) -> bytes:
    """``key``'s bytes, read again where a read's lease may have run out first (a node that
    just resumed works through the abandoned transfer's backlog before it answers: on a
    loaded machine that can outlast a lease, and the client then discards what it read)."""
    for _ in range(attempts - 1):
        try:
            return client.get(key)
        except LeaseExpired:
            continue
    return client.get(key)


def test_a_node_restarted_without_its_nvme_leaves_no_segment_nobody_serves(
    cluster_factory, tmp_path
):
    """A node restarted under its id without its ``--nvme`` (within the node TTL: never
    declared dead): its first heartbeat lists what the new process has, and the NVMe segment
    the killed one mounted goes. Left, the master would go on placing objects there."""
    cluster = cluster_factory(1, "64MiB", master_args=["--node-ttl", "30"])
    disk = ["--nvme", str(tmp_path / "nvme"), "--nvme-size", "64MiB"]
    node = cluster.add_node(extra=disk)
    with Client(cluster.master_address, timeout=5) as client:
        tiers = {s.tier for s in cluster_status(client.master).segments}
        assert len(tiers) == 2, "DRAM and NVMe mounted"
        node.kill()
        at = node.argv.index("--nvme")
        assert node.argv[at : at + 4] == disk
        node.argv = node.argv[:at] + node.argv[at + 4 :]
        node.restart()
        mounted = lambda: [  # noqa: E731
            s.segment_id for s in cluster_status(client.master).segments
        ]
        assert wait_until(lambda: len(mounted()) == 2, timeout=10.0), mounted()
        assert len({s.tier for s in cluster_status(client.master).segments}) == 1
        objects = [(f"k{i}", os.urandom(8192)) for i in range(20)]
        assert client.put_many(objects, replicas=2) == [2] * 20


def test_an_object_its_nodes_disk_cannot_read_is_dropped_by_the_master(cluster_factory, tmp_path):
    """The node's disk fails to read an object's bytes (here its data file ends before
    them, which a read past the page cache sees as a disk's failure does): the reader gets
    DISK_ERROR, the node tells the master at its next heartbeat, and the master stops
    listing the replica: the object, with no other, is lost (NOT_FOUND, to be put again)
    rather than an error to every reader for good."""
    cluster = cluster_factory(0, "64MiB")
    nvme = tmp_path / "nvme"
    cluster.add_node(dram="0", extra=["--nvme", str(nvme), "--nvme-size", "64MiB"])
    data = os.urandom(1 << 20)  # (large: read past the page cache, through direct I/O)
    with Client(cluster.master_address, timeout=5, same_host_mapping=False) as client:
        client.put("on-a-bad-disk", data)
        assert client.get("on-a-bad-disk") == data
        [data_file] = [p for p in nvme.rglob("*") if p.is_file() and p.stat().st_size >= 64 << 20]
        with open(data_file, "r+b") as file:
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            file.truncate(0)
        with pytest.raises(TransferError, match="DISK_ERROR"):
            client.get("on-a-bad-disk")
        assert wait_until(lambda: not client.exists("on-a-bad-disk"), timeout=5.0)
        with pytest.raises(ObjectNotFound):
            client.get("on-a-bad-disk")
        assert cluster.nodes[0].alive()
