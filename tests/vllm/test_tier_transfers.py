"""Store, lookup and load through vLLM's secondary-tier interface against a real cluster:
the bytes of a primary slot come back whole into any other slot, misses are misses, and the
scheduler's calls return at once (the transfers run on the tier's own threads).

(The checks of vLLM's tests of its file-system tier, made of kvpool's: empty lookups miss, a
store makes the chunk a hit, batches of any size round-trip into other slots, jobs are
tracked apart, a load with a missing chunk fails and reports the chunks that did arrive, a
slot outside the primary fails its job.)
"""

from __future__ import annotations

import json

import pytest
from helpers import being_written

from kvpool import Client

#: A scheduler call that takes longer than this waited on something: they must not.
PROMPT = 0.05


def test_lookups_on_an_empty_tier_miss_after_one_step(make_tier):
    tier = make_tier()
    looked = tier.lookup(keys=[1, 2])
    # vLLM's asynchronous lookups: unknown until the step's batch went to kvpool, then MISS
    assert looked["first"] == ["RETRY", "RETRY"]
    assert looked["final"] == ["MISS", "MISS"]
    assert looked["longest_call_s"] < PROMPT


def test_a_stored_chunk_is_a_hit_and_lies_in_kvpool_at_the_slot_size(make_tier, tier_cluster):
    tier = make_tier(slot_bytes=256 * 1024)
    tier.fill(slots=[0], seed=7)
    stored = tier.run("store", 1, keys=[1], slots=[0])
    assert stored["success"]
    assert stored["transfer_bytes"] == 256 * 1024
    assert stored["submit_s"] < PROMPT and stored["longest_poll_s"] < PROMPT
    assert tier.lookup(keys=[1])["final"] == ["HIT"]
    (name,) = tier.names(keys=[1])["names"]
    assert name.startswith("vllm/")  # the default key_prefix
    with Client(tier_cluster.master_address) as client:
        assert client.stat(name).size == 256 * 1024


@pytest.mark.parametrize("count", [0, 1, 2, 5])
def test_a_batch_of_any_size_comes_back_whole_into_other_slots(make_tier, count):
    tier = make_tier(slots=10)
    keys = list(range(100, 100 + count))
    sources = list(range(count))
    targets = list(range(10 - count, 10))
    expected = tier.fill(slots=sources, seed=count)["digests"]
    assert tier.run("store", 1, keys=keys, slots=sources)["success"]
    tier.set(slots=list(range(10)), byte=0)  # what the load brings, it brings from kvpool
    loaded = tier.run("load", 2, keys=keys, slots=targets)
    assert loaded["success"]
    assert loaded["transfer_bytes"] == count * tier.info["slot_bytes"]
    assert tier.digest(slots=targets)["digests"] == expected


def test_jobs_are_tracked_apart(make_tier):
    tier = make_tier()
    tier.fill(slots=[0, 1], seed=3)
    tier.store(job_id=1, keys=[1], slots=[0])
    tier.store(job_id=2, keys=[2], slots=[1])
    waited = tier.wait(job_ids=[1, 2])
    assert sorted(r["job_id"] for r in waited["results"]) == [1, 2]
    assert all(r["success"] for r in waited["results"])
    assert tier.lookup(keys=[1, 2])["final"] == ["HIT", "HIT"]
    assert not waited["pending_work"]


def test_storing_a_chunk_again_succeeds_without_writing_it_again(make_tier):
    tier = make_tier()
    tier.fill(slots=[0], seed=4)
    assert tier.run("store", 1, keys=[1], slots=[0])["transfer_bytes"] > 0
    again = tier.run("store", 2, keys=[1], slots=[0])
    assert again["success"] and again["transfer_bytes"] == 0
    assert tier.stats()["stats"]["chunks_already_stored"] == 1


def test_a_chunk_another_engine_is_still_writing_is_not_reported_stored(make_tier, tier_cluster):
    """(its put may yet fail: vLLM would count on a chunk kvpool never holds)"""
    tier = make_tier()
    tier.fill(slots=[0], seed=8)
    (name,) = tier.names(keys=[1])["names"]
    with being_written(tier_cluster.master_address, name, tier.info["slot_bytes"]):
        assert not tier.run("store", 1, keys=[1], slots=[0])["success"]
        assert tier.stats()["stats"]["chunks_already_stored"] == 0
    assert tier.run("store", 2, keys=[1], slots=[0])["transfer_bytes"] > 0
    assert tier.lookup(keys=[1])["final"] == ["HIT"]


def test_another_engine_of_the_same_model_finds_the_chunks(make_tier):
    first = make_tier(model="kvpool-test/shared-model")
    digests = first.fill(slots=[0, 1], seed=5)["digests"]
    assert first.run("store", 1, keys=[1, 2], slots=[0, 1])["success"]
    second = make_tier(model="kvpool-test/shared-model")
    assert second.lookup(keys=[1, 2])["final"] == ["HIT", "HIT"]
    assert second.run("load", 1, keys=[1, 2], slots=[3, 4])["success"]
    assert second.digest(slots=[3, 4])["digests"] == digests


def test_an_engine_of_another_model_never_reads_them(make_tier):
    first = make_tier(model="kvpool-test/model-a")
    first.fill(slots=[0], seed=6)
    assert first.run("store", 1, keys=[1], slots=[0])["success"]
    other = make_tier(model="kvpool-test/model-b")
    assert other.lookup(keys=[1])["final"] == ["MISS"]
    assert not other.run("load", 1, keys=[1], slots=[0])["success"]


def test_engines_of_another_kv_cache_layout_never_read_each_others_chunks(make_tier):
    """Engines of one model on other attention backends hold blocks of the same size with
    the heads in another order (NHD, HND): one loading the other's would take wrong KV."""
    nhd = make_tier(model="kvpool-test/layouts", kv_cache_layout="NHD")
    digests = nhd.fill(slots=[0], seed=8)["digests"]
    assert nhd.run("store", 1, keys=[1], slots=[0])["success"]
    hnd = make_tier(model="kvpool-test/layouts", kv_cache_layout="HND")
    assert hnd.lookup(keys=[1])["final"] == ["MISS"]
    assert not hnd.run("load", 1, keys=[1], slots=[0])["success"]
    same = make_tier(model="kvpool-test/layouts", kv_cache_layout="NHD")
    assert same.lookup(keys=[1])["final"] == ["HIT"]
    assert same.run("load", 1, keys=[1], slots=[2])["success"]
    assert same.digest(slots=[2])["digests"] == digests


def test_engines_of_another_chunk_size_keep_their_own_chunks(make_tier, tier_cluster):
    # vLLM keys a chunk by the hash of its last block: a chunk of 4 blocks and a chunk of 1
    # ending with the same block are other bytes, so they are other kvpool objects (the same
    # key would make one engine lose its hits, or load the other's bytes)
    block = 16 * 1024
    one = make_tier(slot_bytes=block)
    four = make_tier(slot_bytes=block, blocks_per_chunk=4)
    assert (one.info["chunk_bytes"], four.info["chunk_bytes"]) == (block, 4 * block)
    (name_one,) = one.names(keys=[7])["names"]
    (name_four,) = four.names(keys=[7])["names"]
    assert name_one != name_four
    # the names are vLLM's own (as its file-system tier makes them); those of chunks of one
    # block, all this tier made before, stay as they were
    assert one.file_names(keys=[7])["names"] == [name_one]
    assert four.file_names(keys=[7], blocks_per_file=4)["names"] == [name_four]
    digests = {"one": one.fill(slots=[0], seed=1)["digests"]}
    digests["four"] = four.fill(slots=[0], seed=2)["digests"]
    assert one.run("store", 1, keys=[7], slots=[0])["success"]
    assert four.run("store", 1, keys=[7], slots=[0])["success"]
    for tier, name in ((one, "one"), (four, "four")):
        assert tier.lookup(keys=[7], req_id=f"read-{name}")["final"] == ["HIT"]
        tier.set(slots=[1], byte=0)
        assert tier.run("load", 2, keys=[7], slots=[1])["success"]
        assert tier.digest(slots=[1])["digests"] == digests[name]
    with Client(tier_cluster.master_address) as client:
        assert (client.stat(name_one).size, client.stat(name_four).size) == (block, 4 * block)


def test_a_load_of_a_missing_chunk_fails_and_the_request_stops_asking(make_tier):
    tier = make_tier()
    tier.set(slots=[0], byte=0x5A)
    assert tier.lookup(keys=[99], req_id="r")["final"] == ["MISS"]
    loaded = tier.run("load", 1, keys=[99], slots=[0])
    assert not loaded["success"] and loaded["successful_keys"] is None
    assert tier.uniform(slots=[0])["bytes"] == [0x5A]  # the slot is untouched


def test_a_partly_missing_load_reports_the_chunks_that_arrived(make_tier):
    tier = make_tier()
    digests = tier.fill(slots=[0, 1], seed=8)["digests"]
    assert tier.run("store", 1, keys=[10, 11], slots=[0, 1])["success"]
    assert tier.lookup(keys=[10, 11, 12], req_id="r")["final"] == ["HIT", "HIT", "MISS"]
    loaded = tier.run("load", 2, keys=[10, 11, 12], slots=[4, 5, 6])
    assert not loaded["success"]
    assert loaded["successful_keys"] == [10, 11]
    assert tier.digest(slots=[4, 5])["digests"] == digests


def test_after_a_failed_load_its_chunks_miss_for_that_request_without_asking_kvpool(
    make_tier, tier_cluster
):
    tier = make_tier()
    tier.fill(slots=[0, 1], seed=9)
    assert tier.run("store", 1, keys=[1, 2], slots=[0, 1])["success"]
    assert tier.lookup(keys=[1, 2], req_id="r")["final"] == ["HIT", "HIT"]
    # chunk 2 vanishes between lookup and load (removed, evicted, its node lost)
    (gone,) = tier.names(keys=[2])["names"]
    with Client(tier_cluster.master_address) as client:
        client.remove(gone, force=True)
    loaded = tier.run("load", 2, keys=[1, 2], slots=[3, 4])
    assert not loaded["success"] and loaded["successful_keys"] == [1]
    # get_finished_jobs marked chunk 2 a miss for this request: it is not promoted again
    # (a livelock otherwise), and chunk 1, which arrived, is still a hit
    assert tier.lookup_again(keys=[1, 2], req_id="r")["results"] == ["HIT", "MISS"]
    # another request asks kvpool afresh
    assert tier.lookup(keys=[1, 2], req_id="other")["final"] == ["HIT", "MISS"]


def test_a_job_naming_a_slot_outside_the_primary_fails_at_once(make_tier):
    tier = make_tier(slots=4)
    stored = tier.run("store", 1, keys=[1], slots=[4])
    loaded = tier.run("load", 2, keys=[1], slots=[-1])
    assert not stored["success"] and not loaded["success"]
    assert tier.stats()["stats"]["store_jobs"] == 0  # refused before any transfer


def test_replicas_from_the_entry(make_tier, tier_cluster):
    tier = make_tier(replicas=2)
    tier.fill(slots=[0], seed=10)
    assert tier.run("store", 1, keys=[1], slots=[0])["success"]
    (name,) = tier.names(keys=[1])["names"]
    with Client(tier_cluster.master_address) as client:
        assert len(client.stat(name).replicas) == 2


def test_key_prefix_from_the_entry(make_tier):
    tier = make_tier(key_prefix="team-a/kv")
    (name,) = tier.names(keys=[1])["names"]
    assert name.startswith("team-a/kv/")


def test_stored_chunks_are_reported_as_kv_events(make_tier):
    tier = make_tier(enable_kv_events=True, locality="REMOTE", kv_events=True)
    tier.fill(slots=[0, 1], seed=11)
    assert tier.run("store", 1, keys=[1, 2], slots=[0, 1])["success"]
    (event,) = tier.events()["events"]
    assert event == {"keys": [1, 2], "removed": False, "medium": "CPU", "locality": "REMOTE"}
    assert tier.events()["events"] == []  # each event is taken once


def test_shutdown_answers_every_job_and_leaves_the_primary_alone(make_tier):
    tier = make_tier(slots=8, slot_bytes=1024 * 1024)
    tier.fill(slots=list(range(4)), seed=12)
    for job in range(8):
        tier.store(job_id=job, keys=[job], slots=[job % 4])
    closed = tier.shutdown()
    assert closed["closed"]


def test_after_a_load_its_chunks_hold_no_lease_and_can_be_removed_at_once(make_tier, tier_cluster):
    # A load's read leases end with the job (success or not), not load_timeout_s later: a
    # chunk loaded can be evicted or removed at once, and counts against no leases quota.
    tier = make_tier(slots=4)
    tier.fill(slots=[0, 1], seed=5)
    assert tier.run("store", 1, keys=[1, 2], slots=[0, 1])["success"]
    assert tier.run("load", 2, keys=[1], slots=[2])["success"]
    assert not tier.run("load", 3, keys=[2, 404], slots=[3, 2])["success"]  # one missing
    names = tier.names(keys=[1, 2])["names"]
    with Client(tier_cluster.master_address) as client:
        assert [client.stat(name).lease_remaining_ms for name in names] == [0, 0]
        assert client.remove_many(names) == [None, None]  # without force


def test_a_lookup_hit_leases_the_chunk_for_lookup_lease_s_only(make_tier, tier_cluster):
    # (the lease covers the scheduler steps between the lookup and its load; the master's
    # default, 10 s, would pin looked-up chunks long after)
    tier = make_tier(lookup_lease_s=4)
    tier.fill(slots=[0], seed=6)
    assert tier.run("store", 1, keys=[1], slots=[0])["success"]
    assert tier.lookup(keys=[1])["final"] == ["HIT"]
    (name,) = tier.names(keys=[1])["names"]
    with Client(tier_cluster.master_address) as client:
        assert 0 < client.stat(name).lease_remaining_ms <= 4000


def test_a_lookup_beyond_the_leases_quota_misses_and_says_so(make_tier, cluster_factory, tmp_path):
    # A hit takes a read lease, which the tenant's leases quota counts: the keys beyond it
    # are misses, and a warning names the quota (not a silent miss).
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"version": 1, "tenants": {"capped": {"leases": 2}}}))
    cluster = cluster_factory(
        1, "64MiB", tenants=("capped",), master_args=["--quotas", str(quotas)]
    )
    credentials = cluster.client_credentials("capped")
    tier = make_tier(master=cluster.master_address, **credentials)
    tier.fill(slots=[0, 1, 2], seed=7)
    assert tier.run("store", 1, keys=[1, 2, 3], slots=[0, 1, 2])["success"]
    tier.logs()
    final = tier.lookup(keys=[1, 2, 3])["final"]
    assert sorted(final) == ["HIT", "HIT", "MISS"], final
    assert tier.stats()["stats"]["lookups_refused"] == 1
    lines = tier.logs()["lines"]
    assert any("refused" in line and "leases quota" in line for line in lines), lines
