"""The master's own silence (its process stopped, its loop blocked) counts against no node
or writer: ``MasterState.tick``'s ``late_by``."""

from __future__ import annotations

from state_helpers import CONFIG, MiB, new_state, segment_info

TTL = CONFIG.node_ttl


def two_nodes():
    state, clock = new_state()
    n1, n2 = segment_info("n1", MiB), segment_info("n2", MiB)
    state.mount_segment(n1)
    state.mount_segment(n2)
    return state, clock, n1, n2


def test_a_master_stopped_past_the_node_ttl_declares_nobody_dead_for_it():
    state, clock, _, _ = two_nodes()
    clock.advance(3 * TTL)
    assert state.tick(late_by=3 * TTL).dead_nodes == []
    assert state.tick().dead_nodes == []


def test_a_tick_a_little_late_forgives_nothing():
    state, clock, _, _ = two_nodes()
    clock.advance(TTL + 0.4)
    assert sorted(state.tick(late_by=0.4).dead_nodes) == ["n1", "n2"]


def test_a_loop_late_at_every_tick_still_finds_a_dead_node_within_two_ttls():
    """Saturated rather than stopped: every tick a second late. Forgiving each would keep a
    dead node alive for as long as the load lasts."""
    state, clock, _, n2 = two_nodes()
    died_at = clock.now
    while "n1" in state.nodes:
        clock.advance(1.0)
        state.heartbeat("n2", [n2.segment_id])
        state.tick(late_by=0.9)
        assert clock.now - died_at <= 2 * TTL + 1.0, "n1 is still taken for alive"
    assert "n2" in state.nodes
