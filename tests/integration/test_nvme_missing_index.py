"""An NVMe segment whose index is lost (deleted, or emptied) while its data file holds bytes:
its node refuses to start, naming both files and what to do, and touches neither
(storage_node/object_index.py ``_refuse_lost_log``). Started anyway, it would open a new
segment over the old data file and reuse its space as free: every published object lost, with
nothing said but "segment mounted objects=0". A segment's index is created before its data
file, so a brand-new segment (no data file, or an empty one) still starts. Real node processes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from helpers import cluster_status, wait_until

from kvpool import Client
from kvpool.local_cluster import ClusterError

SEGMENT = Path("kvpool-nvme")


def nvme_args(directory: Path) -> list[str]:
    return ["--nvme", str(directory), "--nvme-size", "64MiB"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("loss", ["deleted", "emptied"])
def test_a_node_whose_index_is_lost_beside_its_data_refuses_to_start_until_it_is_restored(
    cluster_factory, tmp_path, loss
):
    cluster = cluster_factory(0, "64MiB")
    node = cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    index = tmp_path / "nvme" / SEGMENT / "segment.index"
    data = tmp_path / "nvme" / SEGMENT / "segment.data"
    values = {f"k{i}": os.urandom(100_000) for i in range(3)}
    with Client(cluster.master_address, timeout=20) as client:
        client.put_many(list(values.items()), tier="nvme")
        node.kill()
        backup = tmp_path / "index.backup"
        shutil.copyfile(index, backup)
        held = digest(data)
        if loss == "deleted":
            index.unlink()
        else:
            os.truncate(index, 0)

        for _ in range(2):  # (refused again: the refusal left no new index behind)
            with pytest.raises(ClusterError) as refused:
                node.restart()
            message = str(refused.value)
            assert "exited with 1 " in message, message
            assert f"{index} is {'missing' if loss == 'deleted' else 'empty'}" in message
            assert f"the data file {data}" in message
            assert "Restore" in message and "start the segment empty" in message
            assert digest(data) == held, "the data file is left as it was"
            if loss == "deleted":
                assert not index.exists(), "no new index, which would start the segment afresh"
            else:
                assert index.stat().st_size == 0

        shutil.copyfile(backup, index)  # what the refusal says to do
        node.restart()
        assert wait_until(lambda: cluster_status(client.master).objects == 3, timeout=10)
        for key, value in values.items():
            assert client.get(key, verify=True) == value


def test_a_data_file_moved_away_or_emptied_with_its_index_starts_a_new_segment(
    cluster_factory, tmp_path
):
    """(The refusal's other way out; and a data file that holds no byte is no loss.)"""
    cluster = cluster_factory(0, "64MiB")
    node = cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    index = tmp_path / "nvme" / SEGMENT / "segment.index"
    data = tmp_path / "nvme" / SEGMENT / "segment.data"
    with Client(cluster.master_address, timeout=20) as client:
        client.put("old", os.urandom(100_000), tier="nvme")
        for way_out in ("moved away", "emptied"):
            node.kill()
            index.unlink()
            if way_out == "moved away":
                data.rename(tmp_path / "segment.data.lost")
            else:
                os.truncate(data, 0)
            node.restart()
            value = os.urandom(100_000)
            client.put(f"new, {way_out}", value, tier="nvme")
            assert client.get(f"new, {way_out}", verify=True) == value
            assert data.stat().st_size == 64 << 20 and index.stat().st_size > 0


def test_a_start_refused_for_room_beside_an_empty_data_file_leaves_none_to_refuse_later(
    cluster_factory, small_disk
):
    """(The refused start had sized the empty file: left so, with no index, the next start
    would take it for a segment whose index was lost.)"""
    cluster = cluster_factory(0, "64MiB")
    directory = small_disk / "nvme"
    (directory / SEGMENT).mkdir(mode=0o700, parents=True)
    (directory / SEGMENT / "segment.data").touch(mode=0o600)
    with pytest.raises(ClusterError, match="has room for"):
        cluster.add_node(extra=["--nvme", str(directory), "--nvme-size", "128MiB"])
    assert sorted(p.name for p in (directory / SEGMENT).iterdir()) == []
    node = cluster.add_node(extra=["--nvme", str(directory), "--nvme-size", "32MiB"])
    assert node.alive()
