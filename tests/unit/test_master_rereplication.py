"""Re-replication and drains in the master's core (``master/state.py``, replication.py).

The rules, on a fake clock, the core's own invariants checked after every event:

- an object that loses a replica with its node gets a new one on a node that holds none of
  it, copied node to node (a Copy command to the target, naming the source segment of the
  other node); only once the node recorded the copy does a reader see it;
- copies start at the configured rate at most, and no more than the configured count are
  in flight at once; none go to a full node, a draining node or one above the watermark;
- a failed copy is tried again later; one whose object is removed meanwhile changes
  nothing when it is answered;
- a node that comes back with replicas copied meanwhile has its surplus trimmed;
- a draining node takes no new object, and its objects are copied away until the drain
  reports nothing left; then it may leave without any object losing a replica it should have;
- off (rate 0), nothing is copied: the old behaviour.
"""

from __future__ import annotations

import random
from dataclasses import replace

from state_helpers import (
    FakeClock,
    KiB,
    MiB,
    get,
    mount,
    nodes_of,
    publish,
    put,
    remove,
)

from kvpool.common.status import KeyStatus
from kvpool.master.config import MasterConfig
from kvpool.master.records import CopyCommand, ForgetCommand, PutOptions, StoredObject
from kvpool.master.state import MasterState

RATE = 1 * MiB  # bytes per second
CONFIG = MasterConfig(rereplication_rate=RATE, rereplication_copies=2, validate_each_event=True)


def cluster(
    nodes: int = 3, config: MasterConfig = CONFIG, size: int = 4 * MiB
) -> tuple[MasterState, FakeClock]:
    clock = FakeClock()
    state = MasterState(config, clock=clock, rng=random.Random(0))
    for i in range(nodes):
        mount(state, f"n{i}", size)
    return state, clock


def heartbeat_all_but(state: MasterState, dead: str) -> None:
    for node in list(state.nodes):
        if node != dead:
            state.heartbeat(node, [f"{node}/dram0"])


def kill(state: MasterState, clock: FakeClock, node: str) -> None:
    """``node`` stops heartbeating until the master declares it dead."""
    clock.advance(state.config.node_ttl + 0.5)
    heartbeat_all_but(state, node)
    report = state.tick()
    assert report.dead_nodes == [node]


def copies(state: MasterState) -> list[CopyCommand]:
    sent = [c for c in state.outbox if isinstance(c, CopyCommand)]
    state.outbox.clear()
    return sent


def answer(state: MasterState, commands: list[CopyCommand], ok: bool = True) -> None:
    for command in commands:
        state.command_done(command.command_id, ok, [0x1234] if ok else [])


def test_an_object_that_lost_a_replica_with_its_node_is_copied_to_another_node():
    state, clock = cluster()
    slot = publish(state, "k", 64 * KiB, replicas=2)
    holders = nodes_of(slot)
    state.outbox.clear()
    kill(state, clock, holders[0])
    assert state.snapshot().under_replicated == 1
    [copy] = copies(state)
    [spare] = {"n0", "n1", "n2"} - set(holders)
    assert copy.node_id == spare, "the target node copies"
    assert copy.source_segment is not None and copy.source_segment.node_id == holders[1]
    assert copy.source.size == 64 * KiB
    assert nodes_of(get(state, "k")) == [holders[1]], "not readable there before it is recorded"
    answer(state, [copy])
    assert sorted(nodes_of(get(state, "k"))) == sorted([holders[1], spare])
    assert state.snapshot().under_replicated == 0
    assert state.counters.replicas_copied == 1 and state.counters.bytes_copied == 64 * KiB
    assert [e.event for e in state.story("k")][-2:] == ["replicating", "replicated"]


def test_copies_start_at_the_configured_rate_and_count_at_most():
    state, clock = cluster(4, size=16 * MiB)
    for i in range(12):
        publish(state, f"k{i}", 512 * KiB, replicas=2, options=None)
    state.outbox.clear()
    victim = "n0"
    on_victim = [k for k in state.objects if victim in nodes_of(get(state, k))]
    assert len(on_victim) >= 4
    kill(state, clock, victim)
    first = copies(state)
    assert len(first) == 2, "no more than rereplication_copies in flight"
    answer(state, first)
    state.tick()
    # one second's burst of 1 MiB went to the first two copies: none more until it refills
    assert copies(state) == []
    started = 2
    for _ in range(40):
        clock.advance(0.25)
        heartbeat_all_but(state, victim)
        state.tick()
        batch = copies(state)
        started += len(batch)
        answer(state, batch)
    elapsed = 40 * 0.25
    assert started == len(on_victim), "every object got its copy"
    assert started * 512 * KiB <= RATE * (elapsed + 1.0) + 2 * 512 * KiB
    assert state.snapshot().under_replicated == 0


def test_no_copy_goes_to_a_node_holding_it_or_above_the_watermark():
    state, clock = cluster(2)
    publish(state, "k", 64 * KiB, replicas=2)
    state.outbox.clear()
    kill(state, clock, "n0")
    assert copies(state) == [], "the one node left already holds it"
    assert state.snapshot().under_replicated == 1
    mount(state, "n9", 64 * KiB)  # too small below the watermark for 64 KiB
    clock.advance(3)
    heartbeat_all_but(state, "n0")
    state.tick()
    assert copies(state) == []
    mount(state, "n8", 4 * MiB)
    clock.advance(3)
    heartbeat_all_but(state, "n0")
    state.tick()
    [copy] = copies(state)
    assert copy.node_id == "n8"


def test_a_failed_copy_is_tried_again_and_a_removed_objects_copy_changes_nothing():
    state, clock = cluster()
    publish(state, "k", 64 * KiB, replicas=2)
    publish(state, "gone", 64 * KiB, replicas=2)
    state.outbox.clear()
    # (two objects on two of three nodes share one)
    dead = min(set(nodes_of(get(state, "k"))) & set(nodes_of(get(state, "gone"))))
    kill(state, clock, dead)
    sent = {c.source.key: c for c in copies(state)}
    answer(state, [sent["k"]], ok=False)
    assert remove(state, "gone", force=True) is KeyStatus.OK
    forgets = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert any(o.key == "gone" for f in forgets for o in f.objects), "the target forgets it"
    state.outbox.clear()
    answer(state, [sent["gone"]])
    assert "gone" not in state.objects
    clock.advance(2.5)
    heartbeat_all_but(state, dead)
    state.tick()
    [again] = copies(state)
    assert again.source.key == "k"
    answer(state, [again])
    assert len(get(state, "k").replicas) == 2


def test_a_copy_that_failed_to_read_its_source_reads_another_even_on_a_draining_node():
    """The live node's replica is corrupt (its bytes fail the object's checksum at the
    target): copying from it again would fail for ever while the draining node leaves with
    the good one. The next copy reads the draining node's."""
    state, clock = cluster(nodes=3)
    both = PutOptions(replicas=2, preferred_hosts=("n0.cluster.local", "n2.cluster.local"))
    publish(state, "k", 64 * KiB, replicas=2, options=both)
    assert sorted(nodes_of(get(state, "k"))) == ["n0", "n2"]
    state.outbox.clear()
    state.drain("n2")
    state.tick()
    [first] = copies(state)
    assert (first.node_id, first.source_segment_id) == ("n1", "n0/dram0"), "a live source first"
    answer(state, [first], ok=False)
    clock.advance(2.5)
    state.tick()
    [again] = copies(state)
    assert (again.node_id, again.source_segment_id) == ("n1", "n2/dram0")
    answer(state, [again])
    assert sorted(nodes_of(get(state, "k"))) == ["n0", "n1", "n2"]
    assert state.drain_progress("n2").objects_left == 0


def test_a_source_whose_bytes_fail_the_checksum_at_a_copy_stops_being_a_replica():
    """The target found the live node's replica corrupt: that replica goes (readers would get
    wrong bytes), the object is copied from the good one (a draining node's), and an object
    with no other replica keeps its only one (one node's word does not end an object)."""
    state, clock = cluster(nodes=3)
    both = PutOptions(replicas=2, preferred_hosts=("n0.cluster.local", "n2.cluster.local"))
    publish(state, "k", 64 * KiB, replicas=2, options=both, crc32c=0xC0FFEE)
    state.outbox.clear()
    state.drain("n2")
    state.tick()
    [first] = copies(state)
    assert first.source_segment_id == "n0/dram0"
    state.command_done(first.command_id, False, source_corrupt=True)
    assert nodes_of(get(state, "k")) == ["n2"], "n0's corrupt replica is no replica"
    assert state.counters.replicas_unreadable == 1
    assert any(e.event == "replica_corrupt" for e in state.story("k"))
    [forget] = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert (forget.segment_id, forget.objects[0].offset) == ("n0/dram0", first.source.offset)
    clock.advance(2.5)
    state.tick()
    [again] = copies(state)  # (n0 takes none while it may still list the corrupt one)
    assert (again.node_id, again.source_segment_id) == ("n1", "n2/dram0")
    answer(state, [again])
    state.forget_answered(forget.command_id)
    clock.advance(2.5)
    state.tick()
    [last] = copies(state)  # (two live replicas wanted: n0 gets one now)
    assert (last.node_id, last.source_segment_id) in {("n0", "n2/dram0"), ("n0", "n1/dram0")}
    answer(state, [last])
    assert sorted(nodes_of(get(state, "k"))) == ["n0", "n1", "n2"]
    state.validate()


def test_the_only_replica_stays_whatever_a_copy_of_it_reports():
    state, clock = cluster(nodes=3)
    pair = PutOptions(replicas=2, preferred_hosts=("n0.cluster.local", "n1.cluster.local"))
    publish(state, "k", 64 * KiB, replicas=2, options=pair, crc32c=0xC0FFEE)
    state.outbox.clear()
    kill(state, clock, "n1")
    [copy] = copies(state)
    state.command_done(copy.command_id, False, source_corrupt=True)
    assert nodes_of(get(state, "k")) == ["n0"]


def test_a_node_that_comes_back_has_its_surplus_replica_trimmed():
    state, clock = cluster()
    slot = publish(state, "k", 64 * KiB, replicas=2)
    state.outbox.clear()
    dead = nodes_of(slot)[0]
    kill(state, clock, dead)
    answer(state, copies(state))
    assert len(get(state, "k").replicas) == 2
    record = state.objects["k"]
    # the node restarts with its persistent segment and reports what it holds
    [old] = [c for c in slot.replicas if c.segment.node_id == dead]
    offset = old.address - old.segment.base_address
    stored = StoredObject("k", offset, 64 * KiB, record.put_id, record.crc32c)
    state.mount_segment(old.segment, [stored])
    assert len(get(state, "k").replicas) == 3
    state.tick()
    forgets = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert [(f.node_id, o.key) for f in forgets for o in f.objects] == [(dead, "k")]
    assert dead not in nodes_of(get(state, "k")) and len(get(state, "k").replicas) == 2
    assert state.counters.replicas_trimmed == 1


def test_a_draining_node_takes_nothing_new_and_its_objects_are_copied_away():
    state, clock = cluster()
    for i in range(6):
        publish(state, f"k{i}", 64 * KiB, replicas=1)
    state.outbox.clear()
    on_n0 = [k for k in state.objects if nodes_of(get(state, k)) == ["n0"]]
    progress = state.drain("n0")
    assert progress is not None and progress.draining
    assert progress.objects_left == len(on_n0) and progress.live_nodes == 2
    for i in range(20):
        assert "n0" not in nodes_of(put(state, f"new{i}", 1 * KiB)), "a draining node took a put"
    for _ in range(10):
        clock.advance(0.5)
        state.heartbeat("n0", ["n0/dram0"])
        heartbeat_all_but(state, "n0")
        state.tick()
        answer(state, copies(state))
    assert state.drain_progress("n0").objects_left == 0
    lost, _ = state.unmount_segment("n0", "n0/dram0")
    assert lost == 0, "nothing lost when the drained node leaves"
    for key in on_n0:
        assert nodes_of(get(state, key)) != [], key
    assert state.drain("nobody") is None


def test_the_last_node_taking_objects_is_not_drained_and_no_last_replica_counts_as_drained():
    """A drain of the only node, or of the last node not draining, could copy nothing away:
    refused (not ``draining``). Objects whose other replicas are all on draining nodes are
    not drained: the last replica is never counted as copied away."""
    state, _ = cluster(nodes=1)
    publish(state, "alone", 64 * KiB)
    refused = state.drain("n0")
    assert refused is not None and not refused.draining and refused.live_nodes == 0
    assert not state.nodes["n0"].draining

    state, _ = cluster(nodes=2)
    publish(state, "both", 64 * KiB, replicas=2)
    first = state.drain("n0")
    assert first is not None and first.draining and first.objects_left == 0, "n1 holds it"
    second = state.drain("n1")
    assert second is not None and not second.draining, "n0 is draining: nowhere to copy to"


def test_an_object_on_draining_nodes_only_is_left_to_copy():
    state, _ = cluster(nodes=3)
    publish(
        state,
        "pair",
        64 * KiB,
        replicas=2,
        options=PutOptions(replicas=2, preferred_hosts=("n0.cluster.local", "n1.cluster.local")),
    )
    assert sorted(nodes_of(get(state, "pair"))) == ["n0", "n1"]
    state.drain("n0")
    progress = state.drain("n1")
    assert progress is not None and progress.draining and progress.objects_left == 1


def test_a_node_that_leaves_its_drain_with_objects_not_copied_is_remembered_for_kvpool_drain():
    """Its drain deadline passed (no room elsewhere, say) and it unmounted: ``kvpool drain``
    then says what was lost (DATA_LOSS) rather than "drained and left"; a node that left
    with everything copied, or mounts again, is not remembered so."""
    state, _ = cluster(nodes=2)
    for i in range(3):
        publish(state, f"k{i}", 64 * KiB, options=PutOptions(preferred_hosts=("n0.cluster.local",)))
    assert state.drain("n0").objects_left == 3
    lost, _ = state.unmount_segment("n0", "n0/dram0")  # (at its deadline, nothing copied)
    assert lost == 3
    assert state.drain("n0") is None and state.left_with_losses == {"n0": 3}
    mount(state, "n0", 4 * MiB)
    assert state.left_with_losses == {}


def test_a_draining_node_that_dies_is_remembered_with_what_only_it_held():
    state, clock = cluster(nodes=2)
    for i in range(3):
        publish(state, f"k{i}", 64 * KiB, options=PutOptions(preferred_hosts=("n0.cluster.local",)))
    publish(state, "both", 64 * KiB, replicas=2)
    assert state.drain("n0").objects_left == 3
    kill(state, clock, "n0")
    assert state.drain("n0") is None and state.left_with_losses == {"n0": 3}


def test_what_a_failed_copy_remembers_of_its_source_goes_with_the_object():
    state, clock = cluster()
    publish(state, "k", 64 * KiB, replicas=2)
    state.outbox.clear()
    kill(state, clock, min(nodes_of(get(state, "k"))))
    answer(state, copies(state), ok=False)
    assert "k" in state._copy_failed_from
    assert remove(state, "k", force=True) is KeyStatus.OK
    assert "k" not in state._copy_failed_from


def test_off_nothing_is_copied():
    state, clock = cluster(3, replace(CONFIG, rereplication_rate=0.0))
    slot = publish(state, "k", 64 * KiB, replicas=2)
    state.outbox.clear()
    kill(state, clock, nodes_of(slot)[0])
    assert copies(state) == []
    assert state.snapshot().under_replicated == 0


def test_a_node_silent_on_its_commands_takes_no_copy_until_it_answers():
    """A node that left a Forget unanswered past its wait (quarantined: a hung disk, say,
    while it still heartbeats) is no target: a copy there would only time out."""
    state, clock = cluster()
    holders = nodes_of(publish(state, "k", 64 * KiB, replicas=2))
    [spare] = {"n0", "n1", "n2"} - set(holders)
    on_spare = PutOptions(replicas=1, preferred_hosts=(f"{spare}.cluster.local",))
    assert nodes_of(publish(state, "gone", 4 * KiB, options=on_spare)) == [spare]
    state.outbox.clear()
    remove(state, "gone")
    [forget] = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    state.outbox.clear()
    state.quarantine(forget)  # (what the core does when the Forget's wait passes)

    kill(state, clock, holders[0])
    assert copies(state) == [], "a copy went to the silent node"
    state.node_answered(spare)
    state.forget_answered(forget.command_id)
    clock.advance(2.0)  # (looked at again: replication.RETRY_DELAY)
    state.tick()
    [copy] = copies(state)
    assert copy.node_id == spare


def test_no_copy_goes_where_a_cancelled_copy_of_the_object_is_still_awaited():
    """A copy cancelled when its source's segment went keeps its target until the node
    answers, and its answer then has that place forgotten. A second copy of the object goes
    elsewhere meanwhile: on the same segment, it would lie beside a Forget of its generation,
    which a new leader's durable record holds against every place of it there."""
    state, clock = cluster(nodes=5)
    publish(state, "k", 4 * KiB, replicas=3)
    state.outbox.clear()
    [dead] = nodes_of(get(state, "k"))[:1]
    kill(state, clock, dead)
    clock.advance(2)
    heartbeat_all_but(state, "")
    state.tick()
    [first] = copies(state)
    source_node = first.source_segment_id.split("/")[0]
    state.unmount_segment(source_node, first.source_segment_id)  # (the copy is cancelled)
    clock.advance(2)
    heartbeat_all_but(state, "")
    state.tick()
    again = copies(state)

    assert again, "the object is copied again meanwhile"
    assert all(c.target_segment_id != first.target_segment_id for c in again)

    answer(state, again)
    answer(state, [first])  # (late: the node did copy; its target is forgotten)
    [forget] = [c for c in state.outbox if isinstance(c, ForgetCommand)]
    assert (forget.segment_id, forget.objects[0].offset) == (
        first.target_segment_id,
        first.target.offset,
    )
    state.validate()
