"""A node whose NVMe segment has no blocks reserved (``--nvme-sparse``: allocated as objects
are written) on a disk another process fills up, written over the checked stream (a client
that does not map the node: one on another host):

- a put whose bytes the disk has no room for fails with a typed error that names the
  node's disk (DISK_ERROR), small (stored from the connection's buffer) or large (written
  past the page cache); the node does not die of SIGBUS, as it did when it stored small
  writes through its mapping into a hole of the full disk;
- the node serves on: its objects read back, the failures are counted, and once the
  operator frees the disk, puts land again and read back byte for byte.

(Segments whose blocks are reserved never fail for space: test_nvme_disk_reservation.py.)
"""

from __future__ import annotations

import os

import pytest
from helpers import fill_disk, metric

from kvpool import Client
from kvpool.errors import KVPoolError, TransferError

MiB = 1 << 20
WRITE_ERRORS = 'kvpool_node_disk_errors_total{op="write"}'


def test_puts_into_a_sparse_nvme_segment_on_a_full_disk_fail_typed_and_the_node_serves_on(
    cluster_factory, small_disk
):
    cluster = cluster_factory(0, "64MiB", same_host=False)
    node = cluster.add_node(
        extra=["--nvme", str(small_disk / "nvme"), "--nvme-size", "128MiB", "--nvme-sparse"]
    )
    port = node.ready["http_port"]
    with Client(cluster.master_address, timeout=30, same_host_mapping=False) as client:
        kept = os.urandom(16 << 10)
        assert client.put("before", kept, tier="nvme") == 1
        fill_disk(small_disk / "hog")
        failed_before = metric(port, WRITE_ERRORS)

        for key, size in (("small", 16 << 10), ("large", 3 * MiB + 100)):
            with pytest.raises(KVPoolError) as refused:
                client.put(key, os.urandom(size), tier="nvme")
            # (asked of the node first: one dying of SIGBUS may take a while to exit)
            assert client.get("before") == kept, "the node serves its objects on"
            assert node.alive(), f"the node died on the {key} put: exit {node.popen.poll()}"
            assert isinstance(refused.value, TransferError), repr(refused.value)
            assert "DISK_ERROR" in str(refused.value) and refused.value.key == key
            assert not client.exists(key), "nothing was published"
        assert metric(port, WRITE_ERRORS) == failed_before + 2

        os.unlink(small_disk / "hog")  # the operator frees the disk
        values = {f"after{n}-{size}": os.urandom(size) for n in range(3) for size in (4096, MiB)}
        for key, value in values.items():
            assert client.put(key, value, tier="nvme") == 1, key
        assert all(client.get(key) == value for key, value in values.items())
    assert node.alive()
