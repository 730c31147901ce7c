"""An NVMe segment's blocks are all allocated on its disk when the node starts
(storage_node/disk_reservation.py):

- a node whose disk has no room for its segment does not start: it says how much room there
  is and what to do, and leaves no file behind, so that a start with a smaller size works;
- nor does a node whose segment is larger than one file may be on its disk (EFBIG from
  ``ftruncate``, ``--nvme-sparse`` or not): it names the largest file there and the size to
  pass, exits 2, and leaves no file behind either (the index's lock file included);
- a refused restart of a segment there before removes none of its files;
- once started, its puts never fail for space: another process that fills the disk takes
  no block the segment holds, and every put after that, streamed to the node or written by
  a same-host client itself, lands and reads back;
- the master sends such a segment's node no Prepare (nothing is left to allocate).

(``--nvme-sparse`` keeps the old behaviour: tests/integration/test_nvme_same_host_writes.py.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import fill_disk, metric

from kvpool import Client
from kvpool.local_cluster import ClusterError
from kvpool.security.identity import Role
from kvpool.security.tokens import new_token

MiB = 1 << 20
PREPARES = 'kvpool_node_commands_total{kind="prepare",outcome="ok"}'
MAPPER, PLAIN = (
    new_token("mapper", Role.CLIENT, tenant="a"),
    new_token("plain", Role.CLIENT, tenant="a"),
)


def _cluster(cluster_factory):
    return cluster_factory(
        0,
        "64MiB",
        same_host=False,
        tokens=(MAPPER[1], PLAIN[1]),
        master_args=["--same-host-clients", "mapper"],
    )


def _node_args(directory: Path, size: str) -> list[str]:
    return ["--tenant", "a", "--nvme", str(directory), "--nvme-size", size]


def _files(directory: Path) -> list[str]:
    """The names of the files under ``directory`` (a segment's own directory included)."""
    return sorted(path.name for path in directory.rglob("*") if not path.is_dir())


def _client(cluster, token: str) -> Client:
    return Client(cluster.master_address, token=token, tls_ca=str(cluster.pki.ca), timeout=30)


def test_a_node_whose_disk_cannot_hold_its_segment_does_not_start_and_says_why(
    cluster_factory, small_disk
):
    cluster = _cluster(cluster_factory)
    directory = small_disk / "nvme"
    with pytest.raises(ClusterError) as refused:
        cluster.add_node(extra=_node_args(directory, "128MiB"))
    message = str(refused.value)
    assert "needs 128" in message and "room for" in message, message
    assert "lower --nvme-size" in message and "--nvme-sparse" in message, message
    assert "Traceback" not in message
    assert _files(directory) == [], "no file left behind"
    node = cluster.add_node(extra=_node_args(directory, "32MiB"))  # (the room it has)
    assert node.alive()


def test_a_segment_larger_than_one_file_may_be_on_its_disk_is_refused_naming_the_largest(
    cluster_factory, small_disk
):
    # (mkfs makes a disk this small of 1 KiB blocks: ext4 then takes files of 4 TiB at most,
    # less one block, and ``ftruncate`` to more fails with EFBIG)
    cluster = _cluster(cluster_factory)
    directory = small_disk / "nvme"
    for sparse in ([], ["--nvme-sparse"]):
        with pytest.raises(ClusterError) as refused:
            cluster.add_node(extra=[*_node_args(directory, "5TiB"), *sparse])
        message = str(refused.value)
        assert "exited with 2 " in message, message
        assert "NVMe segment of 5.0 TiB is larger than one file may be" in message, message
        assert "largest file is 4.0 TiB (4398046510080 bytes)" in message, message
        assert "pass --nvme-size 4095GiB or less" in message, message
        assert "Traceback" not in message and "cannot open storage" not in message
        assert _files(directory) == [], "no file left behind"
    node = cluster.add_node(extra=_node_args(directory, "32MiB"))
    assert node.alive()


def test_a_refused_restart_of_a_segment_there_before_leaves_its_files(cluster_factory, small_disk):
    cluster = _cluster(cluster_factory)
    directory = small_disk / "nvme"
    node = cluster.add_node(extra=_node_args(directory, "32MiB"))
    node.stop()
    files = _files(directory)
    assert files == ["segment.data", "segment.index", "segment.index.lock"], files
    [data_file] = directory.rglob("segment.data")
    os.truncate(data_file, 0)  # (cut short by someone: its blocks go back to the disk...)
    fill_disk(small_disk / "hog")  # (... and another process takes them)
    with pytest.raises(ClusterError, match="has room for"):
        node.restart()
    assert _files(directory) == files, "the segment's own files stay"


def test_puts_land_after_another_process_fills_the_disk_and_no_prepare_is_sent(
    cluster_factory, small_disk
):
    cluster = _cluster(cluster_factory)
    node = cluster.add_node(extra=_node_args(small_disk / "nvme", "32MiB"))
    [data_file] = (small_disk / "nvme").rglob("segment.data")
    assert data_file.stat().st_blocks * 512 >= 32 * MiB, "every block allocated at start"
    fill_disk(small_disk / "hog")
    room = os.statvfs(small_disk)
    assert room.f_bavail * room.f_frsize < MiB, "the disk is full"

    objects = {f"k{n}": os.urandom(2 * MiB - 1000 * n) for n in range(12)}  # 23 MiB in all
    with _client(cluster, MAPPER[0]) as mapper, _client(cluster, PLAIN[0]) as plain:
        for n, (key, value) in enumerate(objects.items()):
            writer = mapper if n % 2 else plain  # (the file itself; streamed to the node)
            assert writer.put(key, value, tier="nvme") == 1, key
        for key, value in objects.items():
            assert plain.get(key, verify=True) == value, key
    with pytest.raises(AssertionError):  # (the counter is exported at its first Prepare)
        metric(node.ready["http_port"], PREPARES)
