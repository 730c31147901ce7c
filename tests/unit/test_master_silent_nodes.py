"""A node that leaves commands unanswered gets no new objects for a while (master/state.py,
``SILENT_NODE_PAUSE``).

A node whose disk hangs keeps heartbeating (another thread, another connection), so it is
never declared dead; yet every Persist sent to it waits out the command timeout and its put
fails. Once one of its commands expires (or a Forget waits past its time), placement leaves
the node out until it answers a command or the pause ends, unless no other node could take
the object at all. Copies made for re-replication skip it as well.
"""

from __future__ import annotations

from state_helpers import FakeClock, segment_info

from kvpool.common.status import KeyStatus
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.records import Commit, PersistCommand, PutOptions
from kvpool.master.state import SILENT_NODE_PAUSE, MasterState

MiB = 1 << 20


def two_node_core() -> tuple[MasterCore, FakeClock]:
    clock = FakeClock()
    core = MasterCore(
        MasterState(MasterConfig(), clock=clock), forget_wait=1.0, command_timeout=5.0
    )
    for node in ("n1", "n2"):
        core.mount_segment(0, segment_info(node, 64 * MiB), [], False, 0.0)
        core.node_connected(node, f"{node} stream", "process")
    return core, clock


def put(core: MasterCore, call_id: int, key: str) -> tuple[str, list]:
    """Puts ``key`` (one replica); returns its node and the Persists sent."""
    [slot] = core.put_start(call_id, "c", [key], [4096], PutOptions()).answers[call_id]
    assert slot.status is KeyStatus.OK
    effects = core.put_end(call_id + 1, [Commit(key, slot.put_id, (True,))])
    persists = [c for c in effects.transmit if isinstance(c, PersistCommand)]
    return slot.replicas[0].segment.node_id, persists


def hang(core: MasterCore, clock: FakeClock, node: str) -> None:
    """Puts until one lands on ``node``, which never answers it: its Persist expires."""
    for i in range(100):
        placed, persists = put(core, 1000 + 2 * i, f"probe-{i}")
        for persist in persists:
            if placed != node:
                core.node_answered(placed, persist.command_id, True)
        if placed == node:
            clock.advance(5.0)
            core.timers()  # the Persist expires; a Forget of its space goes out...
            clock.advance(1.0)
            core.timers()  # ...and is left unanswered too: that space is quarantined
            return
    raise AssertionError(f"no put landed on {node}")


def test_after_a_command_expires_its_node_gets_no_new_objects():
    core, clock = two_node_core()
    hang(core, clock, "n1")

    placed = {put(core, 2 * i, f"k{i}")[0] for i in range(40)}
    assert placed == {"n2"}, "the silent node took objects"
    assert core.state.snapshot().silent_nodes == 1  # (the metric kvpool_silent_nodes)


def test_it_takes_objects_again_once_it_answers_a_command():
    core, clock = two_node_core()
    hang(core, clock, "n1")
    [forget] = [c for c in core.delivery._nodes["n1"].unanswered.values()]  # (the expiry's)

    core.node_answered("n1", forget.command_id, True)
    placed = {put(core, 2 * i, f"k{i}")[0] for i in range(40)}
    assert placed == {"n1", "n2"}


def test_it_takes_objects_again_after_the_pause():
    core, clock = two_node_core()
    hang(core, clock, "n1")

    clock.advance(SILENT_NODE_PAUSE)
    placed = {put(core, 2 * i, f"k{i}")[0] for i in range(40)}
    assert placed == {"n1", "n2"}


def test_a_silent_node_still_takes_objects_no_other_node_could():
    clock = FakeClock()
    core = MasterCore(
        MasterState(MasterConfig(), clock=clock), forget_wait=1.0, command_timeout=5.0
    )
    core.mount_segment(0, segment_info("n1", 64 * MiB), [], False, 0.0)
    core.node_connected("n1", "stream", "process")
    hang(core, clock, "n1")

    assert put(core, 1, "only-here")[0] == "n1", "refusing would fail every put instead"
