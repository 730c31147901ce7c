"""A call the core holds back for unanswered Forgets is answered as things stand when it is
released, not as they stood when it arrived (both found by the core's model check with fresh
seeds, test_master_core_model.py).

- A removal answers once every node has dropped the object, including a node whose replica
  the master gave up earlier (a drain moved it, eviction trimmed it) and which has not yet
  answered that Forget: answered before, a new leader would adopt the removed object again
  from that node's report.
- A PutStart held behind a Forget may see one of its reservations end while it waits (a
  forced removal, its node lost). Its space may go to another object meanwhile: the slot is
  answered FENCED (the client asks again), never OK, or its writer would overwrite that
  object.
"""

from __future__ import annotations

from state_helpers import FakeClock, segment_info

from kvpool.common.status import KeyStatus
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.records import (
    Commit,
    ForgetCommand,
    PersistCommand,
    PutOptions,
)
from kvpool.master.state import MasterState

KiB = 1024


def core_of(*nodes: str, reclaim_delay: float = 0.0) -> tuple[MasterCore, FakeClock]:
    clock = FakeClock()
    config = MasterConfig(reclaim_delay=reclaim_delay)
    core = MasterCore(MasterState(config, clock=clock), forget_wait=5.0, command_timeout=5.0)
    for call_id, node in enumerate(nodes):
        core.mount_segment(call_id, segment_info(node, 64 * KiB), [], False, 0.0)
        core.node_connected(node, f"stream-{node}", "process")
    return core, clock


def publish(core: MasterCore, key: str, replicas: int, call_id: int = 100) -> None:
    [slot] = core.put_start(call_id, "c", [key], [16 * KiB], PutOptions(replicas=replicas)).answers[
        call_id
    ]
    assert slot.status is KeyStatus.OK
    effects = core.put_end(call_id + 1, [Commit(key, slot.put_id, (True,) * replicas)])
    for persist in [c for c in effects.transmit if isinstance(c, PersistCommand)]:
        effects = core.node_answered(persist.node_id, persist.command_id, True)
    assert effects.answers[call_id + 1] == [KeyStatus.OK]


def nodes_of(core: MasterCore, key: str) -> set[str]:
    segments = core.state.segments
    return {segments[r.segment_id].node_id for r in core.state.objects[key].replicas}


def trimmed_replica(core: MasterCore, clock: FakeClock) -> ForgetCommand:
    """Publishes "kv" on n1 and n2, then fills n1 past its watermark: the tick's eviction
    takes kv's replica there (it keeps the one on n2). Returns that replica's Forget."""
    publish(core, "kv", replicas=2)
    [slot] = core.put_start(200, "c", ["big"], [48 * KiB], PutOptions()).answers[200]
    assert {r.segment.node_id for r in slot.replicas} == {"n1"}  # (n2 is too small for it)
    clock.advance(1.0)
    _, effects = core.tick()
    [trim] = [c for c in effects.transmit if isinstance(c, ForgetCommand)]
    assert trim.node_id == "n1" and nodes_of(core, "kv") == {"n2"}
    return trim


def two_nodes() -> tuple[MasterCore, FakeClock]:
    clock = FakeClock()
    core = MasterCore(MasterState(MasterConfig(), clock=clock), forget_wait=5.0)
    core.mount_segment(0, segment_info("n1", 64 * KiB), [], False, 0.0)
    core.mount_segment(1, segment_info("n2", 32 * KiB), [], False, 0.0)
    for node in ("n1", "n2"):
        core.node_connected(node, f"stream-{node}", "process")
    return core, clock


def test_a_removal_waits_for_the_node_whose_replica_eviction_took_earlier():
    core, clock = two_nodes()
    trim = trimmed_replica(core, clock)

    effects = core.remove(300, ["kv"], False)
    [forget] = [c for c in effects.transmit if isinstance(c, ForgetCommand)]
    assert forget.node_id == "n2"
    effects = core.node_answered("n2", forget.command_id, True)
    assert 300 not in effects.answers, "n1 still lists the object: the removal waits"

    effects = core.node_answered("n1", trim.command_id, True)
    assert effects.answers[300] == [KeyStatus.OK], "every node dropped it: the removal answers"
    core.state.validate()


def test_a_removal_waits_for_that_node_past_its_quarantine_and_no_longer_than_forget_wait():
    core, clock = two_nodes()
    trim = trimmed_replica(core, clock)
    clock.advance(5.0)
    core.timers()  # the trim's Forget is quarantined (its node is silent), not answered

    effects = core.remove(300, ["kv"], False)
    [forget] = [c for c in effects.transmit if isinstance(c, ForgetCommand)]
    effects = core.node_answered("n2", forget.command_id, True)
    assert 300 not in effects.answers, "n1 still lists the object: the removal waits"
    clock.advance(5.0)
    assert core.timers().answers[300] == [KeyStatus.OK], "answered after forget_wait"
    core.node_answered("n1", trim.command_id, True)
    core.state.validate()


def test_a_held_put_start_whose_reservation_was_removed_by_force_gets_fenced_not_its_space():
    core, _ = core_of("n1")
    publish(core, "old", replicas=1)
    [forget] = [
        c for c in core.remove(10, ["old"], False).transmit if isinstance(c, ForgetCommand)
    ]  # unanswered for now: the space of "old" stays out of writers' hands

    assert 11 not in core.put_start(11, "c", ["new"], [16 * KiB], PutOptions()).answers, (
        "its buffer lies where the node still lists the old object: it waits"
    )
    assert core.remove(12, ["new"], True).answers[12] == [KeyStatus.OK]  # while it waits

    effects = core.node_answered("n1", forget.command_id, True)
    [held] = effects.answers[11]
    assert held.status is KeyStatus.FENCED and "retry" in held.message
    assert not held.replicas, "no space handed out for a reservation that ended"
    core.state.validate()


def test_an_earlier_forget_running_out_of_time_does_not_answer_the_removal_early():
    """The trim's Forget was sent before the removal: its wait ends first. The removal waits
    on, for its own Forget (and the trim's answer), to its own deadline."""
    core, clock = two_nodes()
    trim = trimmed_replica(core, clock)
    clock.advance(2.5)
    effects = core.remove(300, ["kv"], False)
    [forget] = [c for c in effects.transmit if isinstance(c, ForgetCommand)]

    clock.advance(2.5)  # the trim's forget_wait is over, not the removal's
    assert 300 not in core.timers().answers, "its own Forget is still unanswered"
    assert 300 not in core.node_answered("n2", forget.command_id, True).answers
    effects = core.node_answered("n1", trim.command_id, True)
    assert effects.answers[300] == [KeyStatus.OK]
    core.state.validate()
