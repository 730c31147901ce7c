"""Tombstone records in a real etcd (master/tombstone_store.py), over TLS with a client
certificate as the masters reach it: what the leader writes, the next leader loads; a master
that does not hold the leader key writes nothing; and while writes keep failing, answers
that carry no change stop waiting behind them."""

from __future__ import annotations

import asyncio

from kvpool.etcd_process import EtcdProcess
from kvpool.local_cluster import LocalCluster
from kvpool.master.tombstone_store import FAILURES_BEFORE_DEGRADED, TombstoneStore
from kvpool.master.tombstones import DurableRecord
from kvpool.security.etcd_tls import etcd_client

LEADER_KEY = b"kvpool/test/leader"
PREFIX = b"kvpool/test"
ME = "10.0.0.1:50051"


def in_etcd(etcd: EtcdProcess, scenario) -> object:
    """Runs ``scenario(client)`` with an etcd client as a master holds one (the etcd of
    conftest.py, with the session's CA)."""
    pki = LocalCluster.shared_pki
    assert pki is not None
    cert, key = pki.client_certificate("kvpool://admin/master-0", "master-0")

    async def run() -> object:
        async with etcd_client(etcd.url, pki.client_files(cert, key), timeout=5) as client:
            return await scenario(client)

    return asyncio.run(run())


async def written(store: TombstoneStore, segment_ids: set[str]) -> bool:
    outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    store.write(segment_ids, outcome.set_result)
    return await asyncio.wait_for(outcome, 10)


def test_what_the_leader_writes_the_next_leader_loads(etcd):
    records = {
        "node0/dram-1": DurableRecord(False, {"team/k1": 7, "team/k2": 9}),
        "node1/dram-2": DurableRecord(True, {}),
    }
    current = dict(records)

    async def scenario(client) -> tuple[dict, dict]:
        await client.put(LEADER_KEY, ME.encode())
        store = TombstoneStore(lambda: client, PREFIX, LEADER_KEY, lambda: ME)
        store.begin(current.get)
        assert await written(store, set(records))
        loaded = await TombstoneStore(lambda: client, PREFIX, LEADER_KEY, lambda: ME).load()
        del current["node0/dram-1"]  # its segment mounted and was reconciled
        assert await written(store, {"node0/dram-1"})
        after = await TombstoneStore(lambda: client, PREFIX, LEADER_KEY, lambda: ME).load()
        store.end()
        return loaded, after

    loaded, after = in_etcd(etcd, scenario)
    assert loaded == records
    assert after == {"node1/dram-2": records["node1/dram-2"]}


def test_a_master_that_does_not_lead_writes_nothing_and_serves_on(etcd):
    record = DurableRecord(False, {"team/k": 3})

    async def scenario(client) -> tuple[list[bool], bool, bool, dict]:
        await client.put(LEADER_KEY, b"another-master:50051")
        store = TombstoneStore(lambda: client, PREFIX + b"/deposed", LEADER_KEY, lambda: ME)
        store.begin(lambda segment_id: record)
        outcomes = [await written(store, {"node0/dram-9"})]
        while not store.failing:  # (the writer tries again on its own)
            await asyncio.sleep(0.1)
        outcomes.append(await written(store, {"node0/dram-9"}))
        busy = store.busy  # answers without changes no longer wait behind the retries
        failing = store.failing
        loaded = await TombstoneStore(
            lambda: client, PREFIX + b"/deposed", LEADER_KEY, lambda: ME
        ).load()
        store.end()
        return outcomes, busy, failing, loaded

    outcomes, busy, failing, loaded = in_etcd(etcd, scenario)
    assert outcomes == [False, False]
    assert failing and not busy
    assert loaded == {}
    assert FAILURES_BEFORE_DEGRADED >= 2
