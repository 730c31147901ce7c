"""The NVMe tier and warm restarts: file-backed segments that clients write directly, whose
objects survive a restart of their node or of the master."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import cluster_status, metric, wait_until

from kvpool import Client
from kvpool.errors import Fenced, KVPoolError, ObjectNotFound
from kvpool.local_cluster import DEFAULT_TENANT
from kvpool.proto import master_pb2 as pb
from kvpool.storage_node.object_index import live_entries

MiB = 1 << 20
GiB = 1 << 30
NVME, DRAM = 2, 1


def _counts(client: Client) -> tuple[int, int]:
    status = cluster_status(client.master)
    return status.nodes, status.objects


def tiers_of(client: Client, key: str) -> list[int]:
    return sorted(r.tier for r in client.stat(key).replicas)


def nvme_args(directory: Path, size: str = "1GiB") -> list[str]:
    return ["--nvme", str(directory), "--nvme-size", size]


@pytest.mark.parametrize("size", [4096, MiB, 32 * MiB, 200 * MiB], ids=lambda n: f"{n}B")
def test_objects_put_into_the_nvme_tier_come_back_identical(cluster_factory, tmp_path, size):
    cluster = cluster_factory(0, "64MiB")
    cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    with Client(cluster.master_address, timeout=60) as client:
        assert client.put("on-nvme", data, tier="nvme") == 1
        assert tiers_of(client, "on-nvme") == [NVME]
        target = np.empty(size, dtype=np.uint8)
        assert client.get_into("on-nvme", target) == size
        assert np.array_equal(target, data)
        assert client.get("on-nvme", verify=True) == data.tobytes()


def test_a_64_gib_sparse_segment_holds_gibibytes_on_a_24_gib_machine(cluster_factory, tmp_path):
    cluster = cluster_factory(0, "64MiB")
    cluster.add_node(extra=[*nvme_args(tmp_path / "big", "64GiB"), "--nvme-sparse"])
    chunk = np.random.default_rng(7).integers(0, 256, 64 * MiB, dtype=np.uint8)
    total = 3 * GiB
    with Client(cluster.master_address, timeout=120) as client:
        region = client.register_buffer(chunk)
        keys = [f"fill-{i:03d}" for i in range(total // chunk.size)]
        for start in range(0, len(keys), 8):
            batch = keys[start : start + 8]
            assert client.put_many([(k, chunk) for k in batch], tier="nvme") == [1] * len(batch)
        status = cluster_status(client.master)
        [nvme] = [s for s in status.segments if s.tier == NVME]
        assert nvme.capacity == 64 * GiB and nvme.used >= total and nvme.objects == len(keys)
        target = np.empty_like(chunk)
        for key in (keys[0], keys[len(keys) // 2], keys[-1]):
            client.get_into(key, target)
            assert np.array_equal(target, chunk)
        client.unregister_buffer(region)
    data_file = tmp_path / "big" / "kvpool-nvme" / "segment.data"
    assert data_file.stat().st_size == 64 * GiB  # the apparent size...
    assert data_file.stat().st_blocks * 512 < 8 * GiB  # ...but sparse: only written blocks


def test_a_node_killed_and_restarted_serves_its_nvme_and_shm_objects_again(
    cluster_factory, tmp_path
):
    cluster = cluster_factory(0, "64MiB")
    extra = [*nvme_args(tmp_path / "nvme"), "--dram-shm", "--shm-dir", str(tmp_path / "shm")]
    node = cluster.add_node(extra=extra)
    objects = {f"k{i}": os.urandom(n) for i, n in enumerate([1, 4096, MiB, 5 * MiB])}
    with Client(cluster.master_address) as client:
        assert client.put_many(list(objects.items()), tier="nvme") == [1] * 4
        assert client.put("in-shm", b"shared memory survives the process", tier="dram") == 1
        node.kill()
        node.restart()
        assert wait_until(lambda: cluster_status(client.master).objects == 5, timeout=5)
        for key, value in objects.items():
            assert client.get(key, verify=True) == value
        assert client.get("in-shm") == b"shared memory survives the process"


def test_a_damaged_index_entry_or_data_range_is_dropped_not_served(cluster_factory, tmp_path):
    cluster = cluster_factory(0, "64MiB")
    node = cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    objects = {f"obj-{i}": os.urandom(64 * 1024) for i in range(6)}
    with Client(cluster.master_address) as client:
        client.put_many(list(objects.items()), tier="nvme")
        node.kill()
        index = tmp_path / "nvme" / "kvpool-nvme" / "segment.index"
        data = tmp_path / "nvme" / "kvpool-nvme" / "segment.data"
        entries = live_entries(index)
        # obj-1's bytes rot on the device...
        with open(data, "r+b") as f:
            f.seek(entries[f"{DEFAULT_TENANT}/obj-1"].offset + 100)  # (the master's key)
            f.write(b"\xff" * 16)
        # ...and obj-2's index record is torn
        log = bytearray(index.read_bytes())
        at = log.rfind(b"obj-2")
        log[at] ^= 0xFF
        index.write_bytes(bytes(log))
        node.restart()
        assert wait_until(lambda: cluster_status(client.master).objects == 4, timeout=5)
        for key, value in objects.items():
            if key in ("obj-1", "obj-2"):
                with pytest.raises(ObjectNotFound):
                    client.get(key)
            else:
                assert client.get(key, verify=True) == value
    log_text = (cluster.run_dir / "node0.log").read_text()
    assert "dropped damaged objects on open" in log_text  # obj-1
    assert "skipped index records on open" in log_text  # obj-2's record, counted once


def test_a_removal_whose_index_record_rots_does_not_bring_the_object_back(
    cluster_factory, tmp_path
):
    """The damaged record may have been a removal: what was recorded before it is reported
    unconfirmed, and the master adopts only what it still knows (storage_node/index_log.py)."""
    cluster = cluster_factory(0, "64MiB")
    node = cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    kept = {f"kept-{i}": os.urandom(10_000) for i in range(3)}
    with Client(cluster.master_address) as client:
        client.put_many(list(kept.items()), tier="nvme")
        client.put("removed-prompt", b"meant to be gone", tier="nvme")
        kept["next-to-it"] = os.urandom(10_000)  # (its space, freed, stays a hole...)
        client.put("next-to-it", kept["next-to-it"], tier="nvme")
        client.remove("removed-prompt")
        # ...too small for this one, so its bytes stay to be served again; and this one's
        # record follows the removal's: the damage lies in the middle of the log
        kept["after"] = os.urandom(MiB)
        client.put("after", kept["after"], tier="nvme")
        assert wait_until(lambda: cluster_status(client.master).objects == 5, timeout=5)
        node.kill()
        index = tmp_path / "nvme" / "kvpool-nvme" / "segment.index"
        log = bytearray(index.read_bytes())
        log[log.rfind(b"removed-prompt")] ^= 0xFF  # the removal's record: the last naming it
        index.write_bytes(bytes(log))
        node.restart()
        assert wait_until(lambda: cluster_status(client.master).objects == 5, timeout=5)
        with pytest.raises(ObjectNotFound):
            client.get("removed-prompt")
        for key, value in kept.items():  # in doubt too, and adopted: the master knew them
            assert client.get(key, verify=True) == value
    assert "removed-prompt" not in {k.split("/", 1)[1] for k in live_entries(index)}
    log_text = (cluster.run_dir / "node0.log").read_text()
    assert "skipped index records on open" in log_text


def test_after_a_master_restart_every_object_is_readable_once_nodes_remount(
    cluster_factory, tmp_path
):
    cluster = cluster_factory(2, "64MiB")
    cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    objects = {f"d{i}": os.urandom(100_000 + i) for i in range(20)}
    on_nvme = {f"n{i}": os.urandom(200_000 + i) for i in range(5)}
    with Client(cluster.master_address) as client:
        client.put_many(list(objects.items()), replicas=2)
        client.put_many(list(on_nvme.items()), tier="nvme")
    cluster.master.kill()
    cluster.start_master()  # same port, empty memory: it learns everything from the nodes
    with Client(cluster.master_address) as client:
        assert wait_until(lambda: _counts(client) == (3, 25), timeout=8)
        for key, value in {**objects, **on_nvme}.items():
            assert client.get(key) == value
        assert len(client.stat("d0").replicas) == 2


def test_eviction_demotes_to_nvme_and_a_hit_promotes_back(cluster_factory, tmp_path):
    cluster = cluster_factory(
        0, "64MiB", master_args=["--high-watermark", "0.5", "--eviction-ratio", "0.2"]
    )
    cluster.add_node("16MiB", extra=nvme_args(tmp_path / "nvme", "256MiB"))
    objects = {f"hot-{i}": os.urandom(MiB) for i in range(12)}
    with Client(cluster.master_address) as client:
        for key, value in objects.items():
            client.put(key, value)  # DRAM first; past half full, old ones move to NVMe
        port = cluster.master_http_port
        assert wait_until(lambda: metric(port, "kvpool_demotions_total") >= 4, timeout=5)
        demoted = [k for k in objects if tiers_of(client, k) == [NVME]]
        assert demoted, "some objects now live on NVMe only"
        assert all(client.get(k) == objects[k] for k in objects), "none was dropped"
        victim = demoted[0]
        assert wait_until(lambda: DRAM in tiers_of(client, victim), timeout=5), "promoted"
        assert wait_until(lambda: metric(port, "kvpool_promotions_total") >= 1, timeout=2)
        assert client.get(victim) == objects[victim]


def test_every_put_that_returned_is_intact_after_a_kill_9_among_many_concurrent_puts(
    cluster_factory, tmp_path
):
    """Six writers put into the NVMe tier at once, alone and in batches, so that the node
    records many objects together (their disk waits shared); the node is killed (SIGKILL)
    while they are still putting. Every put that had returned is there, byte for byte, after
    the node restarts; the puts it cut short fail, none hangs."""
    cluster = cluster_factory(0, "64MiB")
    node = cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    returned: dict[str, bytes] = {}
    lock = threading.Lock()
    sizes = [4096, 100_000, MiB, 3 * MiB + 7]

    def writer(number: int, client: Client) -> None:
        rng = random.Random(number)
        for round_ in range(10_000):
            batch = 4 if number % 2 else 1
            items = [
                (f"w{number}/{round_}/{i}", rng.randbytes(rng.choice(sizes))) for i in range(batch)
            ]
            try:
                results = client.put_many(items, tier="nvme")
            except KVPoolError:
                return  # the node is gone: this put did not return
            stored = [(k, v) for (k, v), r in zip(items, results, strict=True) if r == 1]
            with lock:
                returned.update(stored)
            if len(stored) < len(items):
                return

    with Client(cluster.master_address, timeout=5) as client:
        writers = [threading.Thread(target=writer, args=(n, client)) for n in range(6)]
        for thread in writers:
            thread.start()
        assert wait_until(lambda: len(returned) >= 80, timeout=60), "puts go through"
        node.kill()  # while the writers are still putting
        with lock:
            survivors = dict(returned)  # every put that returned before the kill
        for thread in writers:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in writers), "no put hangs"
        node.restart()
        assert wait_until(
            lambda: cluster_status(client.master).objects >= len(survivors), timeout=10
        )
        for key, value in survivors.items():
            assert client.get(key, verify=True) == value, key


def test_large_writes_go_past_the_page_cache_and_are_recorded_with_their_true_checksums(
    cluster_factory, tmp_path
):
    """Objects of odd sizes, placed back to back (so most start and end inside a page), some
    large enough to go over two connections at once: their whole pages are written with
    direct I/O, their partial pages through the mapping, and each is recorded with the
    checksum of its bytes, combined from its parts' (verified on every get, and again by the
    node when it reopens the segment after a kill). Gets of them, not in the page cache,
    are read with direct I/O too, partial pages and all. (The client does not write the
    file itself, as one on the node's host may: it sends the bytes as another host would.)"""
    cluster = cluster_factory(0, "64MiB")
    node = cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    rng = random.Random(5)
    sizes = [65_537, 300_001, MiB, MiB + 1, 4 * MiB + 4097, 9 * MiB - 3]
    objects = {f"odd-{i}": rng.randbytes(n) for i, n in enumerate(sizes)}
    port = node.ready["http_port"]
    combined = 'kvpool_node_record_checksums_total{source="parts"}'
    with Client(cluster.master_address, timeout=30, same_host_mapping=False) as client:
        assert client.put_many(list(objects.items()), tier="nvme") == [1] * len(objects)
        for key, value in objects.items():
            assert client.get(key, verify=True) == value, key
        assert metric(port, "kvpool_node_direct_write_bytes_total") >= sum(sizes) - 2 * 4096 * 8
        assert metric(port, combined) == len(objects), "no object's bytes were read back"
        assert metric(port, "kvpool_node_direct_read_bytes_total") > 0, "gets read past the cache"
        # a hit promotes the object to DRAM, read from the disk the same way: byte for byte
        promoted = "odd-4"
        assert wait_until(lambda: DRAM in tiers_of(client, promoted), timeout=10)
        assert client.get(promoted, verify=True) == objects[promoted]
        node.kill()
        node.restart()
        assert wait_until(lambda: cluster_status(client.master).objects == len(objects), 10)
        for key, value in objects.items():
            assert client.get(key, verify=True) == value, key


def test_a_restarted_node_takes_no_new_object_while_its_old_process_capabilities_run(
    cluster_factory, tmp_path
):
    """(The node's seals, which end a removed object's read capabilities early, lived in its
    old process; its segment keeps its id. A reader that kept such a capability could read
    whatever was put in that space next, until the capability ran out.)"""
    cluster = cluster_factory(0, "64MiB")
    node = cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    with Client(cluster.master_address, timeout=3) as client:
        assert client.put("read-then-removed", b"r" * 4096, tier="nvme") == 1
        request = pb.GetReplicasRequest(
            client_id=client.client_id, keys=["read-then-removed"], lease_ms=20_000
        )
        located = client._session.link.call("GetReplicas", request, time.monotonic() + 5)
        assert located.objects[0].replicas[0].capability, "a read capability for 20 s"
        client.remove("read-then-removed", force=True)
        node.kill()
        node.restart()
        assert wait_until(lambda: cluster_status(client.master).nodes == 1, timeout=10)
        with pytest.raises(Fenced, match="capabilities signed for the node's earlier process"):
            client.put("put-next", b"n" * 4096, tier="nvme")


def test_a_moved_object_is_read_where_a_newer_one_was_and_back_where_it_was(
    cluster_factory, tmp_path
):
    """A demotion or promotion keeps the object's generation. Where it lands may be sealed
    by a newer one: the NVMe place of an object removed since, or its own DRAM place, left
    at the demotion. Its readers' grants are honoured there all the same (over the checked
    stream, as a client on another host reads); before, every read was refused for the
    half hour the node keeps a seal."""
    cluster = cluster_factory(0, "64MiB", master_args=["--reclaim-delay", "1"])
    cluster.add_node("8MiB", extra=nvme_args(tmp_path / "nvme", "32MiB"))
    old = os.urandom(MiB)
    with Client(cluster.master_address, same_host_mapping=False) as client:
        client.put("old", old, tier="dram", checksum=True)
        client.put("new", os.urandom(2 * MiB), tier="nvme", checksum=True)
        client.remove("new")  # (its NVMe place is sealed, with a newer generation)
        time.sleep(2)  # (and free again after the reclaim delay)
        fillers = []

        def demoted() -> bool:
            if tiers_of(client, "old") == [NVME]:
                return True
            fillers.append(f"fill-{len(fillers)}")
            client.put(fillers[-1], os.urandom(MiB // 2), tier="dram")
            return False

        assert wait_until(demoted, timeout=40, interval=0.5), "DRAM filled: 'old' moved"
        assert client.get("old", verify=True) == old, "read where the removed object was"
        for key in fillers:
            client.remove(key, force=True)
        time.sleep(3)  # (their DRAM is free again: the next hit promotes 'old')
        assert client.get("old", verify=True) == old
        assert wait_until(lambda: DRAM in tiers_of(client, "old"), timeout=10), "promoted"
        for _ in range(3):
            assert client.get("old", verify=True) == old, "read back where it was"
