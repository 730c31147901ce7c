"""The reserve -> write -> commit -> publish life cycle, seen from readers and from the pool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import cluster_status, wait_until

from kvpool import Client
from kvpool.errors import ObjectExists, ObjectNotFound, ObjectNotReady, PutAborted


def used_bytes(client: Client) -> int:
    return sum(s.used for s in cluster_status(client.master).segments)


def test_readers_never_see_an_object_between_reserve_and_publish(shared_cluster):
    data = os.urandom(1 << 20)
    with (
        Client(shared_cluster.master_address) as writer,
        Client(shared_cluster.master_address) as reader,
    ):
        reservation = writer.reserve("held-writer", len(data))
        with pytest.raises(ObjectNotReady, match="not yet published"):
            reader.get("held-writer")
        reservation.write(data)  # the bytes are in the segment now...
        with pytest.raises(ObjectNotFound):  # ...but still invisible
            reader.get_into("held-writer", bytearray(len(data)))
        assert reader.exists("held-writer") is False
        with pytest.raises(ObjectExists, match="being written"):
            reader.put("held-writer", b"intruder")
        reservation.commit()
        assert reader.get("held-writer") == data


def test_a_revoked_reservation_frees_its_key_and_space_at_once(shared_cluster):
    with Client(shared_cluster.master_address) as client:
        before = used_bytes(client)
        reservation = client.reserve("revoked", 8 << 20)
        assert used_bytes(client) >= before + (8 << 20)
        reservation.revoke()
        assert used_bytes(client) == before
        client.put("revoked", b"now it is mine")
        assert client.get("revoked") == b"now it is mine"


WRITER = textwrap.dedent(
    """
    import sys, time
    from kvpool import Client
    client = Client(sys.argv[1])
    reservation = client.reserve("abandoned", 16 << 20)
    reservation.write(bytes(16 << 20))
    print("written", flush=True)
    time.sleep(60)
    """
)


def test_a_writer_killed_before_commit_gets_its_space_back_after_the_timeout(cluster_factory):
    cluster = cluster_factory(
        1, "128MiB", master_args=["--reservation-timeout", "1.0", "--reclaim-delay", "0.5"]
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, cluster.master_address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline().strip() == "written"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    with Client(cluster.master_address) as client:
        assert used_bytes(client) >= 16 << 20
        with pytest.raises(ObjectNotReady):
            client.get("abandoned")
        # the key is free once the reservation times out...
        assert wait_until(lambda: not _reserved(client), timeout=3.0)
        # ...and the space returns after the reclaim delay as well
        assert wait_until(lambda: used_bytes(client) == 0, timeout=3.0)
        client.put("abandoned", b"a new writer")
        assert client.get("abandoned") == b"a new writer"


def _reserved(client: Client) -> bool:
    return cluster_status(client.master).reservations > 0


def test_committing_after_the_reservation_timed_out_publishes_nothing(cluster_factory):
    cluster = cluster_factory(1, "64MiB", master_args=["--reservation-timeout", "0.3"])
    with Client(cluster.master_address) as client:
        reservation = client.reserve("too-slow", 1024)
        reservation.write(os.urandom(1024))
        time.sleep(0.8)
        with pytest.raises(PutAborted, match="put it again"):
            reservation.commit()
        with pytest.raises(ObjectNotFound):
            client.get("too-slow")
