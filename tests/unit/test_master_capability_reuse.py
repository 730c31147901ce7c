"""With capabilities, space goes to another object only once no node honours a grant for it.

A storage node accepts a writer's capability until its expiry (``write_timeout`` after
PutStart) plus the clock allowance (``capability_skew``), unless it has recorded the object
since (then it refuses it), and a reader's until its lease ends plus the allowance. A writer
that revoked or failed its reservation still holds a valid capability until then: the master
must not hand the bytes to another object before it has run out (security/capabilities.py).
"""

from __future__ import annotations

import dataclasses

from state_helpers import (
    CONFIG,
    KiB,
    commit,
    get,
    mount,
    new_state,
    publish,
    put,
    remove,
    segment_info,
)

from kvpool.common.status import KeyStatus

SKEW = 1.0
# (no eviction: the one buffer stays full while time passes)
WITH_CAPABILITIES = dataclasses.replace(CONFIG, capability_skew=SKEW, high_watermark=1.0)
#: How long after PutStart a writer's grant may still be honoured.
WRITE_GRANT = CONFIG.write_timeout + SKEW


def wait(state, clock, seconds: float) -> None:
    """Lets ``seconds`` pass, the node heartbeating, the master ticking."""
    while seconds > 0:
        step = min(1.0, seconds)
        clock.advance(step)
        seconds -= step
        state.heartbeat("n1", ["n1/dram0"])
        state.tick()


def one_buffer_state(config=WITH_CAPABILITIES):
    state, clock = new_state(config)
    # room for one 4 KiB object: reuse is visible at once; the node serves a checked stream
    # (only its transfers carry capabilities)
    info = segment_info("n1", 4 * KiB)
    state.mount_segment(dataclasses.replace(info, checked_address="127.0.0.1:7000"))
    return state, clock


def test_a_revoked_reservation_s_space_waits_for_its_write_grant_to_end():
    state, clock = one_buffer_state()
    slot = put(state, "a")
    assert state.put_revoke(["a"], [slot.put_id]) == [KeyStatus.OK]
    assert put(state, "b").status is KeyStatus.NO_SPACE, "the revoker may still write there"
    wait(state, clock, WRITE_GRANT)
    assert put(state, "b").status is KeyStatus.OK


def test_a_failed_write_s_space_waits_for_its_write_grant_to_end():
    state, clock = one_buffer_state()
    slot = put(state, "a")
    assert commit(state, "a", slot, False) is KeyStatus.NO_REPLICA
    assert put(state, "b").status is KeyStatus.NO_SPACE
    wait(state, clock, WRITE_GRANT)
    assert put(state, "b").status is KeyStatus.OK


def test_a_published_object_s_space_is_reused_at_once_its_nodes_sealed_the_write_grant():
    """Its nodes recorded it before it was published: from then on they refuse its writer's
    grant (storage_node/checked_server.py, Seals), so nothing waits for that grant."""
    state, _ = one_buffer_state()
    publish(state, "a")
    assert remove(state, "a") is KeyStatus.OK
    assert put(state, "b").status is KeyStatus.OK


def test_a_read_grant_holds_the_space_for_the_clock_allowance_after_its_lease():
    state, clock = one_buffer_state()
    publish(state, "a")
    wait(state, clock, WRITE_GRANT)
    get(state, "a", lease_ttl=2.0)
    wait(state, clock, 2.0)  # the lease ended
    assert remove(state, "a") is KeyStatus.OK
    assert put(state, "b").status is KeyStatus.NO_SPACE, "a reader may still read for SKEW"
    wait(state, clock, SKEW)
    assert put(state, "b").status is KeyStatus.OK


def test_without_a_checked_stream_space_is_reused_as_before():
    state, _ = new_state(WITH_CAPABILITIES)
    mount(state, "n1", 4 * KiB)  # UCX only: no transfer there carries a grant
    slot = put(state, "a")
    assert state.put_revoke(["a"], [slot.put_id]) == [KeyStatus.OK]
    assert put(state, "b").status is KeyStatus.OK


def test_without_capabilities_space_is_reused_as_before():
    state, _ = one_buffer_state(CONFIG)
    slot = put(state, "a")
    assert state.put_revoke(["a"], [slot.put_id]) == [KeyStatus.OK]
    assert put(state, "b").status is KeyStatus.OK
