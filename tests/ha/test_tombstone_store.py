"""Tombstone records in a real etcd (master/tombstone_store.py), over TLS with a client
certificate as the masters reach it: what the leader writes, the next leader loads; a master
that does not hold the leader key writes nothing; while writes keep failing, answers that
carry no change stop waiting behind them; a change rewrites the piece it touches, not the
record; a new term replaces what it finds, older masters' whole records included, and leaves
them a marker that keeps them from adopting what the pieces refuse."""

from __future__ import annotations

import asyncio
import time

from helpers import rebuilt_terms

from kvpool import Client
from kvpool.common.leader_resolver import leader_key
from kvpool.etcd_process import EtcdProcess
from kvpool.local_cluster import LocalCluster
from kvpool.master.record_writer import FAILURES_BEFORE_DEGRADED
from kvpool.master.tombstone_format import (
    BUCKETS,
    PIECES,
    WHOLE,
    bucket_of,
    decode,
    encode,
    piece_key,
    split,
    whole_key,
)
from kvpool.master.tombstone_store import TombstoneStore
from kvpool.master.tombstones import MAX_AGE, RECORD_BYTES, RECORD_LIMIT, DurableRecord
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
        # (a prefix removal while node2 was not heard from, and nothing else: found by
        # review, such a record was dropped at load and the removed keys came back)
        "node:node2": DurableRecord(False, {}, frozenset(), frozenset({("ta/mine/", 12)})),
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
    assert after == {k: records[k] for k in ("node1/dram-2", "node:node2")}


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


def test_a_removal_rewrites_one_piece_of_a_large_record_not_the_record(etcd):
    keys = {f"team/prompt-{i:05d}": 1 for i in range(3000)}
    current = {"node0/dram-1": DurableRecord(False, dict(keys))}

    async def scenario(client) -> tuple[int, int, int, dict, list[bytes]]:
        await client.put(LEADER_KEY, ME.encode())
        store = TombstoneStore(lambda: client, PREFIX + b"/big", LEADER_KEY, lambda: ME)
        store.begin(current.get)
        assert await written(store, {"node0/dram-1"})
        first = store.bytes_put
        pieces = PREFIX + b"/big" + PIECES
        before = {kv.key: kv.mod_revision for kv in await client.get_prefix(pieces)}
        current["node0/dram-1"] = DurableRecord(False, {**keys, "team/removed-now": 2})
        assert await written(store, {"node0/dram-1"})
        after = {kv.key: kv.mod_revision for kv in await client.get_prefix(pieces)}
        loaded = await TombstoneStore(
            lambda: client, PREFIX + b"/big", LEADER_KEY, lambda: ME
        ).load()
        store.end()
        changed = [key for key in after if after[key] != before.get(key)]
        return first, store.bytes_put - first, len(after), loaded, changed

    first, second, count, loaded, changed = in_etcd(etcd, scenario)
    assert loaded == current
    assert count == BUCKETS  # (3,000 keys fill every bucket)
    assert changed == [piece_key(PREFIX + b"/big", bucket_of("team/removed-now"), "node0/dram-1")]
    assert second * 16 < first


def test_a_new_term_replaces_the_pieces_and_whole_records_it_finds(etcd):
    prefix = PREFIX + b"/terms"
    old = DurableRecord(False, {"team/a": 1, "team/b": 1, "team/c": 1})
    now = DurableRecord(False, {"team/a": 2}, frozenset({("team/z", 4)}))

    async def scenario(client) -> tuple[dict, dict, dict, list[bytes]]:
        await client.put(LEADER_KEY, ME.encode())
        first = TombstoneStore(lambda: client, prefix, LEADER_KEY, lambda: ME)
        first.begin({"node0/dram-1": old}.get)
        assert await written(first, {"node0/dram-1"})
        first.end()
        # what a master before the pieces wrote: one whole record under /tombstones/
        await client.put(whole_key(prefix, "node1/dram-7"), encode(old, time.time()))
        loaded = await TombstoneStore(lambda: client, prefix, LEADER_KEY, lambda: ME).load()
        second = TombstoneStore(lambda: client, prefix, LEADER_KEY, lambda: ME)
        second.begin({"node0/dram-1": now, "node1/dram-7": now}.get)
        assert await written(second, {"node0/dram-1", "node1/dram-7"})
        reloaded = await TombstoneStore(lambda: client, prefix, LEADER_KEY, lambda: ME).load()
        second.end()
        wholes = {kv.key: kv.value for kv in await client.get_prefix(prefix + WHOLE)}
        pieces = {kv.key: decode(kv.value)[1] for kv in await client.get_prefix(prefix + PIECES)}
        return loaded, reloaded, pieces, wholes

    loaded, reloaded, pieces, wholes = in_etcd(etcd, scenario)
    assert loaded == {"node0/dram-1": old, "node1/dram-7": old}
    assert reloaded == {"node0/dram-1": now, "node1/dram-7": now}
    # The older master's whole record was replaced with the marker, which a master before
    # the pieces reads as distrusted (it adopts nothing it does not hold from the segment).
    assert set(wholes) == {whole_key(prefix, "node0/dram-1"), whole_key(prefix, "node1/dram-7")}
    assert all(decode(value)[1] == DurableRecord(True, {}) for value in wholes.values())
    assert len(pieces) == 2 * len(split(now))  # (the pieces of b and c were deleted)


def test_a_segment_whose_record_empties_leaves_neither_pieces_nor_marker(etcd):
    prefix = PREFIX + b"/emptied"
    current = {"node0/dram-1": DurableRecord(False, {"team/a": 1, "team/b": 2})}

    async def scenario(client) -> tuple[int, int, dict]:
        await client.put(LEADER_KEY, ME.encode())
        store = TombstoneStore(lambda: client, prefix, LEADER_KEY, lambda: ME)
        store.begin(current.get)
        assert await written(store, {"node0/dram-1"})
        during = len(await client.get_prefix(prefix))
        del current["node0/dram-1"]  # its segment mounted and was reconciled
        assert await written(store, {"node0/dram-1"})
        store.end()
        loaded = await TombstoneStore(lambda: client, prefix, LEADER_KEY, lambda: ME).load()
        return during, len(await client.get_prefix(prefix)), loaded

    during, after, loaded = in_etcd(etcd, scenario)
    assert during == len(split(DurableRecord(False, {"team/a": 1, "team/b": 2}))) + 1
    assert (after, loaded) == (0, {})


def test_a_record_whose_pieces_are_all_old_is_deleted_when_read(etcd):
    prefix = PREFIX + b"/stale"
    record = DurableRecord(False, {"team/a": 1, "team/b": 1})

    async def scenario(client) -> tuple[dict, int]:
        long_ago = time.time() - MAX_AGE - 60
        for bucket, piece in split(record).items():
            await client.put(piece_key(prefix, bucket, "gone/dram-0"), encode(piece, long_ago))
        loaded = await TombstoneStore(lambda: client, prefix, LEADER_KEY, lambda: ME).load()
        return loaded, len(await client.get_prefix(prefix + PIECES))

    assert in_etcd(etcd, scenario) == ({}, 0)


def big_record(segment: int) -> DurableRecord:
    """A record as large as the writer keeps one (RECORD_LIMIT keys, near RECORD_BYTES)."""
    length = RECORD_BYTES // RECORD_LIMIT // 2 - 16  # (tombstones.py counts each byte twice)
    keys = {f"seg{segment}/{i:06d}".ljust(length, "k"): (5 << 32) + i for i in range(RECORD_LIMIT)}
    return DurableRecord(False, keys)


def test_records_beyond_one_answer_of_etcd_are_read_in_pages(etcd):
    """More than gRPC's default 4 MiB of records (each as large as tombstones.py makes one),
    read by a client with that default: every record comes back (a page too large for the
    client is asked for again in halves), whole records of older masters and pieces alike.
    A master once read them in one answer, failed, and no master could begin a term."""
    prefix = PREFIX + b"/large"
    wholes = {f"old-node{i}/dram-{i}": big_record(i) for i in range(12)}
    pieces = {f"node{i}/dram-{i}": big_record(100 + i) for i in range(4)}

    async def scenario(client) -> dict:
        now = time.time()
        for segment_id, record in wholes.items():
            await client.put(whole_key(prefix, segment_id), encode(record, now))
        leader_key = prefix + b"/leader"
        await client.put(leader_key, ME.encode())
        store = TombstoneStore(lambda: client, prefix, leader_key, lambda: ME)
        store.begin(pieces.get)
        assert await written(store, set(pieces))
        store.end()
        return await TombstoneStore(lambda: client, prefix, leader_key, lambda: ME).load()

    stored = sum(len(encode(record, 0.0)) for record in wholes.values())
    stored += sum(len(encode(p, 0.0)) for r in pieces.values() for p in split(r).values())
    assert stored > 5 << 20  # (past 4 MiB, the wholes alone too)
    assert in_etcd(etcd, scenario) == wholes | pieces


def test_masters_lead_and_serve_over_records_beyond_one_answer_of_etcd(etcd, ha_cluster):
    """Records past gRPC's default 4 MiB in the etcd of a cluster about to start: a master
    reads them all, leads and serves (once, none could: every term's start failed)."""
    prefix = leader_key("test0").rsplit(b"/", 1)[0]  # (the cluster ha_cluster starts first)
    records = {f"node{i}/dram-{i}": big_record(i) for i in range(12)}

    async def scenario(client) -> None:
        leader = prefix + b"/leader"
        await client.put(leader, ME.encode())  # (as an earlier leader wrote them)
        store = TombstoneStore(lambda: client, prefix, leader, lambda: ME)
        store.begin(records.get)
        assert await written(store, set(records))
        store.end()
        await client.delete(leader)

    in_etcd(etcd, scenario)
    cluster = ha_cluster(masters=2, nodes=1)
    with Client(cluster.master_address, timeout=30) as client:
        client.put("after/large-records", b"served")
        assert client.get("after/large-records") == b"served"
    leader = cluster.leader()
    assert leader is not None
    terms = rebuilt_terms(leader)
    assert [term["tombstone_records"] for term in terms] == [len(records)]
