"""What the master's /metrics shows stays bounded whatever its peers send (master/metrics.py).

A node can mount any number of segments under any names: at most MAX_SEGMENT_SERIES segments
get series of their own (the first to mount), the rest are summed per tier under
``segment="other"`` (as is one whose labels would repeat another's), and a long name is cut
(two long names stay two series). A ``method`` label only ever names one of the master's
calls: anything else is counted as "other".
"""

from __future__ import annotations

import dataclasses

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.registry import CollectorRegistry
from state_helpers import segment_info

from kvpool.common.status import Tier
from kvpool.master import metrics
from kvpool.master.load_shedding import LoadShedder
from kvpool.master.records import ClusterSnapshot, Counters, SegmentUsage


def usage(node: str, segment: str, capacity: int, tier: Tier = Tier.DRAM) -> SegmentUsage:
    info = dataclasses.replace(segment_info(node, capacity, segment), tier=tier)
    return SegmentUsage(info, capacity, used=capacity // 2, objects=3, largest_free=0)


def scrape(segments: list[SegmentUsage]) -> bytes:
    collector = metrics.StateCollector()
    collector.publish(ClusterSnapshot(segments, 0, 0, len(segments)), Counters())
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry)


def series(text: bytes, name: str) -> dict[str, float]:
    """The samples of ``name``, by their labels as written (``node="n0",segment=...``), in
    the order of the scrape."""
    found = {}
    for line in text.decode().splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            found[labels] = float(value)
    return found


def test_thousands_of_segments_cost_a_scrape_no_more_than_the_first_ones():
    first = [usage(f"n{i}", f"n{i}/dram0", 1 << 20) for i in range(metrics.MAX_SEGMENT_SERIES)]
    more_dram = [usage(f"x{i}", f"x{i}/dram0", 1 << 20) for i in range(2000)]
    more_nvme = [usage(f"y{i}", f"y{i}/nvme0", 1 << 30, Tier.NVME) for i in range(1000)]

    bounded = scrape(first)
    flooded = scrape(first + more_dram + more_nvme)

    capacity = series(flooded, "kvpool_segment_capacity_bytes")
    assert len(capacity) == metrics.MAX_SEGMENT_SERIES + 2  # the first ones, one "other" per tier
    labels = list(capacity)
    assert labels[:2] == [
        'node="n0",segment="n0/dram0",tier="dram"',
        'node="n1",segment="n1/dram0",tier="dram"',
    ]
    other_dram = 'node="other",segment="other",tier="dram"'
    other_nvme = 'node="other",segment="other",tier="nvme"'
    assert labels[-2:] == [other_dram, other_nvme]
    assert (capacity[other_dram], capacity[other_nvme]) == (2000 << 20, 1000 << 30)
    assert series(flooded, "kvpool_segment_objects")[other_nvme] == 3 * 1000
    assert b"kvpool_segments 3256.0" in flooded
    assert len(flooded) < len(bounded) + 2048, "a few lines more, whatever the count"


def test_a_long_segment_name_is_cut_and_two_that_start_alike_stay_two_series():
    names = ["s" * 5000 + "-a", "s" * 5000 + "-b"]
    text = scrape([usage("n1", name, 1 << 20) for name in names])
    capacity = series(text, "kvpool_segment_capacity_bytes")
    assert len(capacity) == 2
    labels = [written.split('segment="')[1].split('"')[0] for written in capacity]
    assert all(len(label) <= metrics.MAX_LABEL_CHARS for label in labels)
    assert labels[0] != labels[1]


def test_a_method_label_only_names_one_of_the_master_s_calls():
    known = metrics.labelled(metrics.REQUESTS, "PutStart")
    assert metrics.labelled(metrics.REQUESTS, "PutStart") is known, "looked up once"
    remembered = len(metrics._SERIES)
    before = REGISTRY.get_sample_value("kvpool_master_requests_total", {"method": "other"}) or 0

    for i in range(1000):
        metrics.labelled(metrics.REQUESTS, f"Forged{i}").inc()

    assert REGISTRY.get_sample_value("kvpool_master_requests_total", {"method": "other"}) == (
        before + 1000
    )
    assert REGISTRY.get_sample_value("kvpool_master_requests_total", {"method": "Forged1"}) is None
    assert len(metrics._SERIES) == remembered, "nothing remembered for a forged name"


def test_a_shed_call_is_counted_under_its_method_or_other():
    shedder = LoadShedder(1)
    assert shedder.admit("/kvpool.Master/PutStart") is not None

    def shed(method: str) -> float:
        value = REGISTRY.get_sample_value("kvpool_master_shed_total", {"method": method})
        return value or 0.0

    before_known, before_other = shed("GetReplicas"), shed("other")
    assert shedder.admit("/kvpool.Master/GetReplicas") is None
    assert shedder.admit("/kvpool.Master/" + "X" * 1000) is None
    assert (shed("GetReplicas"), shed("other")) == (before_known + 1, before_other + 1)


def test_a_segment_named_like_the_sum_of_the_others_is_summed_in_not_repeated():
    first = [usage(f"n{i}", f"n{i}/dram0", 1 << 20) for i in range(metrics.MAX_SEGMENT_SERIES)]
    text = scrape([*first, usage("n9999", "late", 1 << 20), usage("other", "other", 1 << 20)])
    capacity = series(text, "kvpool_segment_capacity_bytes")
    written = [line for line in text.decode().splitlines() if 'segment="other"' in line]
    assert len(written) == 3, "one series per family"
    assert capacity['node="other",segment="other",tier="dram"'] == 2 << 20
