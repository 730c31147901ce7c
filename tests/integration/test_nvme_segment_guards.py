"""An NVMe segment's files, meddled with while its node runs:

- one node at a time holds a segment, by a lock that nothing on the disk can take away while
  the segment exists (a ``flock`` of the segment's own directory; storage_node/
  private_files.py): a node started on the same directory is refused, and says which
  process holds it, even after someone removed the ``segment.index.lock`` file as stale;
  the first node's acknowledged puts then survive its restart;
- a data file cut short under its node (truncated by someone) makes demotions into it fail,
  as a disk error would: the node lives on, the objects stay in DRAM, and nothing is said to
  be on NVMe (storage_node/segment.py: ``copy_from`` writes the file, never stores through
  its mapping, where a missing page is a SIGBUS that kills the node).
"""

from __future__ import annotations

import os
import time

import pytest
from helpers import metric, wait_until

from kvpool import Client
from kvpool.common.status import Tier
from kvpool.errors import ObjectNotFound
from kvpool.local_cluster import ClusterError
from kvpool.storage_node.index_log import Entry
from kvpool.storage_node.private_files import make_private_directory
from kvpool.storage_node.segment import allocate_dram_segment, open_persistent_segment
from kvpool.transport import ucp

MiB = 1 << 20


def _nvme(directory, *more: str) -> list[str]:
    return ["--nvme", str(directory), "--nvme-size", "64MiB", *more]


def test_a_second_node_on_a_held_segment_is_refused_even_once_its_lock_file_is_gone(
    cluster_factory, tmp_path
):
    cluster = cluster_factory(0, "64MiB")
    directory = tmp_path / "nvme"
    node = cluster.add_node(extra=_nvme(directory))
    with pytest.raises(ClusterError, match=f"in use by another process \\(pid {node.pid}\\)"):
        cluster.add_node(extra=_nvme(directory, "--node-id", "intruder"))

    [lock_file] = directory.rglob("segment.index.lock")
    values = {f"a{n}": os.urandom(100_000) for n in range(5)}
    with Client(cluster.master_address, timeout=20) as client:
        client.put_many(list(values.items()), tier="nvme")
        lock_file.unlink()  # "a stale lock": removed by an operator or a cleanup script
        with pytest.raises(ClusterError, match="in use by another process"):
            cluster.add_node(extra=_nvme(directory, "--node-id", "intruder"))
        later = {f"c{n}": os.urandom(100_000) for n in range(5)}
        client.put_many(list(later.items()), tier="nvme")
        values.update(later)

        node.kill()
        node.restart()
        assert wait_until(lambda: _all_read(client, values), timeout=15), "acknowledged: kept"


def _all_read(client: Client, values: dict[str, bytes]) -> bool:
    try:
        return all(client.get(key, verify=True) == value for key, value in values.items())
    except ObjectNotFound:
        return False


def test_demotions_into_a_data_file_cut_short_fail_and_the_node_lives_on(cluster_factory, tmp_path):
    cluster = cluster_factory(
        0, "64MiB", master_args=["--high-watermark", "0.5", "--eviction-ratio", "0.2"]
    )
    node = cluster.add_node(
        "16MiB", extra=["--nvme", str(tmp_path / "nvme"), "--nvme-size", "256MiB"]
    )
    [data_file] = (tmp_path / "nvme").rglob("segment.data")
    os.truncate(data_file, 0)
    values = {f"hot{n}": os.urandom(MiB) for n in range(14)}  # DRAM past its high watermark
    with Client(cluster.master_address, timeout=20) as client:
        for key, value in values.items():
            assert client.put(key, value) == 1, key
        assert wait_until(lambda: "cut short under the node" in node.log_tail(200), timeout=10)
        time.sleep(1)  # (demotions the master still tries)
        assert node.alive(), node.log_tail()
        assert metric(cluster.master_http_port, "kvpool_demotions_total") == 0
        for key, value in values.items():  # evicted, or read back whole from DRAM
            try:
                assert client.get(key) == value, key
            except ObjectNotFound:
                continue
            assert {r.tier for r in client.stat(key).replicas} == {Tier.DRAM}, key
        assert client.get("hot13") == values["hot13"], "the newest object is served"


def test_a_copy_into_a_data_file_cut_short_fails_and_records_nothing(tmp_path):
    context = ucp.Context({"TLS": "tcp,cma"})
    dram = allocate_dram_segment(context, "n1", 4 * MiB)
    base = make_private_directory(tmp_path / "nvme") / "segment"
    nvme = open_persistent_segment(context, "n1", base, 16 * MiB, Tier.NVME)
    try:
        value = os.urandom(MiB + 5)
        dram.memory[: len(value)] = value
        first = Entry("first", 0, len(value), 1)
        [crc] = nvme.copy_from(dram, 0, first)
        assert nvme.index.holds(first._replace(crc32c=crc))
        assert os.pread(nvme.fd, len(value), 0) == value, "the bytes are in the file"

        os.truncate(base.with_name("segment.data"), 0)
        second = Entry("second", 2 * MiB, len(value), 2)
        with pytest.raises(OSError, match="cut short under the node"):
            nvme.copy_from(dram, 0, second)
        assert [e.key for e in nvme.index.entries()] == ["first"], "nothing else recorded"
        assert os.fstat(nvme.fd).st_size == 0, "nor written (no hole under a new object)"
    finally:
        nvme.close()
        dram.close()
