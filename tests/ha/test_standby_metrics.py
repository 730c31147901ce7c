"""Only the master that leads exports the cluster's state on /metrics, and every master says
whether it leads (``kvpool_master_leader``). A master that lost leadership and stays up as a
standby used to export its last term's snapshot for good: a dashboard summing
``kvpool_segment_capacity_bytes`` over the masters' pods counted the cluster twice after an
ordinary failover."""

from __future__ import annotations

import signal
import time
import urllib.request

from helpers import wait_until

from kvpool import Client

TTL = 2  # seconds: the masters' etcd lease (the default)
#: Series of the cluster's state, which only the leader exports.
STATE_SERIES = (
    "kvpool_objects",
    "kvpool_nodes",
    "kvpool_segments",
    "kvpool_segment_capacity_bytes",
    "kvpool_segment_used_bytes",
    "kvpool_puts_published_total",
    "kvpool_tenant_objects",
)


def scrape(port: int) -> dict[str, list[float]]:
    """Sample name -> the values of its series, as 127.0.0.1:``port``/metrics serves them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list[float]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            samples.setdefault(series.split("{", 1)[0], []).append(float(value))
    return samples


def leads(samples: dict[str, list[float]]) -> float | None:
    return samples.get("kvpool_master_leader", [None])[0]


def test_a_master_that_loses_leadership_stops_exporting_the_cluster_state(ha_cluster):
    cluster = ha_cluster(masters=2, nodes=2)
    old = cluster.leader()
    assert old is not None
    standby = next(m for m in cluster.masters if m is not old)
    with Client(cluster.master_address, timeout=20) as client:
        for i in range(5):
            client.put(f"before/{i}", b"x" * 1000)
        assert wait_until(
            lambda: scrape(old.ready["http_port"]).get("kvpool_objects") == [5.0], timeout=10
        )
        before = scrape(old.ready["http_port"])
        assert leads(before) == 1.0
        waiting = scrape(standby.ready["http_port"])
        assert leads(waiting) == 0.0  # a standby that never led: none of the state's series
        assert [name for name in STATE_SERIES if name in waiting] == []

        # The leader stops past its lease (a GC pause, a stopped VM): the standby takes over,
        # and the old leader, back, finds its lease gone and stays up as a standby.
        old.signal(signal.SIGSTOP)
        try:
            new = cluster.wait_for_leader(timeout=4 * TTL + 5)
        finally:
            old.signal(signal.SIGCONT)
        assert new is standby
        for i in range(3):
            client.put(f"after/{i}", b"y" * 1000)

        def stepped_down() -> bool:
            samples = scrape(old.ready["http_port"])
            return leads(samples) == 0.0 and not any(n in samples for n in STATE_SERIES)

        assert wait_until(stepped_down, timeout=4 * TTL), (
            "the old leader still exports the cluster's state (or never says it stopped "
            "leading): "
            + str({n: v for n, v in scrape(old.ready["http_port"]).items() if n in STATE_SERIES})
            + f" kvpool_master_leader={leads(scrape(old.ready['http_port']))}"
        )
        assert wait_until(
            lambda: scrape(new.ready["http_port"]).get("kvpool_objects") == [8.0], timeout=20
        )
        leading = scrape(new.ready["http_port"])
        assert leads(leading) == 1.0
        assert all(name in leading for name in STATE_SERIES)
        # a sum over both pods counts the cluster once
        assert sum(leading["kvpool_segment_capacity_bytes"]) == sum(
            before["kvpool_segment_capacity_bytes"]
        )
        # still a standby a while later (its ticks publish nothing)
        time.sleep(1.0)
        assert not any(name in scrape(old.ready["http_port"]) for name in STATE_SERIES)
        assert cluster.leader() is new


def test_a_master_without_etcd_says_it_leads(cluster_factory):
    cluster = cluster_factory(1, "64MiB")
    samples = scrape(cluster.master_http_port)
    assert leads(samples) == 1.0
    assert "kvpool_objects" in samples or wait_until(
        lambda: "kvpool_objects" in scrape(cluster.master_http_port), timeout=5
    )
