"""Leases, eviction, pins, writer and node liveness, integrity and overload, end to end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from helpers import cluster_status, metric, wait_until

from kvpool import Client
from kvpool.client.data_path import Transfer
from kvpool.errors import (
    ChecksumMismatch,
    LeaseExpired,
    NoSpace,
    NotVerifiable,
    ObjectNotFound,
)

MiB = 1 << 20


def present(client: Client, key: str) -> bool:
    """Whether the master still has ``key``, without leasing it (stat grants no lease)."""
    try:
        client.stat(key)
    except ObjectNotFound:
        return False
    return True


def test_a_full_pool_evicts_least_recently_used_objects_to_take_new_puts(cluster_factory):
    cluster = cluster_factory(1, "64MiB")
    with Client(cluster.master_address) as client:
        keys = [f"old-{i:03d}" for i in range(150)]
        for key in keys:  # 150 MiB into 64 MiB: every put must make room for itself
            assert client.put(key, os.urandom(MiB)) == 1
        assert present(client, keys[-1])
        assert not present(client, keys[0])
        # one snapshot: the master's watermark tick may evict more between two stats
        survivors = sorted(client.list_keys("old-").keys)
        assert survivors == keys[-len(survivors) :], "the oldest go first"
    evicted = 150 - len(survivors)
    assert wait_until(  # the metrics follow the master's state within a tick
        lambda: metric(cluster.master_http_port, "kvpool_evictions_total") >= evicted, 2.0
    )


def test_a_store_of_small_objects_evicts_in_steps_and_keeps_taking_puts(cluster_factory):
    """A pass over thousands of small objects runs in steps (the master answers calls between
    them) until it reaches the low mark; the objects written last read back exactly."""
    cluster = cluster_factory(
        1, "16MiB", master_args=["--high-watermark", "0.9", "--eviction-ratio", "0.3"]
    )
    batches = 250  # 8000 objects of 4 KiB: twice the store
    with Client(cluster.master_address) as client:
        payloads = {}
        for b in range(batches):
            batch = {f"small-{b:03d}-{i:02d}": os.urandom(4096) for i in range(32)}
            assert client.put_many(batch) == [1] * 32, "every put is served"
            payloads.update(batch)
        recent = list(payloads)[-960:]  # the last 30 batches: newer than any pass took
        for key, data in zip(recent, client.get_many(recent), strict=True):
            assert data == payloads[key]
    passes = [
        json.loads(line)["count"]
        for line in cluster.master.log_path.read_text().splitlines()
        if '"objects evicted"' in line
    ]
    assert passes and max(passes) > 1000, f"whole passes of more than one step: {passes}"


def test_a_slow_reader_holds_off_eviction_until_its_lease_ends(cluster_factory):
    cluster = cluster_factory(
        1, "64MiB", master_args=["--high-watermark", "0.5", "--eviction-ratio", "0.2"]
    )
    lease = 6.0
    with (
        Client(cluster.master_address, lease_ttl=lease) as reader,
        Client(cluster.master_address) as writer,
    ):
        writer.put("being-read", os.urandom(4 * MiB))
        assert len(reader.get("being-read")) == 4 * MiB  # the reader now holds a lease
        for i in range(40):  # far past the watermark
            writer.put(f"filler-{i}", os.urandom(MiB))
        # the master's ticks evict the least recently used: being-read first, were it not leased
        assert wait_until(lambda: not present(writer, "filler-0"), timeout=30.0), "no eviction"
        try:
            info = writer.stat("being-read")  # one answer: present, and how long its lease runs
        except ObjectNotFound:
            pytest.fail("a leased object was evicted")
        assert info.lease_remaining_ms > 0, f"the {lease} s lease ended before the check"
        assert wait_until(  # the lease ends (stat grants none)
            lambda: writer.stat("being-read").lease_remaining_ms == 0, timeout=lease + 30.0
        )
        for i in range(40, 70):  # pressure again, with the lease over
            writer.put(f"filler-{i}", os.urandom(MiB))
        assert wait_until(lambda: not present(writer, "being-read"), timeout=30.0)


def test_a_transfer_that_may_outlive_its_lease_raises_lease_expired(shared_cluster):
    with Client(shared_cluster.master_address) as writer:
        writer.put("short-lease", os.urandom(32 * MiB))
    with Client(shared_cluster.master_address, lease_ttl=0.001) as reader:
        with pytest.raises(LeaseExpired, match="discarded"):
            reader.get("short-lease")
        with pytest.raises(LeaseExpired):
            reader.get_into("short-lease", bytearray(32 * MiB))


def test_hard_pinned_objects_are_never_evicted(cluster_factory):
    cluster = cluster_factory(1, "32MiB")
    with Client(cluster.master_address) as client:
        client.put("pinned", os.urandom(8 * MiB), pin="hard")
        client.put("soft", os.urandom(8 * MiB), pin="soft", pin_ttl=600)
        for i in range(30):
            client.put(f"churn-{i}", os.urandom(MiB))
        assert present(client, "pinned")
        assert present(client, "soft"), "soft pins go only after every unpinned object"
        assert client.stat("pinned").pin == 2
        with pytest.raises(NoSpace):  # hard pins fill the pool: nothing evictable is left
            client.put("too-big", os.urandom(28 * MiB))
        assert present(client, "pinned")


WRITER = textwrap.dedent(
    """
    import sys, time
    from kvpool import Client
    client = Client(sys.argv[1])
    reservation = client.reserve("orphan", 8 << 20)
    reservation.write(bytes(8 << 20))
    print("written", flush=True)
    time.sleep(60)
    """
)


def test_a_client_killed_mid_put_has_its_reservation_revoked_when_it_stops_heartbeating(
    cluster_factory,
):
    cluster = cluster_factory(
        1,
        "64MiB",
        master_args=[
            "--client-ttl",
            "1.0",
            "--reservation-timeout",
            "60",
            "--reclaim-delay",
            "0.5",
        ],
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, cluster.master_address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline().strip() == "written"
        time.sleep(1.5)  # alive and heartbeating: the reservation stays
        with Client(cluster.master_address) as client:
            assert cluster_status(client.master).reservations == 1
            killed = time.monotonic()
            os.kill(writer.pid, signal.SIGKILL)
            assert wait_until(lambda: cluster_status(client.master).reservations == 0, timeout=3.0)
            assert time.monotonic() - killed < 3.0, "well before the 60 s reservation timeout"
            assert wait_until(
                lambda: sum(s.used for s in cluster_status(client.master).segments) == 0,
                timeout=2.0,
            )
            client.put("orphan", b"adopted")
            assert client.get("orphan") == b"adopted"
    finally:
        writer.kill()
        writer.wait()


def test_verify_on_an_object_without_a_checksum_says_so(shared_cluster):
    data = os.urandom(64 * 1024)
    with Client(shared_cluster.master_address) as client:  # (checksum=False: the default)
        client.put("unsummed", data)
        assert client.stat("unsummed").crc32c is None
        with pytest.raises(NotVerifiable, match="checksum=True"):
            client.get("unsummed", verify=True)
        with pytest.raises(NotVerifiable):
            client.get_into("unsummed", bytearray(len(data)), verify=True)
        assert client.get("unsummed") == data  # unverified reads go on as before
        client.remove("unsummed", force=True)


def test_a_reader_that_verifies_never_gets_corrupted_bytes(shared_cluster):
    data = os.urandom(MiB)
    with Client(shared_cluster.master_address, checksum=True) as client:
        client.put("guarded", data)
        assert client.get("guarded", verify=True) == data
        assert client.stat("guarded").crc32c is not None
        # A rogue writer scribbles over the object's bytes in the storage node's memory.
        replica = client.stat("guarded").replicas[0]
        garbage = np.full(4096, 0xAB, dtype=np.uint8)
        errors = client._session.data.run(
            [Transfer(replica.segment_id, replica.address, garbage.ctypes.data, 4096)],
            is_get=False,
            deadline=time.monotonic() + 5,
        )
        assert errors == [None]
        assert client.get("guarded") != data  # without verification the damage goes unseen
        with pytest.raises(ChecksumMismatch, match="discarded"):
            client.get("guarded", verify=True)
        with pytest.raises(ChecksumMismatch):
            client.get_into("guarded", bytearray(MiB), verify=True)


def test_an_overloaded_master_sheds_load_and_clients_retry_until_served(cluster_factory):
    cluster = cluster_factory(1, "64MiB", master_args=["--max-inflight", "1"])
    with Client(cluster.master_address, timeout=30) as client:
        client.put("hot", b"x")
        failures = []

        def hammer(thread: int) -> None:
            # Puts: a PutEnd stays in flight while the node records its objects (a lookup
            # answers as its request arrives, so lookups alone never overlap on the lane).
            try:
                for n in range(30):
                    keys = [f"t{thread}/{n}/{i}" for i in range(16)]
                    assert client.put_many([(key, b"x") for key in keys]) == [1] * 16
                    assert client.exists_many(["hot", *keys]) == [True] * 17
            except Exception as error:  # collected and asserted below
                failures.append(error)

        threads = [threading.Thread(target=hammer, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert client.retries > 0, "the master refused some calls (RESOURCE_EXHAUSTED)"


def test_a_node_shutting_down_removes_its_objects_and_drains_leased_reads(cluster_factory):
    cluster = cluster_factory(1, "64MiB", node_args=["--drain-timeout", "5"])
    with Client(cluster.master_address, lease_ttl=2.0) as client:
        client.put("draining", b"d" * 1000)
        assert client.get("draining") == b"d" * 1000  # a 2 s lease
        node = cluster.nodes[0]
        stopped = time.monotonic()
        node.signal(signal.SIGTERM)
        assert wait_until(lambda: cluster_status(client.master).nodes == 0, timeout=2.0)
        with pytest.raises(ObjectNotFound):
            client.get("draining")
        time.sleep(0.5)
        assert node.alive(), "the node keeps its memory while the reader's lease lasts"
        assert wait_until(lambda: not node.alive(), timeout=5.0)
        assert 1.0 < time.monotonic() - stopped < 5.0


def test_nodes_remount_by_themselves_after_a_master_restart(cluster_factory):
    cluster = cluster_factory(2, "64MiB")
    with Client(cluster.master_address) as client:
        client.put("before", b"1")
    cluster.master.kill()
    cluster.start_master()  # same port, empty memory
    with Client(cluster.master_address) as client:
        assert wait_until(lambda: cluster_status(client.master).nodes == 2, timeout=5.0)
        client.put("after", b"2")
        assert client.get("after") == b"2"


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to cut connections")
def test_a_removal_sticks_though_the_node_stream_broke_before_the_node_heard_of_it(
    cluster_factory,
):
    """The master's Forgets were written to the node's stream, then the connection died
    before the node read them (it was stopped). The node reconnects and gets them again, so a
    restarted master does not bring the removed objects back from the node's index."""
    cluster = cluster_factory(1, "64MiB", master_args=["--node-ttl", "60"])
    [node] = cluster.nodes
    results = 'kvpool_master_requests_total{method="NodeResult"}'
    with Client(cluster.master_address) as client:
        for i in range(6):
            client.put(f"k{i}", bytes([i]) * 1000)
        answered = metric(cluster.master_http_port, results)
        node.signal(signal.SIGSTOP)
        try:
            for i in range(3):
                client.remove(f"k{i}")  # a Forget for each goes out to the stopped node
            time.sleep(0.5)  # written to the socket, never read
            for port in (cluster.port, cluster.lane_port):  # gRPC and the metadata lane
                subprocess.run(
                    ["ss", "-K", "dst", "127.0.0.1", "dport", "=", str(port)],
                    check=True,
                    capture_output=True,
                )
        finally:
            node.signal(signal.SIGCONT)
        assert wait_until(
            lambda: metric(cluster.master_http_port, results) >= answered + 3, timeout=15.0
        ), "the node never answered the Forgets sent again on its new stream"

    cluster.master.kill()
    cluster.start_master()  # same port, empty memory: it learns everything from the node
    with Client(cluster.master_address) as client:
        assert wait_until(lambda: client.exists("k5"), timeout=10.0)
        assert [client.exists(f"k{i}") for i in range(6)] == [False] * 3 + [True] * 3
        assert client.get("k4") == bytes([4]) * 1000


def test_a_writer_gets_freed_space_only_after_its_node_forgot_the_old_object(cluster_factory):
    """A removed object's space is handed to the next writer only once the node has dropped
    the old object from its index: otherwise a new leader, rebuilding from that node, could
    adopt the old object over the new writer's bytes. While the node is silent, writers are
    not held back for long either: after the Forget's wait its space is quarantined and they
    get space elsewhere; once the node answers, the old space is used again."""
    cluster = cluster_factory(1, "64MiB", master_args=["--node-ttl", "60"])
    [node] = cluster.nodes
    size = 1 << 20
    with Client(cluster.master_address, timeout=30) as client:
        client.put("old", b"o" * size)
        [old_place] = client.stat("old").replicas
        node.signal(signal.SIGSTOP)  # it will not read the Forget for now
        try:
            client.remove("old")
            reserved: list = []
            writer = threading.Thread(target=lambda: reserved.append(client.reserve("new", size)))
            writer.start()
            writer.join(timeout=15.0)
            assert not writer.is_alive(), "a silent node held the writer back"
            [reservation] = reserved
        finally:
            node.signal(signal.SIGCONT)
        reservation.write(b"n" * size)
        reservation.commit()
        [new_place] = client.stat("new").replicas
        assert new_place.address != old_place.address, "written where the node listed 'old'"
        assert client.get("new") == b"n" * size

        def reused() -> bool:  # once the node answered the Forget, the space is free again
            key = f"later-{len(later)}"
            later.append(key)
            client.put(key, b"l" * size)
            return client.stat(key).replicas[0].address == old_place.address

        later: list[str] = []
        assert wait_until(reused, timeout=20), "the old space never came back into use"
        assert client.get(later[-1]) == b"l" * size
