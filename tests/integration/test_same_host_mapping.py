"""A client on a storage node's host maps the node's DRAM and copies with plain loads and
stores; what it moves is byte for byte what UCX moves, and a dead node's memory is let go."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers import cluster_status, wait_until
from test_node_failure import node_read_first
from test_nvme import nvme_args

from kvpool import Client
from kvpool.common.status import Tier
from kvpool.proto import master_pb2 as pb

SIZES = [1, 4096, 1 << 20, (5 << 20) + 3]


def _mapped_ranges() -> str:
    with open("/proc/self/maps") as maps:
        return "".join(line for line in maps if "memfd:kvpool-" in line)


def _dram_segments(client: Client) -> set[str]:
    return {s.segment_id for s in cluster_status(client.master).segments if s.tier == Tier.DRAM}


def test_mapped_and_ucx_clients_read_each_others_bytes_exactly(cluster_factory):
    cluster = cluster_factory(1, "64MiB")
    objects = {f"obj-{n}": os.urandom(n) for n in SIZES}
    with (
        Client(cluster.master_address) as mapped,
        Client(cluster.master_address, same_host_mapping=False) as remote,
    ):
        assert mapped.put_many([(f"m/{k}", v) for k, v in objects.items()]) == [1] * len(SIZES)
        assert remote.put_many([(f"u/{k}", v) for k, v in objects.items()]) == [1] * len(SIZES)
        for key, value in objects.items():
            assert remote.get(f"m/{key}") == value
            assert mapped.get(f"u/{key}") == value
            target = np.zeros(len(value) + 10, dtype=np.uint8)
            assert mapped.get_into(f"u/{key}", target) == len(value)
            assert target[: len(value)].tobytes() == value and not target[len(value) :].any()
        assert set(mapped.mapped_segments) == _dram_segments(mapped)
        assert remote.mapped_segments == []
        assert _mapped_ranges()  # the segment is mapped into this process


def test_no_capability_is_granted_where_the_client_moves_bytes_through_its_mapping(
    cluster_factory,
):
    """Capabilities are for the node's checked stream: a client that maps a segment names it
    (``mapped_segments``) and the master grants none there, for its gets and its puts."""
    cluster = cluster_factory(1, "64MiB")
    with Client(cluster.master_address) as client:
        session = client._session
        asked: list[tuple[str, list[str]]] = []
        call = session.link.call

        def noted(method, request, deadline):  # (what the client asks; nothing changed)
            if method in ("GetReplicas", "PutStart"):
                asked.append((method, list(request.mapped_segments)))
            return call(method, request, deadline)

        session.link.call = noted
        client.put("first", b"x" * 4096)  # (maps the segment, read-write, for the put)
        [segment] = client.mapped_segments
        data = os.urandom((5 << 20) + 3)
        client.put("second", data)
        assert client.get("second") == data
        assert asked == [
            ("PutStart", []),
            ("PutStart", [segment]),
            ("GetReplicas", [segment]),
        ]

        def replica(mapped: list[str]) -> pb.Replica:
            request = pb.GetReplicasRequest(
                client_id=session.client_id, keys=["second"], mapped_segments=mapped
            )
            return call("GetReplicas", request, time.monotonic() + 10).objects[0].replicas[0]

        assert replica([]).capability, "a secure master grants one for the checked stream"
        assert replica([segment]).capability == b""
        assert replica(["another/segment"]).capability


@pytest.mark.parametrize("same_host_mapping", [True, False])
def test_batches_of_back_to_back_slots_move_exactly_their_bytes(cluster_factory, same_host_mapping):
    """A batch written from, and read into, consecutive slots of one buffer is usually also
    consecutive in the segment: the client moves it as one transfer (client/coalescing.py).
    Every object still gets exactly its own bytes, and nothing beyond them is touched."""
    cluster = cluster_factory(1, "64MiB")
    size, count = 4096, 32
    source = np.frombuffer(os.urandom(size * count), dtype=np.uint8)
    target = np.zeros(size * (count + 1), dtype=np.uint8)
    keys = [f"slot/{same_host_mapping}/{i}" for i in range(count)]
    with Client(cluster.master_address, same_host_mapping=same_host_mapping) as client:
        region = client.register_buffer(target)
        slots = [source[i * size : (i + 1) * size] for i in range(count)]
        assert client.put_many(list(zip(keys, slots, strict=True))) == [1] * count
        places = [client.stat(key).replicas[0].address for key in keys]
        assert places == [places[0] + i * size for i in range(count)], "back to back"
        views = [target[i * size : (i + 1) * size] for i in range(count)]
        assert client.get_into_many(keys, views) == [size] * count
        assert target[: size * count].tobytes() == source.tobytes()
        assert not target[size * count :].any()
        client.unregister_buffer(region)


def test_a_killed_nodes_memory_is_unmapped_and_reads_use_the_surviving_replica(cluster_factory):
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", "1.5"])
    data = os.urandom(3 << 20)
    with Client(cluster.master_address, timeout=5) as client:
        client.put("precious", data, replicas=2)
        assert client.get("precious") == data
        assert len(client.mapped_segments) == 2
        node = node_read_first(cluster, client, "precious")  # so the get must fall over
        victim = node.ready["node_id"]
        node.kill()
        # the reaper lets go of the dead node's memory without waiting for the next call
        assert wait_until(
            lambda: not any(s.startswith(victim + "/") for s in client.mapped_segments), 15.0
        )
        assert _mapped_ranges().count("memfd:kvpool-") == 1
        assert client.get("precious") == data  # over UCX: the first replica fails, the next serves
        assert wait_until(lambda: cluster_status(client.master).nodes == 1, timeout=30.0)
        assert client.get("precious") == data


def test_nvme_segments_are_not_mapped(cluster_factory, tmp_path):
    """A page-cache miss or an I/O error of a file on disk must not land in the client."""
    cluster = cluster_factory(0, "64MiB")
    cluster.add_node(extra=nvme_args(tmp_path / "nvme"))
    with Client(cluster.master_address) as client:
        client.put("on-nvme", b"x" * 100_000, tier="nvme")
        client.put("in-dram", b"y" * 100_000, tier="dram")
        assert client.get("on-nvme") == b"x" * 100_000
        assert client.get("in-dram") == b"y" * 100_000
        assert set(client.mapped_segments) == _dram_segments(client)


def _mapping_modes() -> list[str]:
    """The permissions of each mapping of a node's segment in this process, sorted."""
    return sorted(line.split()[1] for line in _mapped_ranges().splitlines())


def test_clients_of_one_process_share_one_mapping_of_a_segment(cluster_factory):
    """Gets copy through a read-only mapping, puts through a read-write one: one of each,
    shared by the process's clients; a client that puts reads through its read-write one
    (one set of page tables to fill, not two)."""
    cluster = cluster_factory(1, "64MiB")
    data = os.urandom(2 << 20)
    with Client(cluster.master_address) as first:
        first.put("shared", data)
        with Client(cluster.master_address) as second:
            assert second.get("shared") == data and first.get("shared") == data
            assert first.mapped_segments == second.mapped_segments != []
            assert _mapping_modes() == ["r--s", "rw-s"]  # the reader's and the writer's
        assert first.get("shared") == data  # the other client closing unmapped its own only
        assert _mapping_modes() == ["rw-s"]
    assert _mapped_ranges() == ""  # the last client let go


def test_a_client_that_read_first_reads_through_its_read_write_mapping_once_it_puts(
    cluster_factory,
):
    cluster = cluster_factory(1, "64MiB")
    data = os.urandom(1 << 20)
    with Client(cluster.master_address) as writer:
        writer.put("first", data)
    with Client(cluster.master_address) as client:
        assert client.get("first") == data
        assert _mapping_modes() == ["r--s"]
        client.put("second", data[::-1])
        assert _mapping_modes() == ["rw-s"]  # the read-only one let go
        assert client.get("first") == data and client.get("second") == data[::-1]
        assert _mapping_modes() == ["rw-s"]
    assert _mapped_ranges() == ""


@pytest.mark.parametrize("prefault", [True, False])
def test_a_shm_segment_is_mapped_only_when_all_its_pages_exist(cluster_factory, tmp_path, prefault):
    """A store into a hole of a full /dev/shm would kill the client with SIGBUS."""
    cluster = cluster_factory(0, "64MiB")
    flag = "--prefault" if prefault else "--no-prefault"
    cluster.add_node(extra=["--dram-shm", "--shm-dir", str(tmp_path / "shm"), flag])
    with Client(cluster.master_address) as client:
        client.put("in-shm", b"z" * 10_000)
        assert client.get("in-shm") == b"z" * 10_000
        assert bool(client.mapped_segments) is prefault
