"""An object's replica count survives a master failover (``master/state.py``: adoption).

The count a put got travels with every command that has a node record the object (Persist,
and the target of a Copy), and comes back in what the node reports when it mounts. A new
master adopts it:

- an object reported with a count wants that many replicas again, whatever number of nodes
  reports it (the largest count any report gives), so that a node lost after the failover
  is made good, and a surplus copied meanwhile is trimmed;
- a report is input: a count above the master's ``max_replicas`` is taken as that bound; a
  report with no count (0: a node of an older kvpool) falls back to as many as report it;
- an object reported by one node only, which wants more, is copied once the other nodes had
  the time to remount (a node TTL): the node that held its other replica may never come back.
"""

from __future__ import annotations

import random
from dataclasses import replace

from state_helpers import FakeClock, KiB, MiB, get, mount, nodes_of, put, segment_info

from kvpool.common.status import KeyStatus
from kvpool.master.config import MasterConfig
from kvpool.master.records import Commit, CopyCommand, PersistCommand, PutSlot, StoredObject
from kvpool.master.state import MasterState

CONFIG = MasterConfig(rereplication_rate=MiB, validate_each_event=True)


def master(epoch: int = 1, config: MasterConfig = CONFIG) -> tuple[MasterState, FakeClock]:
    clock = FakeClock()
    return MasterState(config, clock=clock, rng=random.Random(epoch), epoch=epoch), clock


def publish(state: MasterState, key: str, replicas: int) -> tuple[PutSlot, list]:
    """A complete put of 64 KiB; returns its slot and the commands its nodes were sent."""
    slot = put(state, key, 64 * KiB, replicas)
    assert slot.status is KeyStatus.OK
    assert state.put_end([Commit(key, slot.put_id, (True,) * len(slot.replicas))]) == [None]
    sent = list(state.outbox)
    state.outbox.clear()
    for command in sent:
        state.command_done(command.command_id, True, [0xABC])
    assert [r.status for r in state.resolved] == [KeyStatus.OK]
    state.resolved.clear()
    return slot, sent


def recorded(commands) -> dict[str, list[StoredObject]]:
    """What each node records from the commands the master sent (node id -> objects)."""
    held: dict[str, list[StoredObject]] = {}
    for command in commands:
        if isinstance(command, PersistCommand):
            held.setdefault(command.node_id, []).extend(command.objects)
        elif isinstance(command, CopyCommand):
            held.setdefault(command.node_id, []).append(command.target)
    return held


def tick_until_copies(state: MasterState, clock: FakeClock, nodes: list[str]) -> list:
    for _ in range(20):
        clock.advance(0.5)
        for node in nodes:
            state.heartbeat(node, [f"{node}/dram0"])
        state.tick()
        copies = [c for c in state.outbox if isinstance(c, CopyCommand)]
        if copies:
            state.outbox.clear()
            return copies
    return []


def test_each_persist_carries_the_count_the_put_got():
    state, _ = master()
    for node in ("n0", "n1", "n2"):
        mount(state, node, 4 * MiB)
    state.outbox.clear()
    sent = publish(state, "two", 2)[1] + publish(state, "one", 1)[1]
    counts = {o.key: o.replicas for objects in recorded(sent).values() for o in objects}
    assert counts == {"two": 2, "one": 1}


def test_a_new_master_restores_the_count_and_copies_what_a_lost_node_held():
    old, _ = master(epoch=1)
    for node in ("n0", "n1", "n2"):
        mount(old, node, 4 * MiB)
    old.outbox.clear()
    slot, sent = publish(old, "k", 2)
    held = recorded(sent)
    holders = nodes_of(slot)
    assert sorted(held) == sorted(holders)

    new, clock = master(epoch=2)
    for node in ("n0", "n1", "n2"):
        new.mount_segment(segment_info(node, 4 * MiB), held.get(node, []), remount=True)
    assert new.objects["k"].wanted == 2, "the count came back with the nodes' reports"
    assert sorted(nodes_of(get(new, "k"))) == sorted(holders)

    dead, survivor = holders
    [spare] = {"n0", "n1", "n2"} - set(holders)
    clock.advance(new.config.node_ttl + 0.5)
    for node in (survivor, spare):
        new.heartbeat(node, [f"{node}/dram0"])
    assert new.tick().dead_nodes == [dead]
    [copy] = [c for c in new.outbox if isinstance(c, CopyCommand)]
    assert (copy.node_id, copy.source_segment_id) == (spare, f"{survivor}/dram0")
    assert copy.target.replicas == 2, "the copy records the count too"
    new.command_done(copy.command_id, True, [0x1234])
    assert sorted(nodes_of(get(new, "k"))) == sorted([survivor, spare])


def test_the_largest_count_reported_is_adopted_and_a_surplus_is_trimmed():
    state, _ = master(epoch=2)
    for node in ("n0", "n1", "n2"):
        mount(state, node, 4 * MiB)
    # a copy landed on n2 while the old master ran: three nodes report an object wanting 2
    for node, count in (("n0", 2), ("n1", 1), ("n2", 2)):
        info = segment_info(node, 4 * MiB, f"{node}/dram1", base=0x900_0000)
        state.mount_segment(info, [StoredObject("k", 0, 64 * KiB, 7, 0xABC, count)])
    assert state.objects["k"].wanted == 2
    state.outbox.clear()
    state.tick()
    assert len(get(state, "k").replicas) == 2, "the surplus replica was trimmed"
    assert state.counters.replicas_trimmed == 1


def test_a_count_above_the_masters_bound_is_taken_as_the_bound():
    config = replace(CONFIG, max_replicas=3)
    state, _ = master(config=config)
    mount(state, "n0", 4 * MiB)
    state.mount_segment(
        segment_info("n1", 4 * MiB), [StoredObject("huge", 0, 64 * KiB, 5, None, 1_000_000)]
    )
    assert state.objects["huge"].wanted == 3


def test_reports_with_no_count_fall_back_to_as_many_as_report_it():
    state, _ = master()
    for node in ("n0", "n1"):
        state.mount_segment(segment_info(node, 4 * MiB), [StoredObject("old", 0, 64 * KiB, 5)])
    assert state.objects["old"].wanted == 2
    state.mount_segment(segment_info("n2", 4 * MiB), [StoredObject("lone", 0, 64 * KiB, 6)])
    assert state.objects["lone"].wanted == 1


def test_an_object_whose_other_holder_never_remounts_is_copied_after_a_node_ttl():
    state, clock = master(epoch=2)
    mount(state, "n1", 4 * MiB)
    state.mount_segment(
        segment_info("n0", 4 * MiB), [StoredObject("k", 0, 64 * KiB, 9, 0xABC, 2)], remount=True
    )
    state.outbox.clear()
    state.tick()
    assert not [c for c in state.outbox if isinstance(c, CopyCommand)], (
        "no copy before the other nodes had the time to remount"
    )
    copies = tick_until_copies(state, clock, ["n0", "n1"])
    assert [c.node_id for c in copies] == ["n1"]
    assert clock() >= 1_000.0 + state.config.node_ttl
    state.command_done(copies[0].command_id, True, [0xABC])
    assert sorted(nodes_of(get(state, "k"))) == ["n0", "n1"]
