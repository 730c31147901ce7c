"""A prefix removal while a node is not heard from distrusts that prefix only
(``Tombstones.distrust_unheard``).

A new leader past its rebuild window takes clients before every node has remounted. A
removal of a whole prefix then reaches keys it cannot list, those such a node holds: at the
node's mount, the master adopts, under that prefix, only what it holds. It used to distrust
the whole node: one tenant removing its own keys (``RemovePrefix("mine/")``, sent as
``ta/mine/``) made the node's remount refuse every other tenant's objects too, lost through
that one call (found by a security investigation, 2026-12-07).
"""

from __future__ import annotations

import json

from state_helpers import new_state, publish, segment_info, stored

from kvpool.master.core import MasterCore
from kvpool.master.records import PutOptions
from kvpool.master.tombstone_format import decode, encode, merge, split
from kvpool.master.tombstones import (
    MAX_ENDED_PER_NAMESPACE,
    MAX_PREFIXES_PER_NAMESPACE,
    DurableRecord,
)

MiB = 1 << 20
KEYS = ("ta/mine/1", "ta/mine/2", "ta/other", "tb/secret", "tb/mine/1", "tc/x")


def successor_without_n2(records: dict[str, DurableRecord] | None = None):
    """Term 1 put KEYS on n2; the next leader heard from n1 only and took clients once its
    window passed (its epoch a later one, as an election's). Returns the core, n2's segment
    and what n2 reports."""
    state, _ = new_state(epoch=1)
    n1, n2 = segment_info("n1", MiB), segment_info("n2", MiB)
    state.mount_segment(n1)
    state.mount_segment(n2)
    on_n2 = PutOptions(replicas=1, preferred_hosts=(n2.host,))
    for key in KEYS:
        publish(state, key, 4096, options=on_n2)
    held = [stored(state, key, n2.segment_id) for key in KEYS]
    successor, clock = new_state(epoch=2)
    successor.restore_tombstones(records or {})
    core = MasterCore(successor, awaited_nodes=["n1", "n2"], rebuild_window=10.0)
    core.mount_segment(1, n1, [], True, 0.0)
    clock.advance(10.0)
    assert core.accepting_clients()
    return core, n2, held


def test_a_tenants_prefix_removal_refuses_that_prefix_only_at_the_nodes_mount():
    core, n2, held = successor_without_n2()
    core.remove_prefix(2, "ta/mine/", False)

    refused = core.mount_segment(3, n2, held, True, 0.0).answers[3]
    assert sorted(refused) == ["ta/mine/1", "ta/mine/2"]
    for key in ("ta/other", "tb/secret", "tb/mine/1", "tc/x"):
        assert key in core.state.objects, f"{key} was not under the removed prefix"


def test_a_removal_of_every_key_still_distrusts_the_whole_node():
    core, n2, held = successor_without_n2()
    core.remove_prefix(2, "", True)

    assert sorted(core.mount_segment(3, n2, held, True, 0.0).answers[3]) == sorted(KEYS)


def test_the_scoped_distrust_survives_a_failover_in_the_durable_record():
    core, n2, held = successor_without_n2()
    effects = core.remove_prefix(2, "ta/mine/", False)
    assert "node:n2" in effects.durable
    record = core.state.durable_record("node:n2")
    assert record is not None and not record.distrusted
    assert [prefix for prefix, _ in record.prefixes] == ["ta/mine/"]
    # as etcd keeps it (pieces) and as a lone master's file keeps it (whole)
    pieces = {b: decode(encode(p, 1.0))[1] for b, p in split(record).items()}
    assert merge(pieces.values()) == record
    assert decode(encode(record, 1.0))[1] == record

    third, n2, held = successor_without_n2({"node:n2": merge(pieces.values())})
    assert sorted(third.mount_segment(3, n2, held, True, 0.0).answers[3]) == [
        "ta/mine/1",
        "ta/mine/2",
    ]


def test_a_master_before_scoped_distrust_reads_the_record_as_a_whole_distrust():
    """Safe in a rolling upgrade: it adopts nothing from the node it does not hold."""
    record = DurableRecord(False, {"tb/x": 3}, frozenset(), frozenset({("ta/mine/", 9)}))
    written = json.loads(encode(record, 1.0))
    assert written["distrusted"] is True and written["scoped"] == [["ta/mine/", 9]]


def test_past_its_share_a_tenants_prefixes_give_way_to_its_whole_namespace():
    """A tenant cannot grow a node's entry without end, nor reach another tenant by it."""
    core, n2, held = successor_without_n2()
    for i in range(MAX_PREFIXES_PER_NAMESPACE + 1):
        core.remove_prefix(10 + i, f"ta/p{i}/", False)
    record = core.state.durable_record("node:n2")
    assert record is not None and not record.distrusted
    assert {prefix for prefix, _ in record.prefixes} == {"ta/"}

    refused = core.mount_segment(3, n2, held, True, 0.0).answers[3]
    assert sorted(refused) == ["ta/mine/1", "ta/mine/2", "ta/other"]
    for key in ("tb/secret", "tb/mine/1", "tc/x"):
        assert key in core.state.objects


def test_one_tenants_many_prefix_removals_do_not_make_anothers_distrust_the_node():
    """Found by review: 64 removals of one tenant filled the entry, and the next removal of
    another tenant distrusted the whole node."""
    core, n2, held = successor_without_n2()
    for i in range(100):
        core.remove_prefix(10 + i, f"tc/p{i}/", False)
    core.remove_prefix(200, "ta/mine/", False)

    refused = core.mount_segment(3, n2, held, True, 0.0).answers[3]
    assert sorted(refused) == ["ta/mine/1", "ta/mine/2", "tc/x"]
    for key in ("ta/other", "tb/secret", "tb/mine/1"):
        assert key in core.state.objects


def test_one_tenants_removals_of_absent_keys_do_not_cost_another_its_objects():
    """Found by review: each removed key the master does not hold is noted in the unheard
    node's entry; past the record's bound the whole node was distrusted at the next
    leader. Past its tenant's share they make way for a distrust of its namespace."""
    core, n2, held = successor_without_n2()
    for start in range(0, 2 * MAX_ENDED_PER_NAMESPACE, 256):
        keys = [f"tc/absent/{i}" for i in range(start, start + 256)]
        core.remove(100 + start, keys, False)
    record = core.state.durable_record("node:n2")
    assert record is not None and not record.distrusted
    assert len(record.keys) <= MAX_ENDED_PER_NAMESPACE
    assert [prefix for prefix, _ in record.prefixes] == ["tc/"]

    refused = core.mount_segment(3, n2, held, True, 0.0).answers[3]
    assert refused == ["tc/x"]
    for key in ("ta/mine/1", "ta/other", "tb/secret", "tb/mine/1"):
        assert key in core.state.objects


def test_a_put_after_the_removal_is_not_refused():
    """The prefix refuses the generations issued until the removal, not later ones."""
    core, n2, held = successor_without_n2()
    core.remove_prefix(2, "ta/mine/", False)
    assert core.state._tombstones.refuses(
        n2.segment_id, "ta/mine/1", held[0].generation, False, "n2"
    )
    newer = core.state._issued_so_far() + 1
    assert not core.state._tombstones.refuses(n2.segment_id, "ta/mine/9", newer, False, "n2")


def test_a_segments_record_with_prefixes_is_taken_as_a_whole_distrust():
    """Only a node's entry keeps prefixes (until the node is heard); a segment's goes at its
    mount, and a report in parts would not hold them. No master writes one; one read
    (hand-edited, a later version) is honoured as the safe whole distrust."""
    from kvpool.master.tombstones import Tombstones

    tombstones = Tombstones()
    tombstones.restore("n2/dram0", DurableRecord(False, {}, frozenset(), frozenset({("ta/", 9)})))
    assert tombstones.refuses("n2/dram0", "tb/secret", 3, False)
    assert not tombstones.refuses("n2/dram0", "tb/secret", 3, True)
