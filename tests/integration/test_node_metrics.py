"""A storage node's /metrics says what it holds and what it did: objects and bytes per segment
and tier, the master's commands by kind with their latency, its disk syncs, its copies between
tiers; and nothing of the master's. Clients' transfers are one-sided: a get leaves no trace."""

from __future__ import annotations

import math
import os
import re
import urllib.request
from pathlib import Path

from helpers import cluster_status, metric, wait_until
from prometheus_client.parser import text_string_to_metric_families

from kvpool import Client
from kvpool.common.status import Tier

KiB, MiB = 1 << 10, 1 << 20


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


class Scrape:
    """One scrape of a /metrics page: sample values by name and labels."""

    def __init__(self, port: int) -> None:
        self.samples = [
            sample
            for family in text_string_to_metric_families(metrics_text(port))
            for sample in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(
            s.value for s in self.samples if s.name == name and labels.items() <= s.labels.items()
        )

    def by_segment(self, name: str) -> dict[tuple[str, str], float]:
        """{(segment, tier): value} of a metric labelled by segment and tier."""
        return {
            (s.labels["segment"], s.labels["tier"]): s.value for s in self.samples if s.name == name
        }


def node_with_dram_and_nvme(cluster_factory, tmp_path: Path, dram: str = "64MiB", **options):
    """A master and one node with a DRAM and an NVMe segment; returns (cluster, node's HTTP
    port, {tier: segment id})."""
    cluster = cluster_factory(0, dram, **options)
    node = cluster.add_node(extra=["--nvme", str(tmp_path / "nvme"), "--nvme-size", "256MiB"])
    port = node.ready["http_port"]
    segments = {
        tier: segment for segment, tier in Scrape(port).by_segment("kvpool_node_segment_bytes")
    }
    assert set(segments) == {"dram", "nvme"}
    return cluster, port, segments


def master_holdings(client: Client) -> dict[str, int]:
    """{segment id: objects} as the master counts them."""
    return {s.segment_id: s.objects for s in cluster_status(client.master).segments}


def test_objects_and_bytes_held_are_counted_per_segment_and_tier(cluster_factory, tmp_path):
    cluster, port, segment = node_with_dram_and_nvme(cluster_factory, tmp_path)
    in_dram = {"d-tiny": os.urandom(1), "d-page": os.urandom(4 * KiB), "d-big": os.urandom(MiB + 3)}
    in_nvme = {"n-odd": os.urandom(5000), "n-big": os.urandom(2 * MiB)}
    with Client(cluster.master_address) as client:
        before = Scrape(port)
        assert before.by_segment("kvpool_node_objects") == {
            (segment["dram"], "dram"): 0,
            (segment["nvme"], "nvme"): 0,
        }
        client.put_many(in_dram)
        client.put_many(in_nvme, tier="nvme")

        held = Scrape(port)
        assert held.by_segment("kvpool_node_objects") == {
            (segment["dram"], "dram"): 3,
            (segment["nvme"], "nvme"): 2,
        }
        assert held.by_segment("kvpool_node_object_bytes") == {
            (segment["dram"], "dram"): sum(map(len, in_dram.values())),
            (segment["nvme"], "nvme"): sum(map(len, in_nvme.values())),
        }
        assert master_holdings(client) == {segment["dram"]: 3, segment["nvme"]: 2}

        assert [client.get(key) for key in in_dram] == list(in_dram.values())
        assert Scrape(port).by_segment("kvpool_node_objects") == held.by_segment(
            "kvpool_node_objects"
        ), "reads change nothing a node holds"

        client.remove("d-big", force=True)  # leased by the reads above
        client.remove("n-odd")
        after = Scrape(port)
        assert after.by_segment("kvpool_node_objects") == {
            (segment["dram"], "dram"): 2,
            (segment["nvme"], "nvme"): 1,
        }
        assert after.by_segment("kvpool_node_object_bytes") == {
            (segment["dram"], "dram"): 1 + 4 * KiB,
            (segment["nvme"], "nvme"): 2 * MiB,
        }


def test_commands_are_counted_by_kind_with_their_latency_and_gets_leave_no_trace(
    cluster_factory, tmp_path
):
    cluster, port, segment = node_with_dram_and_nvme(cluster_factory, tmp_path)
    dram_values = [os.urandom(n) for n in (100, 4 * KiB, MiB, 3 * MiB)]
    nvme_values = [os.urandom(n) for n in (7, 2 * MiB)]
    with Client(cluster.master_address) as client:
        for i, value in enumerate(dram_values):
            client.put(f"dram-{i}", value)
        for i, value in enumerate(nvme_values):
            client.put(f"nvme-{i}", value, tier="nvme")
        done = Scrape(port)

        persists = done.value("kvpool_node_commands_total", kind="persist", outcome="ok")
        assert 2 <= persists <= len(dram_values) + len(nvme_values)
        assert done.value("kvpool_node_commands_total", outcome="failed") == 0
        # (the NVMe segment's blocks were all allocated at start: nothing to prepare)
        assert done.value("kvpool_node_commands_total", kind="prepare") == 0
        assert done.value("kvpool_node_command_seconds_count", kind="persist") == persists
        assert done.value("kvpool_node_command_seconds_sum", kind="persist") > 0

        for tier, values in (("dram", dram_values), ("nvme", nvme_values)):
            labels = {"segment": segment[tier], "tier": tier}
            assert done.value("kvpool_node_persisted_objects_total", **labels) == len(values)
            assert done.value("kvpool_node_persisted_bytes_total", **labels) == sum(
                map(len, values)
            )
        nvme = segment["nvme"]
        assert done.value("kvpool_node_sync_seconds_count", segment=nvme, target="data") >= 1
        assert done.value("kvpool_node_sync_seconds_count", segment=nvme, target="index") >= 1
        assert done.value("kvpool_node_sync_seconds_count", segment=segment["dram"]) == 0, (
            "a memfd segment never waits for a disk"
        )
        log_bytes = done.by_segment("kvpool_node_index_log_bytes")
        assert set(log_bytes) == {(nvme, "nvme")}, "persistent segments only"
        [index_file] = (tmp_path / "nvme").rglob("segment.index")
        assert log_bytes[nvme, "nvme"] == index_file.stat().st_size
        free = done.by_segment("kvpool_node_disk_free_bytes")[nvme, "nvme"]
        room = os.statvfs(index_file.parent)
        # (other tests write to the same file system meanwhile: within its size, not equal)
        assert 0 < free < room.f_blocks * room.f_frsize, "the file system's room"

        assert [client.get(f"dram-{i}") for i in range(len(dram_values))] == dram_values
        after_gets = Scrape(port)
        for name in (
            "kvpool_node_commands_total",
            "kvpool_node_persisted_objects_total",
            "kvpool_node_persisted_bytes_total",
            "kvpool_node_copies_total",
        ):
            assert after_gets.value(name) == done.value(name), f"{name} moved on gets"

        client.remove("nvme-0")  # answered once the node has forgotten it
        forgets = Scrape(port).value("kvpool_node_commands_total", kind="forget", outcome="ok")
        assert forgets == done.value("kvpool_node_commands_total", kind="forget") + 1


def test_demotions_and_promotions_are_counted_as_copies_by_direction(cluster_factory, tmp_path):
    high_watermark = ["--high-watermark", "0.5", "--eviction-ratio", "0.2"]
    cluster, port, _ = node_with_dram_and_nvme(
        cluster_factory, tmp_path, dram="16MiB", master_args=high_watermark
    )
    objects = {f"hot-{i}": os.urandom(MiB) for i in range(12)}

    def copies(direction: str) -> tuple[float, float]:
        scrape = Scrape(port)
        return (
            scrape.value("kvpool_node_copies_total", direction=direction),
            scrape.value("kvpool_node_copied_bytes_total", direction=direction),
        )

    with Client(cluster.master_address) as client:
        for key, value in objects.items():
            client.put(key, value)  # DRAM first; past half full, old ones move to NVMe
        assert wait_until(lambda: copies("demotion")[0] >= 4, timeout=5)
        demoted, demoted_bytes = copies("demotion")
        assert demoted_bytes == demoted * MiB
        assert copies("promotion") == (0, 0)

        def only_on_nvme() -> list[str]:
            return [k for k in objects if [r.tier for r in client.stat(k).replicas] == [Tier.NVME]]

        assert wait_until(lambda: bool(only_on_nvme()), timeout=5)
        victim = only_on_nvme()[0]
        assert client.get(victim) == objects[victim]  # an NVMe hit: promoted back to DRAM
        assert wait_until(lambda: copies("promotion")[0] >= 1, timeout=5)
        promoted, promoted_bytes = copies("promotion")
        assert promoted_bytes == promoted * MiB

        def node_agrees_with_master() -> bool:
            held = Scrape(port).by_segment("kvpool_node_objects")
            return {s: n for (s, _), n in held.items()} == master_holdings(client)

        assert wait_until(node_agrees_with_master, timeout=5), "once the moves settle"


def test_a_node_exports_no_master_metric(cluster_factory):
    cluster = cluster_factory(1, "16MiB")
    with Client(cluster.master_address) as client:
        client.put("one", b"x")
    text = metrics_text(cluster.nodes[0].ready["http_port"])
    assert "kvpool_node_objects" in text
    assert re.findall(r"\bkvpool_master_\w+", text) == [], (
        "the node process imported kvpool.master.metrics, whose counters register in the "
        "process-wide registry /metrics serves (as it once did through kvpool/cli/main.py "
        "importing kvpool.master.main for every subcommand)"
    )


def test_a_node_compares_its_wall_clock_with_the_masters_at_each_heartbeat(cluster_factory):
    """Capabilities are checked against the node's wall clock: each heartbeat's answer carries
    the master's, and the node exports how far apart they are (one host here: about 0)."""
    cluster = cluster_factory(1, "16MiB")
    port = cluster.nodes[0].ready["http_port"]

    def measured() -> bool:
        return not math.isnan(Scrape(port).value("kvpool_node_clock_offset_seconds"))

    assert wait_until(measured, timeout=10.0)
    assert abs(Scrape(port).value("kvpool_node_clock_offset_seconds")) < 0.25


def test_seals_of_forgotten_objects_go_once_the_masters_grants_for_them_end(cluster_factory):
    """Each removed or evicted object leaves the node a seal of its grants (the checked
    stream refuses them). The master's Forget says when its grants for the segment end (a
    put's write window, a read's lease), and the seal goes then: before, every seal stayed
    half an hour, and a node forgetting thousands of objects a second held gigabytes."""
    cluster = cluster_factory(1, "64MiB")
    port = cluster.nodes[0].ready["http_port"]
    with Client(cluster.master_address, timeout=30, lease_ttl=2.0) as client:
        keys = [f"sealed-{i}" for i in range(200)]
        assert client.put_many([(k, b"x" * 4096) for k in keys]) == [1] * len(keys)
        assert client.get_many(keys) == [b"x" * 4096] * len(keys)  # (2 s read leases)
        assert client.remove_many(keys, force=True) == [None] * len(keys)
        assert metric(port, "kvpool_node_seals") >= len(keys)

        def pruned() -> bool:
            client.put("nudge", b"y")  # (seals are pruned as commands come: a Forget)
            client.remove("nudge", force=True)
            return metric(port, "kvpool_node_seals") <= 2

        # write windows (3 s) and leases (2 s), the clock allowance and SEAL_MARGIN (10 s):
        # far from SEAL_LIFE (30 min)
        assert wait_until(pruned, timeout=40, interval=1.0)
