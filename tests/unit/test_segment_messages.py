"""The master's handlers keep each mounted segment's message for the answers that name it
(master/handlers.py); a node's DRAM segment has a new id at each start, so the messages of
segments gone are dropped once the cache is full, never kept for good."""

from __future__ import annotations

from state_helpers import new_state, segment_info

from kvpool.master import handlers as handlers_module
from kvpool.master.core import MasterCore
from kvpool.master.driver import CoreDriver
from kvpool.master.handlers import MasterHandlers


def test_messages_of_segments_gone_are_dropped_once_the_cache_is_full(monkeypatch):
    monkeypatch.setattr(handlers_module, "MAX_CACHED_SEGMENTS", 8)
    state, _ = new_state()
    handlers = MasterHandlers(CoreDriver(MasterCore(state)))
    kept = segment_info("kept", 1 << 20)
    state.mount_segment(kept)
    handlers._segment_pb(state.segments[kept.segment_id].info)
    for restart in range(50):  # a node restarted 50 times, a new DRAM segment id each
        info = segment_info("n1", 1 << 20, f"n1/dram-{restart}")
        state.mount_segment(info)
        handlers._segment_pb(state.segments[info.segment_id].info)
        handlers._unmappable_pb(state.segments[info.segment_id].info)
        state.unmount_segment("n1", info.segment_id)

    assert len(handlers._segment_pbs) <= 8
    assert len(handlers._unmappable_pbs) <= 8
    assert kept.segment_id in handlers._segment_pbs, "a mounted segment's message stays"
