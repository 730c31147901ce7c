"""When the master's core takes clients after it starts (``MasterCore.accepting_clients``).

A new leader knows from etcd which nodes to wait for; a lone master that just started does
not know which nodes exist. It takes clients as soon as a node mounts afresh (a new cluster has
nothing to rebuild); once a node comes back from an earlier run (a remount, or a heartbeat as
its first word), it waits until no new node has come for ``rebuild_quiet``; with no node at
all, until its window ends.
"""

from __future__ import annotations

from state_helpers import FakeClock, segment_info

from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.records import StoredObject
from kvpool.master.state import MasterState


def lone_master(window: float = 5.0, quiet: float = 2.0) -> tuple[MasterCore, FakeClock]:
    clock = FakeClock()
    state = MasterState(MasterConfig(), clock=clock)
    core = MasterCore(state, awaited_nodes=None, rebuild_window=window, rebuild_quiet=quiet)
    return core, clock


def test_with_no_node_at_all_clients_wait_for_the_window():
    core, clock = lone_master()
    assert not core.accepting_clients()
    clock.advance(4.9)
    assert not core.accepting_clients()
    clock.advance(0.2)
    assert core.accepting_clients()


def test_a_fresh_cluster_takes_clients_once_a_node_mounted():
    core, _ = lone_master()
    core.mount_segment(1, segment_info("n1", 1 << 20), [], False, 0.0)
    assert core.accepting_clients()


def test_nodes_coming_back_hold_clients_until_no_new_one_came_for_the_quiet_time():
    core, clock = lone_master()
    core.heartbeat(1, "n1", ["n1/dram0"])  # an earlier run's node: it remounts next
    stored = [StoredObject("k", 0, 100, 7)]
    core.mount_segment(2, segment_info("n1", 1 << 20), stored, True, 1.0)
    assert not core.accepting_clients()
    clock.advance(1.5)
    core.mount_segment(3, segment_info("n2", 1 << 20), [], True, 1.0)  # another one
    clock.advance(1.5)
    assert not core.accepting_clients(), "n2 came 1.5 s ago"
    clock.advance(0.6)
    assert core.accepting_clients()
    assert core.state.exists(["k"], grant_lease=False)[0].name == "OK"


def test_a_new_leader_waits_for_the_nodes_etcd_lists_or_its_window():
    clock = FakeClock()
    core = MasterCore(
        MasterState(MasterConfig(), clock=clock), awaited_nodes={"n1", "n2"}, rebuild_window=5.0
    )
    core.mount_segment(1, segment_info("n1", 1 << 20), [], True, 0.0)
    assert not core.accepting_clients()
    core.mount_segment(2, segment_info("n2", 1 << 20), [], True, 0.0)
    assert core.accepting_clients()


def test_the_masters_own_silence_is_no_part_of_the_nodes_time_to_come_back():
    """A new leader stopped (its process, its host) for most of its window heard no node
    meanwhile: the window goes on for as long as it was stopped, as the tick that comes late
    says."""
    clock = FakeClock()
    core = MasterCore(
        MasterState(MasterConfig(), clock=clock), awaited_nodes={"n1"}, rebuild_window=5.0
    )
    clock.advance(4.0)
    core.tick(late_by=3.8)  # (it planned to tick 0.2 s after it began)
    clock.advance(4.0)
    core.tick()
    assert not core.accepting_clients(), "0.2 + 4.0 s of the 5 s window have passed"
    core.mount_segment(1, segment_info("n1", 1 << 20), [], True, 0.0)
    assert core.accepting_clients()


def test_a_loop_late_at_every_tick_does_not_hold_the_window_open():
    """Saturated rather than stopped: each tick comes most of a second late. The window moves
    on under the same rule that forgives the nodes (once per node TTL), or it would never
    close while the load lasts."""
    clock = FakeClock()
    core = MasterCore(
        MasterState(MasterConfig(), clock=clock), awaited_nodes={"n1"}, rebuild_window=5.0
    )
    for _ in range(12):
        clock.advance(1.0)
        core.tick(late_by=0.9)
    assert core.accepting_clients(), "n1 never came: the window must have passed"


def test_a_lone_master_takes_no_client_within_the_second_its_epoch_names():
    """A lone master's epoch is the second it started in, the top half of its put ids: a
    master restarted within that second has the same epoch, so the first gives out no put id
    before the second ends (then any successor's start second, its epoch, is a later one)."""
    clock = FakeClock()
    state = MasterState(MasterConfig(), clock=clock, epoch=1_700_000_000)
    core = MasterCore(state, awaited_nodes=None, rebuild_window=5.0, epoch_ends=clock() + 0.4)
    core.mount_segment(1, segment_info("n1", 1 << 20), [], False, 0.0)
    assert not core.accepting_clients(), "a fresh node mounted, but the second goes on"
    clock.advance(0.41)
    assert core.accepting_clients()


def test_the_epochs_second_holds_clients_even_with_no_rebuild_window():
    clock = FakeClock()
    core = MasterCore(
        MasterState(MasterConfig(), clock=clock), awaited_nodes=None, epoch_ends=clock() + 0.5
    )
    assert not core.accepting_clients()
    clock.advance(0.5)
    assert core.accepting_clients()
