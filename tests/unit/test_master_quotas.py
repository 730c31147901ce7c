"""Tenants and quotas in the master's core (master/quotas.py, master/state.py).

The master holds keys as "TENANT/KEY". Each tenant's usage (objects, reserved bytes, bytes
per tier, leases) is kept up to date as objects come and go; a put or a lease that would take
the tenant over a quota an admin set is refused with QUOTA_EXCEEDED and a message naming the
quota, its limit and the use. With quotas in force, eviction is fair: a put evicts its own
tenant's objects, and others' only while they hold more than their guaranteed share of the
tier (an equal split among the tenants there, unless the admin set one). Every state here
checks its own invariants after each event, the recount of every tenant's usage included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest
from helpers import FrameRecorder
from state_helpers import (
    CONFIG,
    FakeClock,
    KiB,
    MiB,
    commit,
    exists,
    get,
    mount,
    publish,
    put,
    remove,
    segment_info,
)

from kvpool.common import lane_protocol as lp
from kvpool.common.status import KeyStatus, Tier
from kvpool.master import main as master_main
from kvpool.master import metrics
from kvpool.master.authenticator import Authenticator
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.driver import CoreDriver
from kvpool.master.election import AlwaysLeader
from kvpool.master.handlers import MasterHandlers
from kvpool.master.lane_server import LaneServer, _Connection
from kvpool.master.leader_gate import LeaderGate
from kvpool.master.load_shedding import LoadShedder
from kvpool.master.quota_file import QuotaFile, QuotaFileError, read_quotas
from kvpool.master.quotas import InflightLimiter, Quotas, TenantQuota, TenantUsage
from kvpool.master.records import PutOptions
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb

CHECKED = dataclasses.replace(CONFIG, validate_each_event=True)


NO_LIMITS = Quotas()  # quotas in force, none limiting: fair eviction only


def quota_state(
    quotas: Quotas | None = NO_LIMITS, config: MasterConfig = CHECKED
) -> tuple[MasterState, FakeClock]:
    clock = FakeClock()
    state = MasterState(config, clock=clock)
    state.set_quotas(quotas)
    return state, clock


def limits(**tenants: TenantQuota) -> Quotas:
    return Quotas(tenants={name.replace("_", "-"): q for name, q in tenants.items()})


def mount_nvme(state: MasterState, node: str, size: int) -> None:
    info = segment_info(node, size, f"{node}/nvme0", base=0x9000_0000)
    state.mount_segment(dataclasses.replace(info, tier=Tier.NVME, persistent=True))


def refused(slot_or_status) -> str:
    status = getattr(slot_or_status, "status", slot_or_status)
    assert status is KeyStatus.QUOTA_EXCEEDED, slot_or_status
    return getattr(slot_or_status, "message", "")


# ---------------------------------------------------------------------------- each quota


def test_a_tenant_at_its_objects_quota_is_refused_naming_it_until_it_removes_some():
    state, _ = quota_state(limits(a=TenantQuota(objects=2)))
    mount(state, "n1", 4 * MiB)
    publish(state, "a/k1")
    publish(state, "a/k2")

    message = refused(put(state, "a/k3"))
    assert message == (
        "tenant 'a' is at its objects quota of 2 objects (2 held): remove some, or ask an "
        "admin for more"
    )
    assert put(state, "b/k3").status is KeyStatus.OK, "another tenant has no such quota"
    assert state.quota_refusals == {("a", "objects"): 1}

    assert remove(state, "a/k1") is KeyStatus.OK
    assert put(state, "a/k3").status is KeyStatus.OK


def test_reservations_count_as_objects_and_a_batch_stops_at_the_quota():
    state, _ = quota_state(limits(a=TenantQuota(objects=3)))
    mount(state, "n1", 4 * MiB)
    slots = state.put_start("c", [f"a/k{i}" for i in range(5)], [KiB] * 5)
    assert [s.status for s in slots] == [KeyStatus.OK] * 3 + [KeyStatus.QUOTA_EXCEEDED] * 2
    assert state.usage("a").objects == 3


def test_a_put_over_the_dram_quota_is_refused_and_nvme_is_counted_apart():
    quota = TenantQuota(dram_bytes=10 * KiB, nvme_bytes=8 * KiB)
    state, _ = quota_state(limits(a=quota))
    mount(state, "n1", 4 * MiB)
    mount(state, "n2", 4 * MiB)
    mount_nvme(state, "n1", 4 * MiB)
    publish(state, "a/k1", 8 * KiB)

    message = refused(put(state, "a/k2", 4 * KiB))  # no tier asked for: DRAM
    assert "dram_bytes quota of 10.0 KiB (10240 bytes) of DRAM" in message
    assert "8.0 KiB held, 4.0 KiB more asked" in message
    assert "tier='nvme'" in message, "it says what else to do"
    refused(put(state, "a/k2", KiB, replicas=3))  # each replica counts
    assert put(state, "a/k2", 2 * KiB).status is KeyStatus.OK, "up to the quota"

    nvme = PutOptions(tier=Tier.NVME)
    assert put(state, "a/n1", 8 * KiB, options=nvme).status is KeyStatus.OK
    message = refused(put(state, "a/n2", 1, options=nvme))
    assert "nvme_bytes quota of 8.0 KiB" in message
    assert state.usage("a") == TenantUsage(
        objects=3, reserved_bytes=10 * KiB, dram_bytes=10 * KiB, nvme_bytes=8 * KiB, reservations=2
    )


def test_bytes_reserved_and_not_yet_committed_are_held_to_their_quota():
    state, _ = quota_state(limits(a=TenantQuota(reserved_bytes=8 * KiB)))
    mount(state, "n1", 4 * MiB)
    first = put(state, "a/k1", 4 * KiB)
    assert put(state, "a/k2", 4 * KiB).status is KeyStatus.OK

    message = refused(put(state, "a/k3", 1))
    assert "reserved_bytes quota of 8.0 KiB (8192 bytes) reserved and not yet committed" in message
    assert "commit or revoke" in message

    assert commit(state, "a/k1", first) is KeyStatus.OK
    assert state.usage("a").reserved_bytes == 4 * KiB
    assert put(state, "a/k3", 4 * KiB).status is KeyStatus.OK


def test_reserved_bytes_count_each_buffer_as_placed_so_empty_puts_are_not_free():
    """An empty object takes a buffer (and a place in the table) like any other: counted at
    its logical size, a tenant held to its reserved bytes could reserve without end."""
    state, _ = quota_state(limits(a=TenantQuota(reserved_bytes=4 * CONFIG.alignment)))
    mount(state, "n1", 4 * MiB)
    for i in range(4):
        assert put(state, f"a/empty{i}", 0).status is KeyStatus.OK
    assert state.usage("a").reserved_bytes == 4 * CONFIG.alignment
    assert "reserved_bytes quota" in refused(put(state, "a/empty4", 0))
    assert "reserved_bytes quota" in refused(put(state, "a/one", 1))


def test_one_tenant_s_reservations_hold_at_most_an_eighth_of_the_master_s_table():
    """Reservations are never evicted: a tenant reserving (and renewing) without committing
    would otherwise fill the table, and every other tenant's put would find no room."""
    state, _ = quota_state(config=dataclasses.replace(CONFIG, max_objects=1024))
    mount(state, "n1", 4 * MiB)
    first = put(state, "a/k0", 0)
    for i in range(1, 128):
        assert put(state, f"a/k{i}", 0).status is KeyStatus.OK
    message = refused(put(state, "a/more", 0))
    assert message == (
        "tenant 'a' holds 128 reservations, the most one tenant may hold (1/8 of the master's "
        "table of 1024 objects, --max-objects, and at least 64): commit or revoke the puts "
        "under way first"
    )
    assert state.quota_refusals == {("a", "reservations"): 1}
    assert put(state, "b/k0", 0).status is KeyStatus.OK, "another tenant's puts go on"
    assert commit(state, "a/k0", first) is KeyStatus.OK
    assert state.usage("a").reservations == 127
    assert put(state, "a/more", 0).status is KeyStatus.OK, "room again once one is committed"


def test_leases_beyond_the_quota_are_refused_without_replicas_until_one_ends():
    state, clock = quota_state(limits(a=TenantQuota(leases=1)))
    mount(state, "n1", 4 * MiB)
    for key in ("a/k1", "a/k2", "b/k1"):
        publish(state, key)

    assert get(state, "a/k1", lease_ttl=5).status is KeyStatus.OK
    denied = get(state, "a/k2", lease_ttl=5)
    assert denied.status is KeyStatus.QUOTA_EXCEEDED and not denied.replicas
    assert exists(state, "a/k2") is KeyStatus.QUOTA_EXCEEDED, "an Exists that leases, too"
    assert state.exists(["a/k2"], grant_lease=False) == [KeyStatus.OK], "looking is free"
    assert get(state, "a/k1").status is KeyStatus.OK, "a lease it holds is extended"
    assert get(state, "b/k1").status is KeyStatus.OK, "other tenants are not held to it"
    assert state.usage("a").leases == 1
    assert state.quota_refusals[("a", "leases")] == 2

    clock.advance(11)  # every lease ended; none has been counted out by a tick yet
    assert get(state, "a/k2").status is KeyStatus.OK
    assert state.usage("a").leases == 1


# ------------------------------------------------------------------- usage goes back down


def test_usage_follows_objects_through_revoke_removal_eviction_and_node_loss():
    state, clock = quota_state()
    mount(state, "n1", 2 * MiB)
    mount(state, "n2", 2 * MiB)
    slot = put(state, "a/r", 64 * KiB, replicas=2)
    assert state.usage("a") == TenantUsage(
        objects=1, reserved_bytes=64 * KiB, dram_bytes=128 * KiB, reservations=1
    )
    assert state.put_revoke(["a/r"], [slot.put_id]) == [KeyStatus.OK]
    assert state.usage("a") == TenantUsage()
    assert "a" not in state.tenant_usage(), "a tenant holding nothing is not kept"

    publish(state, "a/x", 64 * KiB, replicas=2)
    get(state, "a/x")
    assert state.usage("a") == TenantUsage(objects=1, dram_bytes=128 * KiB, leases=1)
    assert remove(state, "a/x", force=True) is KeyStatus.OK
    assert state.usage("a") == TenantUsage()

    for i in range(30):  # a's objects fill most of the store
        publish(state, f"a/{i}", 64 * KiB, replicas=2)
    for i in range(8):  # b's puts evict a's (a holds more than its share)
        publish(state, f"b/{i}", 128 * KiB)
    assert state.counters.evictions > 0
    assert all(get(state, f"b/{i}").status is KeyStatus.OK for i in range(8))

    def held(tenant: str, node: str = "") -> TenantUsage:
        objects = [o for k, o in state.objects.items() if k.startswith(f"{tenant}/")]
        return TenantUsage(
            objects=len(objects),
            dram_bytes=sum(o.size for o in objects for r in o.replicas if node in r.segment_id),
            leases=sum(o.lease_open for o in objects),
        )

    assert state.usage("a") == held("a") and state.usage("b") == held("b")
    assert held("a", "n2").dram_bytes > 0

    clock.advance(CONFIG.node_ttl + 1)
    state.heartbeat("n1", ["n1/dram0"])
    state.tick()  # n2 is declared dead: its replicas go
    assert "n2" not in state.nodes
    assert state.usage("a") == held("a") == held("a", "n1")
    assert state.usage("b") == held("b")


# ------------------------------------------------------------------------ fair eviction


def flood(state: MasterState, tenant: str, count: int, size: int = MiB) -> list[KeyStatus]:
    keys = [f"{tenant}/flood-{i}" for i in range(count)]
    return [slot.status for slot in state.put_start(f"{tenant}-writer", keys, [size] * count)]


def test_a_reservation_flood_of_one_tenant_evicts_none_of_another_s_objects_within_its_share():
    state, _ = quota_state(config=CONFIG)  # (checked below, once: 250 evictions tried)
    mount(state, "n1", 256 * MiB)
    for i in range(100):
        publish(state, f"b/{i}", MiB)

    statuses = flood(state, "a", 250)
    assert statuses.count(KeyStatus.OK) == 156, "what was free"
    assert statuses.count(KeyStatus.NO_SPACE) == 94, "the rest does not fit"
    assert all(get(state, f"b/{i}").status is KeyStatus.OK for i in range(100))
    assert state.counters.evictions == 0
    state.validate()


def test_the_watermark_takes_none_of_a_tenant_within_its_share_while_another_floods():
    """Found under load in CI: a tenant's flood, half of it still reservations when the
    watermark's pass ran (nothing of it evictable yet), and the pass took the other tenant's
    oldest objects to reach its mark."""
    state, _ = quota_state(config=CONFIG)
    mount(state, "n1", 64 * MiB)
    for i in range(20):
        publish(state, f"b/{i}", MiB)
    for i in range(5):
        publish(state, f"a/{i}", MiB)
    assert flood(state, "a", 39).count(KeyStatus.OK) == 39  # reserved, being written
    state.tick()
    assert all(get(state, f"b/{i}").status is KeyStatus.OK for i in range(20))
    assert not any(f"a/{i}" in state.objects for i in range(5)), "a's objects went instead"
    state.validate()


def test_without_quotas_the_same_flood_evicts_in_plain_lru_order():
    state, _ = quota_state(quotas=None, config=CONFIG)
    mount(state, "n1", 256 * MiB)
    for i in range(100):
        publish(state, f"b/{i}", MiB)
    assert flood(state, "a", 250).count(KeyStatus.OK) == 250
    assert state.counters.evictions == 94


def test_a_put_evicts_another_tenant_only_down_to_its_share_least_recently_used_first():
    state, _ = quota_state(config=CONFIG)
    mount(state, "n1", 256 * MiB)
    for i in range(200):
        publish(state, f"b/{i}", MiB)

    statuses = flood(state, "a", 150)
    assert statuses.count(KeyStatus.OK) == 56 + 72, "the free space, then b's excess"
    assert [k for k in state.objects if k.startswith("b/")] == [f"b/{i}" for i in range(72, 200)]
    assert state.usage("b").dram_bytes == 128 * MiB, "half of the tier: two tenants hold some"
    state.validate()


def test_a_guaranteed_share_set_by_the_admin_replaces_the_equal_split():
    quotas = limits(b=TenantQuota(guaranteed_dram_bytes=50 * MiB))
    state, _ = quota_state(quotas, config=CONFIG)
    mount(state, "n1", 256 * MiB)
    for i in range(100):
        publish(state, f"b/{i}", MiB)
    assert flood(state, "a", 250).count(KeyStatus.OK) == 156 + 50
    assert state.usage("b").dram_bytes == 50 * MiB


def test_a_single_tenant_evicts_its_own_objects_exactly_as_without_quotas():
    survivors = []
    for quotas in (None, Quotas()):
        state, _ = quota_state(quotas, config=CONFIG)
        mount(state, "n1", 64 * MiB)
        for i in range(60):
            publish(state, f"a/{i}", MiB)
        get(state, "a/3")  # recently used: kept
        assert flood(state, "a", 30).count(KeyStatus.OK) == 30
        survivors.append(sorted(state.objects))
        state.validate()
    assert survivors[0] == survivors[1]
    assert "a/3" in survivors[1] and "a/0" not in survivors[1]


def test_the_watermark_takes_objects_of_tenants_over_their_share_first():
    state, _ = quota_state()
    mount(state, "n1", 100 * MiB)
    for i in range(30):
        publish(state, f"b/{i}", MiB)  # b's are the least recently used
    for i in range(65):
        publish(state, f"a/{i}", MiB)

    report = state.tick()  # 95 MiB used: above the 90% mark, down to 85%
    assert report.objects_evicted == 10
    assert state.usage("b").objects == 30, "b is within its share (50 MiB)"
    assert [k for k in state.objects if k.startswith("a/")][:1] == ["a/10"], "a's LRU went"


def test_the_watermark_is_kept_even_when_every_tenant_is_within_its_share():
    shares = TenantQuota(guaranteed_dram_bytes=60 * MiB)
    state, _ = quota_state(Quotas(default=shares))
    mount(state, "n1", 100 * MiB)
    for i in range(40):
        publish(state, f"b/{i}", MiB)
    for i in range(55):
        publish(state, f"a/{i}", MiB)

    assert state.tick().objects_evicted == 10
    assert state.usage("b").objects == 30, "plain LRU once no tenant is over its share"


# ------------------------------------------------------------------------- calls in flight


def test_calls_in_flight_are_counted_per_tenant_and_refused_beyond_the_quota():
    limiter = InflightLimiter()
    assert limiter.enter("a", 2) is None
    assert limiter.enter("a", 2) is None
    refusal = limiter.enter("a", 2)
    assert refusal is not None and refusal.startswith("quota exceeded: tenant 'a'")
    assert "inflight quota of 2 calls in flight (2 held)" in refusal
    assert limiter.enter("b", 2) is None, "another tenant's count is its own"
    limiter.leave("a")
    assert limiter.enter("a", 2) is None
    assert limiter.refusals == {"a": 1}


def test_a_call_waiting_for_its_node_counts_in_flight_until_it_is_answered():
    async def scenario() -> None:
        state = MasterState(MasterConfig(), clock=time.monotonic, epoch=1)
        state.set_quotas(Quotas(default=TenantQuota(inflight=1)))
        state.mount_segment(segment_info("n1", 64 << 20), [])
        handlers = MasterHandlers(CoreDriver(MasterCore(state)))
        lane = LaneServer(
            handlers,
            LeaderGate(AlwaysLeader(), lambda: None),
            LoadShedder(100),
            Authenticator(None, insecure=True),  # every caller in tenant "default"
        )
        node, node_wire = _Connection(lane), FrameRecorder()
        node.connection_made(node_wire)
        hello = pb.NodeReport(hello=pb.NodeHello(node_id="n1"))
        node.data_received(lp.encode(0, lp.NODE_SESSION, hello.SerializeToString()))
        client, wire = _Connection(lane), FrameRecorder()
        client.connection_made(wire)

        def send(call_id: int, method: str, message) -> None:
            body = message.SerializeToString()
            client.data_received(lp.encode(call_id, lp.METHOD_IDS[method], body))

        send(1, "PutStart", pb.PutStartRequest(client_id="c", keys=["k"], sizes=[4096]))
        put_id = pb.PutStartResponse.FromString(wire.frames[0].body).slots[0].put_id
        commit = pb.PutCommit(key="k", put_id=put_id, replica_ok=[True])
        send(2, "PutEnd", pb.PutEndRequest(client_id="c", commits=[commit]))  # waits
        send(3, "Exists", pb.ExistsRequest(client_id="c", keys=["k"]))

        refusal = wire.frames[-1]
        assert refusal.call_id == 3 and refusal.status == lp.RESOURCE_EXHAUSTED
        assert refusal.error()[0].startswith("quota exceeded: tenant 'default'")

        [persist] = node_wire.frames
        command = pb.NodeCommand.FromString(persist.body)
        answer = pb.NodeReport(result=pb.CommandResult(command_id=command.command_id, ok=True))
        node.data_received(lp.encode(0, lp.NODE_SESSION, answer.SerializeToString()))
        assert wire.frames[-1].call_id == 2, "the PutEnd is answered"
        assert handlers.inflight.counts == {}

        send(4, "Exists", pb.ExistsRequest(client_id="c", keys=["k"]))
        assert wire.frames[-1].call_id == 4 and wire.frames[-1].status == lp.OK

    asyncio.run(scenario())


# ---------------------------------------------------------------------------- the file


def test_the_file_reads_sizes_counts_and_a_default():
    quotas = Quotas.from_json(
        {
            "version": 1,
            "default": {"objects": 1000},
            "tenants": {"team-a": {"dram_bytes": "1GiB", "inflight": 8, "leases": None}},
        }
    )
    assert quotas.of("team-a") == TenantQuota(dram_bytes=1 << 30, inflight=8)
    assert quotas.of("team-b") == TenantQuota(objects=1000)
    assert Quotas.from_json(quotas.to_json()) == quotas


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ([], "not a quotas file"),
        ({"version": 2}, "version 2"),
        ({"version": 1, "tenant": {}}, "unknown field(s) 'tenant'"),
        ({"version": 1, "tenants": []}, "'tenants' maps tenant names to quotas"),
        ({"version": 1, "tenants": {"Team A": {}}}, "'Team A' is not a valid tenant name"),
        ({"version": 1, "tenants": {"a": {"objets": 1}}}, "unknown field(s) 'objets'"),
        ({"version": 1, "tenants": {"a": {"objects": -1}}}, "objects must be a whole number"),
        ({"version": 1, "tenants": {"a": {"objects": True}}}, "objects must be a number"),
        ({"version": 1, "tenants": {"a": {"leases": 1.5}}}, "leases must be a whole number"),
        ({"version": 1, "tenants": {"a": {"dram_bytes": "lots"}}}, "cannot read 'lots'"),
        ({"version": 1, "default": {"nvme_bytes": [1]}}, "nvme_bytes must be a number of bytes"),
        (
            {"version": 1, "default": {"dram_bytes": 10, "guaranteed_dram_bytes": 11}},
            "guaranteed_dram_bytes (11) is above dram_bytes (10)",
        ),
    ],
)
def test_a_malformed_file_is_refused_saying_what_to_fix(content, problem):
    with pytest.raises(ValueError, match="quotas") as error:
        Quotas.from_json(content)
    assert problem in str(error.value)


def test_the_file_is_read_again_when_it_changes_and_a_broken_edit_keeps_the_last_good(tmp_path):
    path = tmp_path / "quotas.json"
    with pytest.raises(QuotaFileError, match="does not exist: create it with `kvpool quota set"):
        QuotaFile(path)
    path.write_text("{not json")
    with pytest.raises(QuotaFileError, match="is not JSON"):
        read_quotas(path)

    path.write_text(json.dumps({"version": 1, "tenants": {"a": {"objects": 1}}}))
    quotas_file = QuotaFile(path, check_interval=0)
    assert quotas_file.current().of("a").objects == 1
    path.write_text(json.dumps({"version": 1, "tenants": {"a": {"objects": 2}}}))
    assert quotas_file.current().of("a").objects == 2
    path.write_text(json.dumps({"version": 1, "tenants": {"a": {"objects": "two"}}}))
    assert quotas_file.current().of("a").objects == 2, "the last good quotas stay"
    path.unlink()
    assert quotas_file.current().of("a").objects == 2


# ------------------------------------------------------------------------------ metrics


def test_tenant_metrics_name_the_largest_tenants_and_sum_the_rest():
    usage = {f"t{i:03}": TenantUsage(objects=1, dram_bytes=i) for i in range(100)}
    refusals = {("t099", "objects"): 2, ("t000", "leases"): 3, ("t001", "leases"): 4}
    families = {f.name: f for f in metrics._tenant_families(usage, refusals)}
    objects = {s.labels["tenant"]: s.value for s in families["kvpool_tenant_objects"].samples}
    assert len(objects) == metrics.MAX_TENANT_SERIES + 1
    assert objects["other"] == 100 - metrics.MAX_TENANT_SERIES
    assert "t099" in objects and "t000" not in objects, "the largest by bytes have their own"
    refused = {
        (s.labels["tenant"], s.labels["quota"]): s.value
        for s in families["kvpool_tenant_quota_refusals"].samples
        if s.name.endswith("_total")
    }
    assert refused == {("t099", "objects"): 2, ("other", "leases"): 7}


# --------------------------------------------------------- quotas on every path to a tier


def test_a_put_that_asks_no_tier_goes_to_nvme_only_within_its_nvme_quota():
    state, _ = quota_state(limits(a=TenantQuota(nvme_bytes=8 * KiB)))
    mount_nvme(state, "n1", 4 * MiB)  # (no DRAM: a put that asks no tier lands on NVMe)
    for key in ("a/k1", "a/k2"):
        assert put(state, key, 4 * KiB).status is KeyStatus.OK
    message = refused(put(state, "a/k3", 4 * KiB))
    assert "nvme_bytes quota of 8.0 KiB" in message
    assert state.usage("a").nvme_bytes == 8 * KiB


def test_a_tenant_over_its_nvme_quota_is_evicted_from_dram_rather_than_demoted():
    state, _ = quota_state(limits(a=TenantQuota(nvme_bytes=0)))
    mount(state, "n1", 64 * KiB)
    mount_nvme(state, "n1", 4 * MiB)
    for i in range(15):
        publish(state, f"a/{i}", 4 * KiB, options=PutOptions(tier=Tier.DRAM))
    state.tick()
    assert state.counters.demotions == 0 and state.counters.evictions > 0
    assert state.usage("a").nvme_bytes == 0


def test_a_reader_that_lets_go_of_its_leases_frees_its_tenants_leases_quota_at_once():
    state, _ = quota_state(limits(a=TenantQuota(leases=1)))
    mount(state, "n1", 4 * MiB)
    for key in ("a/k1", "a/k2"):
        publish(state, key)
    [held], _ = state.get_replicas(["a/k1"], 60, client_id="reader-1")
    assert held.status is KeyStatus.OK
    assert state.release_leases("reader-1", ["a/k1"]) == 1  # (the reader closed)
    assert state.usage("a").leases == 0
    [read], _ = state.get_replicas(["a/k2"], 60, client_id="reader-2")
    assert read.status is KeyStatus.OK, "not held to the first reader's lease any more"


def test_a_standby_follows_the_quotas_file_so_a_new_leader_begins_with_the_last_good(tmp_path):
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"version": 1, "tenants": {"a": {"objects": 8}}}))
    quotas_file = QuotaFile(path, check_interval=0)
    driver = CoreDriver(None)  # a standby: no core
    handlers = MasterHandlers(driver)
    path.write_text(json.dumps({"version": 1, "tenants": {"a": {"objects": 3}}}))
    master_main._tick(driver, handlers, quotas_file)
    path.write_text("{a broken edit")
    master_main._tick(driver, handlers, quotas_file)
    state = master_main._new_state(MasterConfig(), 2, quotas_file)  # elected now
    assert state.quotas is not None and state.quotas.of("a").objects == 3


def test_a_byte_guarantee_does_not_let_a_tenant_of_tiny_objects_hold_the_whole_object_table():
    quotas = limits(b=TenantQuota(guaranteed_dram_bytes=64 * MiB))
    state, _ = quota_state(quotas, config=dataclasses.replace(CHECKED, max_objects=8))
    mount(state, "n1", 64 * MiB)
    for i in range(8):
        publish(state, f"b/{i}", 64)  # the whole table, far within b's guaranteed bytes
    for i in range(4):
        assert put(state, f"a/{i}", 64).status is KeyStatus.OK, "b is over half the table"
    assert sum(key.startswith("b/") for key in state.objects) == 4
    refused_put = put(state, "a/more", 64)
    assert refused_put.status is KeyStatus.NO_SPACE, "b is down to its half: a evicts no more"
    assert "within their share of the table" in refused_put.message


def test_a_tier_less_put_at_the_nvme_quota_is_fenced_not_refused_while_dram_is_fenced():
    state, clock = quota_state(limits(a=TenantQuota(nvme_bytes=0)))
    mount(state, "n1", 4 * MiB)
    mount_nvme(state, "n1", 4 * MiB)
    state.segments["n1/dram0"].fenced_until = clock() + 5  # (as after a master change)
    assert put(state, "a/k", 4 * KiB).status is KeyStatus.FENCED, "the client retries FENCED"


def test_a_refusal_gives_sizes_in_bytes_where_rounding_would_hide_why():
    state, _ = quota_state(limits(a=TenantQuota(reserved_bytes=4 * KiB)))
    mount(state, "n1", 4 * MiB)
    message = refused(put(state, "a/k", 4 * KiB + 1))
    assert "(0 B held, 4.1 KiB (" in message and " bytes) more asked)" in message, message
    asked = int(message.split(" bytes) more asked")[0].rsplit("(", 1)[1])
    assert asked > 4 * KiB, "the exact count shows it does not fit"
    assert asked == 4 * KiB + CONFIG.alignment, "(its buffer, as placed)"
