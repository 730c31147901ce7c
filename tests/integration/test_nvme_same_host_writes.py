"""A client on an NVMe segment's host that may map its node's memory writes the segment's file
itself (transport/shared_file.py): whole blocks with direct I/O, partial blocks through the
page cache, and the node records the writer's checksum of the bytes. Nothing crosses loopback
TCP, the node receives nothing, and durability is the node's as before: a put that returned
is there, byte for byte, after the node is killed and restarts (its reopening checks every
object against the recorded checksum). Who may do it is who may map (the master names them);
everyone else streams the bytes to the node."""

from __future__ import annotations

import mmap
import os
import random

import numpy as np
import pytest
from helpers import cluster_status, metric, wait_until
from test_same_host_mapping_grants import _ask

from kvpool import Client
from kvpool.errors import ObjectNotFound, TransferError
from kvpool.security import mapping_grants
from kvpool.security.identity import Role
from kvpool.security.tokens import new_token

MiB = 1 << 20
WRITER = 'kvpool_node_record_checksums_total{source="writer"}'
RECEIVED = "kvpool_node_direct_write_bytes_total"
PREPARES = 'kvpool_node_commands_total{kind="prepare",outcome="ok"}'
#: What makes this process a secure cluster's client (tests/conftest.py sets it).
SECURE_ENV = ("KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE", "KVPOOL_TLS_CA")
ALLOWED, OTHER = (
    new_token("mapper", Role.CLIENT, tenant="a"),
    new_token("plain", Role.CLIENT, tenant="a"),
)


def _cluster(cluster_factory, tmp_path, *node_args: str):
    """One node holding tenant a's objects alone, with an NVMe segment; "mapper" may map."""
    cluster = cluster_factory(
        0,
        "64MiB",
        same_host=False,
        tokens=(ALLOWED[1], OTHER[1]),
        master_args=["--same-host-clients", "mapper"],
    )
    node = cluster.add_node(
        extra=["--tenant", "a", "--nvme", str(tmp_path / "nvme"), "--nvme-size", "1GiB", *node_args]
    )
    return cluster, node


def _client(cluster, token: str, **options) -> Client:
    return Client(cluster.master_address, token=token, tls_ca=str(cluster.pki.ca), **options)


def test_a_named_client_writes_the_file_itself_and_every_object_survives_a_kill(
    cluster_factory, tmp_path
):
    """Odd sizes placed back to back (most start and end inside a block: neighbours share
    those blocks), one larger than a bounce buffer, from memory that is and is not block
    aligned: each reads back identical, is recorded with its writer's checksum, and is
    intact after a SIGKILL of the node and its restart."""
    cluster, node = _cluster(cluster_factory, tmp_path)
    rng = random.Random(11)
    sizes = [1, 4095, 65_537, MiB, MiB + 1, 9 * MiB - 3]
    objects = {f"odd-{i}": rng.randbytes(n) for i, n in enumerate(sizes)}
    memory = mmap.mmap(-1, 3 * MiB)  # (page aligned: written straight from, no bounce)
    memory[:] = os.urandom(3 * MiB)
    aligned = np.frombuffer(memory, dtype=np.uint8)
    port = node.ready["http_port"]
    with _client(cluster, ALLOWED[0], timeout=30) as client:
        assert client.put_many(list(objects.items()), tier="nvme") == [1] * len(objects)
        region = client.register_buffer(aligned)
        assert client.put("aligned", aligned, tier="nvme") == 1
        client.unregister_buffer(region)
        objects["aligned"] = aligned.tobytes()
        assert client.mapped_segments == [], "the NVMe file is written, never mapped or read"
        assert metric(port, WRITER) == len(objects), "each recorded with its writer's checksum"
        assert metric(port, RECEIVED) == 0, "the node received no byte of them"
        for key, value in objects.items():
            assert client.get(key, verify=True) == value, key
        node.kill()
        node.restart()
        assert wait_until(lambda: cluster_status(client.master).objects == len(objects), 10)
        for key, value in objects.items():
            assert client.get(key, verify=True) == value, key


def test_the_node_allocates_ahead_only_for_writers_that_do_not_write_the_file_themselves(
    cluster_factory, tmp_path
):
    """In a sparse segment (``--nvme-sparse``), a Prepare (the node allocating a put's blocks
    before the write) keeps a full disk from faulting the node's own writes through its
    mapping; a client writing the file allocates as it writes (a full disk fails its write),
    and its node gets none once it holds it."""
    cluster, node = _cluster(cluster_factory, tmp_path, "--nvme-sparse")
    port = node.ready["http_port"]

    def prepares() -> float:
        try:
            return metric(port, PREPARES)
        except AssertionError:  # (not exported before the first)
            return 0.0

    with _client(cluster, ALLOWED[0], timeout=30) as mapper, _client(cluster, OTHER[0]) as plain:
        mapper.put("first", b"f" * 100_000, tier="nvme")  # (the file is not held yet)
        held = prepares()
        assert mapper.put_many([(f"m{n}", b"m" * 100_000) for n in range(5)], tier="nvme")
        assert prepares() == held, "the mapper's puts sent no Prepare"
        assert plain.put_many([(f"p{n}", b"p" * 100_000) for n in range(5)], tier="nvme")
        assert wait_until(lambda: prepares() == held + 5, 5), "the plain client's did"
        for n in range(5):
            assert mapper.get(f"m{n}") == b"m" * 100_000 and plain.get(f"p{n}") == b"p" * 100_000


def test_a_client_the_master_does_not_name_streams_its_bytes_to_the_node(cluster_factory, tmp_path):
    cluster, node = _cluster(cluster_factory, tmp_path)
    data = os.urandom(3 * MiB + 5)
    port = node.ready["http_port"]
    with _client(cluster, OTHER[0], timeout=30) as plain:
        assert plain.put("by-plain", data, tier="nvme") == 1
        assert plain.get("by-plain", verify=True) == data
        (descriptor,) = plain._session.data._descriptors.values()
        assert not descriptor.HasField("shared_memory"), "told nothing to write the file with"
    assert metric(port, RECEIVED) >= 3 * MiB, "the node wrote what it received"
    assert metric(port, WRITER) == 0


def test_the_node_hands_an_nvme_file_over_for_writes_only(cluster_factory, tmp_path):
    """Two descriptors for a write grant (direct I/O first); a read request is refused: such
    a file is read over the checked stream, as by any other client."""
    cluster, _ = _cluster(cluster_factory, tmp_path)
    with _client(cluster, ALLOWED[0], timeout=30) as client:
        client.put("k", b"k" * 10_000, tier="nvme")
        (descriptor,) = [
            d for d in client._session.data._descriptors.values() if d.shared_memory.direct_io
        ]
    grant = descriptor.map_capability
    answer, fds = _ask(descriptor, mapping_grants.request(True, grant))
    try:
        assert answer[:1] == bytes([mapping_grants.HANDED_OVER]) and len(fds) == 2
        assert os.O_DIRECT & _flags(fds[0]) and not os.O_DIRECT & _flags(fds[1])
        assert os.fstat(fds[0]).st_ino == os.fstat(fds[1]).st_ino == descriptor.shared_memory.inode
    finally:
        for fd in fds:
            os.close(fd)
    answer, fds = _ask(descriptor, mapping_grants.request(False, grant))
    assert answer[:1] == bytes([mapping_grants.REFUSED]) and fds == []
    assert b"checked stream" in answer


def test_on_an_insecure_cluster_a_client_of_the_node_s_user_writes_the_file_too(
    cluster_factory, tmp_path, monkeypatch
):
    """No grant and no handover: it opens the node's file through /proc, as it maps DRAM."""
    cluster = cluster_factory(0, "64MiB", secure=False)
    for name in SECURE_ENV:  # (this process is a client of it too)
        monkeypatch.delenv(name, raising=False)
    node = cluster.add_node(extra=["--nvme", str(tmp_path / "nvme"), "--nvme-size", "1GiB"])
    objects = {f"k{n}": os.urandom(n) for n in (10, 5000, 2 * MiB + 1)}
    with Client(cluster.master_address, timeout=30) as client:
        assert client.put_many(list(objects.items()), tier="nvme") == [1] * len(objects)
        assert metric(node.ready["http_port"], WRITER) == len(objects)
        for key, value in objects.items():
            assert client.get(key, verify=True) == value, key


def test_a_full_disk_fails_the_put_with_a_clear_error_and_the_node_serves_on(
    cluster_factory, tmp_path, small_disk
):
    """The segment (128 MiB, ``--nvme-sparse``) is larger than its file system (48 MiB): once
    the disk is full, the client's own write fails, and its put with it, saying so; nothing
    was published, the node is up, and what was stored reads back."""
    cluster = cluster_factory(
        0,
        "64MiB",
        same_host=False,
        tokens=(ALLOWED[1],),
        master_args=["--same-host-clients", "mapper"],
    )
    node = cluster.add_node(
        extra=[
            *("--tenant", "a", "--nvme", str(small_disk / "nvme")),
            *("--nvme-size", "128MiB", "--nvme-sparse"),
        ]
    )
    stored: dict[str, bytes] = {}
    with _client(cluster, ALLOWED[0], timeout=10) as client:
        for n in range(40):
            value = os.urandom(2 * MiB)
            try:
                client.put(f"k{n}", value, tier="nvme")
            except TransferError as error:
                assert "No space left on device" in str(error) and "nothing was published" in str(
                    error
                )
                with pytest.raises(ObjectNotFound):
                    client.get(f"k{n}")
                break
            stored[f"k{n}"] = value
        else:
            raise AssertionError("80 MiB went into a 48 MiB file system")
        assert len(stored) >= 10
        assert node.popen.poll() is None, "the node is up"
        for key, value in stored.items():
            assert client.get(key, verify=True) == value, key


def _flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


@pytest.fixture(autouse=True)
def _o_direct_on_this_file_system(tmp_path):
    """The test's directory must take direct I/O (tmpfs does not: no file is shared then)."""
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError as error:
        pytest.fail(f"{tmp_path} takes no direct I/O ({error}): run the tests on a disk")
