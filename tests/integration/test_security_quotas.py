"""Per-tenant quotas and fair eviction, on a real secure cluster (``kvpool master --quotas``).

- Each quota an admin sets, once reached, makes the tenant's call fail with QuotaExceeded
  naming the quota: objects, DRAM bytes, NVMe bytes, bytes reserved and not yet committed,
  objects under read lease, calls in flight (the last at once, never retried).
- Other tenants are not held to another's quota.
- A quota changed with ``kvpool quota set`` takes effect without a restart (within ~2 s).
- A flood of reservations from one tenant evicts none of another tenant's objects while that
  tenant holds no more than its share: all of them stay readable, byte for byte.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool import Client
from kvpool.cli.main import main as kvpool_main
from kvpool.errors import NoSpace, QuotaExceeded
from kvpool.local_cluster import LocalCluster

MiB = 1 << 20

#: One tenant per quota, each held to that quota only; "free" is held to none.
QUOTAS = {
    "version": 1,
    "tenants": {
        "objects": {"objects": 2},
        "dram": {"dram_bytes": "1MiB"},
        "nvme": {"nvme_bytes": 0},
        "reserved": {"reserved_bytes": "1MiB"},
        "leases": {"leases": 1},
        "inflight": {"inflight": 0},
    },
}
TENANTS = (*QUOTAS["tenants"], "free")


@pytest.fixture(scope="module")
def quotas_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("quotas") / "quotas.json"
    path.write_text(json.dumps(QUOTAS))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, quotas_file) -> Iterator[LocalCluster]:
    with LocalCluster(
        1,
        "64MiB",
        tenants=TENANTS,
        master_args=["--quotas", str(quotas_file)],
        run_dir=tmp_path_factory.mktemp("quota-cluster"),
    ) as cluster:
        yield cluster


def client_of(cluster: LocalCluster, tenant: str, **options) -> Client:
    return Client(
        cluster.master_address, timeout=10, **cluster.client_credentials(tenant), **options
    )


def refused(error: pytest.ExceptionInfo[QuotaExceeded], quota: str) -> str:
    message = str(error.value)
    assert f"{quota} quota" in message, message
    return message


def test_a_tenant_at_its_objects_quota_gets_quota_exceeded(cluster):
    with client_of(cluster, "objects") as client:
        client.put("one", b"1" * 100)
        client.put("two", b"2" * 100)
        with pytest.raises(QuotaExceeded) as error:
            client.put("three", b"3" * 100)
        assert "is at its objects quota of 2 objects (2 held)" in refused(error, "objects")
        client.remove("one")
        client.put("three", b"3" * 100)
        assert client.get("three") == b"3" * 100


def test_a_put_beyond_the_dram_quota_gets_quota_exceeded_and_other_tenants_are_not_held(cluster):
    with client_of(cluster, "dram") as client, client_of(cluster, "free") as free:
        client.put("small", b"s" * (512 << 10))
        with pytest.raises(QuotaExceeded) as error:
            client.put("big", b"b" * MiB)
        refused(error, "dram_bytes")
        results = client.put_many([("fits", b"f" * 1000), ("too-big", b"t" * MiB)])
        assert results[0] == 1 and isinstance(results[1], QuotaExceeded), "per key, in a batch"
        free.put("big", b"b" * MiB)
        assert free.get("big") == b"b" * MiB


def test_a_put_to_nvme_beyond_the_nvme_quota_gets_quota_exceeded(cluster):
    with client_of(cluster, "nvme") as client:
        with pytest.raises(QuotaExceeded) as error:
            client.put("cold", b"c" * 1000, tier="nvme")
        refused(error, "nvme_bytes")
        client.put("hot", b"h" * 1000)  # DRAM is not limited


def test_reservations_beyond_the_reserved_bytes_quota_get_quota_exceeded(cluster):
    with client_of(cluster, "reserved") as client:
        first = client.reserve("first", 768 << 10)
        with pytest.raises(QuotaExceeded) as error:
            client.reserve("second", 512 << 10)
        assert "commit or revoke" in refused(error, "reserved_bytes")
        first.write(b"x" * (768 << 10))
        first.commit()
        second = client.reserve("second", 512 << 10)  # committed bytes no longer count
        second.revoke()


def test_a_read_beyond_the_leases_quota_gets_quota_exceeded(cluster):
    with client_of(cluster, "leases") as client:
        client.put("a", b"a" * 100)
        client.put("b", b"b" * 100)
        assert client.get("a") == b"a" * 100  # leased for the master's lease TTL
        with pytest.raises(QuotaExceeded) as error:
            client.get("b")
        figures = "is at its leases quota of 1 objects under read lease (1 held)"
        assert figures in refused(error, "leases"), "the master's figures"
        with pytest.raises(QuotaExceeded) as error:
            client.exists("b")
        assert figures in refused(error, "leases")
        [found] = client.exists_many(["b"])
        assert isinstance(found, QuotaExceeded) and figures in str(found), "per key, in a batch"
        assert client.exists("b", lease=False), "only looking takes no lease"
        assert client.get("a") == b"a" * 100, "the lease it holds is renewed"


def test_calls_beyond_the_inflight_quota_get_quota_exceeded_at_once(cluster):
    with client_of(cluster, "inflight") as client:
        started = time.monotonic()
        with pytest.raises(QuotaExceeded) as error:
            client.put("k", b"k" * 100)
        assert str(error.value).count("quota exceeded: tenant 'inflight'") == 1
        refused(error, "inflight")
        assert time.monotonic() - started < 5, "not retried until the deadline"


def inflight_refusals(cluster: LocalCluster) -> float:
    url = f"http://127.0.0.1:{cluster.master_http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    pattern = r'^kvpool_tenant_quota_refusals_total\{quota="inflight",tenant="inflight"\} (\S+)$'
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


def test_heartbeats_and_give_backs_are_not_held_to_the_inflight_quota(cluster):
    """They hold nothing and give back: a tenant at its quota of calls in flight (its PutEnds
    waiting on a slow node) must not have its clients' heartbeats refused, the clients
    declared dead and their reservations revoked."""
    with client_of(cluster, "inflight") as client:
        with pytest.raises(QuotaExceeded):
            client.put("k", b"k" * 100)  # (the client beats from its first put on)
        assert client.release_leases(["k"]) == 0, "given back, not refused"
        time.sleep(1.5)  # (the refusals are published once a second)
        before = inflight_refusals(cluster)
        assert before >= 1, "the put was refused and counted"
        time.sleep(3.5)  # (a heartbeat a second)
        assert inflight_refusals(cluster) == before, "no heartbeat was refused"


def test_a_quota_set_with_the_cli_takes_effect_without_a_restart(cluster, quotas_file):
    with client_of(cluster, "free") as client:
        client.put("before", b"x" * 100)
        assert (
            kvpool_main(
                ["quota", "set", "--quotas", str(quotas_file), "--tenant", "free", "--objects", "1"]
            )
            == 0
        )
        deadline = time.monotonic() + 5
        attempt = 0
        while True:  # the master reads the file again within a second or two
            attempt += 1
            try:
                client.put(f"after-{attempt}", b"y" * 100)
            except QuotaExceeded as error:
                assert "objects quota of 1 objects" in str(error)
                break
            assert time.monotonic() < deadline, "the new quota never took effect"
            time.sleep(0.2)
        assert (
            kvpool_main(["quota", "unset", "--quotas", str(quotas_file), "--tenant", "free"]) == 0
        )
        deadline = time.monotonic() + 5
        while True:
            try:
                client.put("unlimited-again", b"z" * 100)
                break
            except QuotaExceeded:
                assert time.monotonic() < deadline, "the quota was never lifted"
                time.sleep(0.2)


def test_a_reservation_flood_of_one_tenant_leaves_another_tenant_s_objects_in_place(
    cluster_factory, tmp_path
):
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"version": 1}))  # no limits: fair eviction only
    cluster = cluster_factory(1, "64MiB", tenants=("a", "b"), master_args=["--quotas", str(path)])
    with client_of(cluster, "b") as b, client_of(cluster, "a") as a:
        objects = {f"kv/{i}": bytes([i]) * MiB for i in range(20)}  # 20 MiB of 64: its share
        assert b.put_many(objects) == [1] * 20

        results = a.put_many([(f"flood/{i}", b"A" * MiB) for i in range(60)])
        stored = [r for r in results if r == 1]
        assert len(stored) >= 40, "a took the free space"
        assert all(r == 1 or isinstance(r, NoSpace) for r in results), results
        assert len(stored) < 60, "and no more: b's objects were not evicted for it"

        time.sleep(1.0)  # ticks: the watermark takes a's objects (over its share), not b's
        assert b.get_many(list(objects)) == list(objects.values())
