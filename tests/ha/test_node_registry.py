"""The storage nodes of a cluster as etcd lists them for the next leader (master/election.py):
a node that mounts is live (a new leader waits for it), one declared dead or gone after
unmounting its segments is away (a new leader does not wait for it, but refuses what ends
meanwhile should it come back), and an away mark past tombstones.MAX_AGE is dropped. Against
a real etcd; how the master tells its registry of the nodes that leave (sans-IO); then a
cluster whose node leaves gracefully."""

from __future__ import annotations

import asyncio
import signal
import time

import aetcd
import pytest
from helpers import rebuilt_terms, wait_until

from kvpool import Client
from kvpool.common.status import Tier
from kvpool.errors import KVPoolError
from kvpool.etcd_process import EtcdProcess
from kvpool.local_cluster import LocalCluster
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.election import AWAY, ETCD_ERRORS, ClusterNodes, Election
from kvpool.master.main import _NodesLeaving
from kvpool.master.records import Commit, PutOptions, SegmentInfo
from kvpool.master.state import MasterState
from kvpool.master.tombstones import MAX_AGE
from kvpool.security.etcd_tls import etcd_client

NODES = b"/kvpool/registry/nodes/"


async def in_a_term(election: Election, during) -> object:
    """Runs ``during()`` in ``election``'s first term, then stops campaigning."""
    stop = asyncio.Event()
    outcome: list[object] = []

    async def on_elected(epoch: int) -> None:
        try:
            outcome.append(await during())
        finally:
            stop.set()

    async def on_lost() -> None:
        pass

    await asyncio.wait_for(election.run(stop, on_elected, on_lost), 60)
    return outcome[0]


async def written(election: Election) -> None:
    """Until the registrations this term wants are in etcd."""
    for _ in range(200):
        if not election._wanted:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"registrations not written: {election._wanted}")


def test_the_next_leader_finds_live_nodes_to_wait_for_and_away_nodes_not_to(tmp_path):
    etcd = EtcdProcess(tmp_path / "etcd").start()
    try:

        async def scenario() -> tuple[ClusterNodes, ClusterNodes, dict[bytes, bytes]]:
            async with aetcd.Client(*etcd.endpoint.rsplit(":", 1)) as client:
                long_ago = int(time.time() - MAX_AGE - 60)
                await client.put(NODES + b"replaced", AWAY + b"%d" % long_ago)
                await client.put(NODES + b"older-master", b"")

            first = Election([etcd.endpoint], "registry", "127.0.0.1:1", ttl=2)

            async def first_term() -> ClusterNodes:
                found = await first.registered_nodes()
                for node in ("stays", "dies", "leaves", "returns"):
                    first.node_seen(node)  # (each mounts)
                first.node_gone("dies")  # (declared dead)
                first.node_gone("leaves")  # (unmounted its last segment)
                first.node_gone("leaves", lost=3)  # (at its drain deadline: 3 objects lost)
                first.node_gone("returns")
                await written(first)
                first.node_seen("returns")  # (it mounts again)
                await written(first)
                return found

            found_first = await in_a_term(first, first_term)
            second = Election([etcd.endpoint], "registry", "127.0.0.1:2", ttl=2)
            found_second = await in_a_term(second, second.registered_nodes)
            async with aetcd.Client(*etcd.endpoint.rsplit(":", 1)) as client:
                stored = {kv.key: kv.value for kv in await client.get_prefix(NODES)}
            return found_first, found_second, stored

        found_first, found_second, stored = asyncio.run(scenario())
    finally:
        etcd.close()
    # an away mark older than MAX_AGE went (a node away that long was replaced)
    assert found_first == ClusterNodes(live={"older-master"}, away=set())
    assert found_second == ClusterNodes(
        live={"older-master", "stays", "returns"}, away={"dies", "leaves"}, lost={"leaves": 3}
    )
    assert NODES + b"replaced" not in stored
    since = int(stored[NODES + b"dies"][len(AWAY) :])
    assert abs(since - time.time()) < 120


def test_a_master_that_cannot_read_the_nodes_does_not_begin_a_term_without_them():
    election = Election(["127.0.0.1:1"], "registry", "127.0.0.1:1", ttl=1)

    async def scenario() -> None:
        election._client = aetcd.Client("127.0.0.1", 1, timeout=1)
        try:
            await election.registered_nodes()
        finally:
            await election._client.close()

    with pytest.raises(ETCD_ERRORS):
        asyncio.run(scenario())


class Registry:
    """Election's side of the core: the nodes it hears are gone."""

    def __init__(self) -> None:
        self.gone: list[str] = []
        self.lost: dict[str, int] = {}
        self.ago: dict[str, float] = {}

    def node_gone(self, node_id: str, lost: int = 0, ago: float = 0.0) -> None:
        self.gone.append(node_id)
        self.ago[node_id] = ago
        if lost:
            self.lost[node_id] = lost


def segment(node: str) -> SegmentInfo:
    return SegmentInfo(
        segment_id=f"{node}/dram0",
        node_id=node,
        host=f"{node}.cluster.local",
        worker_address=f"ucx-worker-of-{node}".encode(),
        base_address=0x10_0000,
        size=1 << 20,
        rkey=f"rkey-of-{node}".encode(),
        tier=Tier.DRAM,
    )


def test_the_registry_hears_of_each_node_that_leaves_and_of_each_the_window_went_without():
    """A node that unmounted its last segment, one declared dead, and one a new leader's
    rebuild window closed without are each away (master/main.py tells the registry after a
    tick); a new term tells nothing of nodes that have not mounted there."""
    now = [1_000.0]
    config = MasterConfig(node_ttl=5.0)
    state = MasterState(config, clock=lambda: now[0])
    core = MasterCore(state, awaited_nodes={"n1", "n2", "n3", "ghost"}, rebuild_window=5.0)
    registry, leaving = Registry(), _NodesLeaving()
    for call, node in enumerate(("n1", "n2", "n3")):
        core.mount_segment(call, segment(node), [], True, 0.0)
    leaving.check(core, registry)
    assert registry.gone == []
    core.unmount_segment(10, "n2", "n2/dram0")  # (a graceful leave)
    leaving.check(core, registry)
    assert registry.gone == ["n2"] and registry.lost == {}
    now[0] += 5.5  # (n3 silent past its TTL; the window passed without "ghost")
    core.heartbeat(11, "n1", ["n1/dram0"])
    report, _ = core.tick()
    assert report.dead_nodes == ["n3"]
    leaving.check(core, registry, report.dead_nodes)
    assert set(registry.gone) == {"ghost", "n2"}, "n3 is told away one node TTL later"
    now[0] += 5.0
    core.heartbeat(12, "n1", ["n1/dram0"])
    leaving.check(core, registry)
    assert set(registry.gone) == {"ghost", "n2", "n3"}  # (n2 twice, perhaps: it is no harm)
    assert registry.ago["n3"] == 5.0, "away since it was declared dead"
    told = len(registry.gone)
    leaving.check(core, registry)
    assert len(registry.gone) == told
    next_term = MasterCore(
        MasterState(config, clock=lambda: now[0]), awaited_nodes={"n1"}, rebuild_window=5.0
    )
    leaving.check(next_term, registry)
    assert len(registry.gone) == told


def test_nodes_declared_dead_stay_serving_in_etcd_for_a_term_that_ends_within_a_node_ttl():
    """A leader that declared every node dead may be the one cut off from them: it steps
    down, and its successor must wait for the nodes in its rebuild window rather than take
    clients at once with an empty index. A node heard again within the TTL is never told
    away."""
    now = [1_000.0]
    config = MasterConfig(node_ttl=5.0)
    core = MasterCore(MasterState(config, clock=lambda: now[0]), awaited_nodes=set())
    registry, leaving = Registry(), _NodesLeaving()
    for call, node in enumerate(("n1", "n2")):
        core.mount_segment(call, segment(node), [], False, 0.0)
    leaving.check(core, registry)
    now[0] += 5.5
    report, _ = core.tick()
    assert sorted(report.dead_nodes) == ["n1", "n2"]
    leaving.check(core, registry, report.dead_nodes)
    now[0] += 1.0
    core.mount_segment(20, segment("n1"), [], True, 6.0)  # (n1 back)
    leaving.check(core, registry)
    assert registry.gone == []
    # the term ends before n2's TTL has passed: the next one starts with nothing held
    successor = MasterCore(MasterState(config, clock=lambda: now[0]), awaited_nodes={"n2"})
    now[0] += 10.0
    leaving.check(successor, registry)
    assert registry.gone == [], "n2 stayed serving in etcd: the successor waits for it"


def test_a_node_that_left_its_drain_with_objects_lost_is_registered_with_them():
    """So that the next leader still answers `kvpool drain` for it with DATA_LOSS (it reads
    them back: test_the_next_leader_finds_live_nodes_to_wait_for_and_away_nodes_not_to)."""
    state = MasterState(MasterConfig(), clock=lambda: 1_000.0)
    core = MasterCore(state, awaited_nodes=set(), rebuild_window=0.0)
    registry, leaving = Registry(), _NodesLeaving()
    for call, node in enumerate(("n1", "n2")):
        core.mount_segment(call, segment(node), [], False, 0.0)
    leaving.check(core, registry)
    options = PutOptions(replicas=1, preferred_hosts=("n2.cluster.local",))
    [slot] = core.put_start(7, "c", ["k"], [4096], options).answers[7]
    assert slot.replicas[0].segment.node_id == "n2", slot
    effects = core.put_end(8, [Commit("k", slot.put_id, (True,))])
    for command in effects.transmit:
        core.node_answered(command.node_id, command.command_id, True)

    core.drain(9, "n2")  # (nothing copied away before it leaves: its deadline passed)
    core.unmount_segment(10, "n2", "n2/dram0")
    leaving.check(core, registry)

    assert registry.gone == ["n2"]
    assert registry.lost == {"n2": 1}


def etcd_value(etcd: EtcdProcess, key: bytes) -> bytes:
    """The value of ``key`` in the etcd of conftest.py (over TLS, as a master reads it)."""
    pki = LocalCluster.shared_pki
    assert pki is not None
    cert, private_key = pki.client_certificate("kvpool://admin/master-0", "master-0")

    async def read() -> bytes:
        async with etcd_client(etcd.url, pki.client_files(cert, private_key), timeout=5) as c:
            found = await c.get(key)
            return b"<none>" if found is None else bytes(found.value)

    return asyncio.run(read())


def served_after(client: Client, began: float, limit: float) -> float:
    """Seconds from ``began`` until a put is answered (``limit`` at most)."""
    while time.monotonic() - began < limit:
        try:
            client.put(f"probe/{time.monotonic_ns()}", b"p")
            return time.monotonic() - began
        except KVPoolError:
            time.sleep(0.05)
    return float("inf")


def test_a_node_that_left_gracefully_is_not_waited_for_by_the_next_leader(etcd, ha_cluster):
    """A node that unmounts its segments and exits is away in etcd: the next leader takes
    clients without waiting its rebuild window (the node TTL) for it."""
    node_ttl = 30.0
    cluster = ha_cluster(masters=2, nodes=2, master_args=("--node-ttl", str(node_ttl)))
    stays, leaves = cluster.nodes
    left = leaves.ready["node_id"]
    with Client(cluster.master_address, timeout=60) as client:
        client.put("before", b"kept")
        leaves.signal(signal.SIGTERM)
        assert wait_until(lambda: not leaves.alive(), timeout=20)

        key = b"/kvpool/test0/nodes/" + left.encode()  # (ha_cluster's first cluster)
        assert wait_until(lambda: etcd_value(etcd, key).startswith(AWAY), timeout=20)
        old = cluster.leader()
        assert old is not None
        began = time.monotonic()
        old.kill()
        cluster.wait_for_leader(timeout=30)
        assert served_after(client, began, 60) < node_ttl / 2, "the next leader waited for it"
    leader = cluster.leader()
    assert leader is not None
    terms = rebuilt_terms(leader)
    assert terms[-1]["away_nodes"] == [left]
    assert terms[-1]["expected_nodes"] == [stays.ready["node_id"]]
