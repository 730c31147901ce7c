"""With capabilities, space goes to another object at its node's answer to a Forget.

A storage node honours a writer's capability until its expiry (``write_timeout`` after
PutStart) plus the clock allowance (``capability_skew``), a reader's until its lease ends
plus the allowance. Waiting that long before reusing the space starved a store kept full
(issue 17). Instead, whenever the master drops an object or a reservation on a node that
serves the checked stream (revoked, failed write, timed out, removed, evicted) it sends that
node a Forget for the range; the node seals every grant for it and interrupts transfers in
flight under them before it answers (storage_node/checked_seals.py), and a writer gets the
space only after that answer (the forget barrier). A node that does not answer keeps the
space out of use until it does (quarantine), whatever the grants' expiry.
"""

from __future__ import annotations

import dataclasses

from state_helpers import FakeClock, KiB, segment_info

from kvpool.common.status import WRITER_HOLDS_RANGE, KeyStatus
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.records import Commit, ForgetCommand, PersistCommand, PutOptions
from kvpool.master.state import MasterState

SKEW = 1.0
# (no eviction: the one buffer stays full while time passes)
WITH_CAPABILITIES = MasterConfig(capability_skew=SKEW, high_watermark=1.0)
SIZE = 4 * KiB


def one_buffer_core(
    config: MasterConfig = WITH_CAPABILITIES, checked: bool = True
) -> tuple[MasterCore, FakeClock]:
    """Room for one 4 KiB object (reuse is visible at once) on a node that serves a checked
    stream (only its transfers carry capabilities)."""
    clock = FakeClock()
    core = MasterCore(MasterState(config, clock=clock), forget_wait=1.0, command_timeout=5.0)
    info = segment_info("n1", SIZE)
    if checked:
        info = dataclasses.replace(info, checked_address="127.0.0.1:7000")
    core.mount_segment(0, info, [], False, 0.0)
    core.node_connected("n1", "stream", "process")
    return core, clock


_calls = iter(range(100, 1 << 30))


def put(core: MasterCore, key: str):
    """(the slot, or None while the put waits for a Forget's answer; its call id)"""
    call_id = next(_calls)
    effects = core.put_start(call_id, "c", [key], [SIZE], PutOptions(replicas=1))
    answer = effects.answers.get(call_id)
    return (answer[0] if answer is not None else None), call_id


def forgets(effects) -> list[ForgetCommand]:
    return [c for c in effects.transmit if isinstance(c, ForgetCommand)]


def answer(core: MasterCore, forget: ForgetCommand, held_call: int):
    """The node answers the Forget: the held put is answered now."""
    [slot] = core.node_answered("n1", forget.command_id, True).answers[held_call]
    return slot


def publish(core: MasterCore, key: str) -> None:
    slot, _ = put(core, key)
    effects = core.put_end(next(_calls), [Commit(key, slot.put_id, (True,))])
    [persist] = [c for c in effects.transmit if isinstance(c, PersistCommand)]
    core.node_answered("n1", persist.command_id, True)


def test_a_revoked_reservation_s_space_is_reused_at_its_node_s_answer_not_its_grant_s_end():
    core, _ = one_buffer_core()
    slot, _ = put(core, "a")
    effects = core.put_revoke(next(_calls), ["a"], [slot.put_id])
    [forget] = forgets(effects)  # (the node never heard of the reservation: it seals anyway)
    assert [(o.offset, o.generation) for o in forget.objects] == [(0, slot.put_id)]
    held, call_id = put(core, "b")
    assert held is None, "the revoker may still be writing: the node must stop it first"
    assert answer(core, forget, call_id).status is KeyStatus.OK


def test_a_failed_write_s_space_is_reused_at_its_node_s_answer():
    core, _ = one_buffer_core()
    slot, _ = put(core, "a")
    effects = core.put_end(next(_calls), [Commit("a", slot.put_id, (False,))])
    [forget] = forgets(effects)
    held, call_id = put(core, "b")
    assert held is None
    assert answer(core, forget, call_id).status is KeyStatus.OK


def test_a_removed_object_s_space_is_reused_at_its_node_s_answer():
    core, _ = one_buffer_core()
    publish(core, "a")
    [forget] = forgets(core.remove(next(_calls), ["a"], False))
    held, call_id = put(core, "b")
    assert held is None
    assert answer(core, forget, call_id).status is KeyStatus.OK


def test_a_read_lease_holds_the_space_until_it_ends_and_no_clock_allowance_after():
    core, clock = one_buffer_core()
    publish(core, "a")
    core.get_replicas(next(_calls), ["a"], 2.0)
    [forget] = forgets(core.remove(next(_calls), ["a"], True))
    core.node_answered("n1", forget.command_id, True)
    assert put(core, "b")[0].status is KeyStatus.NO_SPACE, "its reader's lease still runs"
    clock.advance(2.0)
    core.heartbeat(next(_calls), "n1", ["n1/dram0"])
    core.tick()
    assert put(core, "b")[0].status is KeyStatus.OK, "the lease ended: no wait for SKEW"


def test_a_timed_out_reservation_gets_a_forget_too():
    core, clock = one_buffer_core()
    put(core, "a")
    clock.advance(core.state.config.reservation_timeout + 0.1)
    core.heartbeat(next(_calls), "n1", ["n1/dram0"])
    _, effects = core.tick()
    assert len(forgets(effects)) == 1


def test_a_silent_node_keeps_the_space_out_of_use_past_every_grant_s_end():
    """The fallback: a node that never answers may still honour the grant (or list the
    object): the space stays quarantined until it answers, however long."""
    core, clock = one_buffer_core()
    slot, _ = put(core, "a")
    [forget] = forgets(core.put_revoke(next(_calls), ["a"], [slot.put_id]))
    for _ in range(int(core.state.config.write_timeout + SKEW) + 2):
        clock.advance(1.0)
        core.heartbeat(next(_calls), "n1", ["n1/dram0"])
        core.tick()
    assert put(core, "b")[0].status is not KeyStatus.OK, "quarantined: no one writes there"
    core.node_answered("n1", forget.command_id, True)
    assert put(core, "c")[0].status is KeyStatus.OK


def test_without_a_checked_stream_space_is_reused_as_before():
    core, _ = one_buffer_core(checked=False)  # UCX only: no transfer there carries a grant
    slot, _ = put(core, "a")
    assert not forgets(core.put_revoke(next(_calls), ["a"], [slot.put_id]))
    assert put(core, "b")[0].status is KeyStatus.OK


def test_without_capabilities_space_is_reused_as_before():
    core, _ = one_buffer_core(MasterConfig(high_watermark=1.0))
    slot, _ = put(core, "a")
    assert not forgets(core.put_revoke(next(_calls), ["a"], [slot.put_id]))
    assert put(core, "b")[0].status is KeyStatus.OK


def mapped_core(config: MasterConfig) -> tuple[MasterCore, FakeClock]:
    """One buffer on a segment that clients on its host write themselves (``shared_memory``):
    no checked stream."""
    clock = FakeClock()
    core = MasterCore(MasterState(config, clock=clock), forget_wait=1.0, command_timeout=5.0)
    info = dataclasses.replace(segment_info("n1", SIZE), shared_memory=b"mappable")
    core.mount_segment(0, info, [], False, 0.0)
    core.node_connected("n1", "stream", "process")
    return core, clock


def test_a_segment_written_by_same_host_clients_gets_a_forget_with_or_without_capabilities():
    """Its node answers once no same-host writer holds a lock on the range
    (storage_node/commands.py): a writer stopped mid-copy cannot land in the next object."""
    for config in (WITH_CAPABILITIES, MasterConfig(high_watermark=1.0)):
        core, _ = mapped_core(config)
        slot, _ = put(core, "a")
        [forget] = forgets(core.put_revoke(next(_calls), ["a"], [slot.put_id]))
        held, call_id = put(core, "b")
        assert held is None, "a same-host writer may still be copying there"
        assert answer(core, forget, call_id).status is KeyStatus.OK


def test_a_forget_failed_for_a_writer_still_copying_keeps_the_space_until_one_succeeds():
    """Quarantined at once (no wait for ``forget_wait``), the node not paused for new
    objects (it answers its commands), and the Forget sent again on its own schedule."""
    core, clock = mapped_core(MasterConfig(high_watermark=1.0, reclaim_delay=1.0))
    slot, _ = put(core, "a")
    [forget] = forgets(core.put_revoke(next(_calls), ["a"], [slot.put_id]))
    held, call_id = put(core, "b")
    assert held is None, "held by the Forget"
    error = f"TimeoutError: {WRITER_HOLDS_RANGE} a lock on the range"
    effects = core.node_answered("n1", forget.command_id, False, error=error)
    [fenced] = effects.answers[call_id]
    assert fenced.status is KeyStatus.FENCED, "the held writer asks again, for other space"
    assert not core.state._silent_nodes(clock()), "the node answered: not paused"
    [of_b] = forgets(effects)  # (b's slot, revoked, lay in the same range)
    assert core.node_answered("n1", of_b.command_id, False, error=error).answers == {}
    probes = []
    for _ in range(4):  # (past the Forget's wait and the reclaim delay)
        clock.advance(1.0)
        core.heartbeat(next(_calls), "n1", ["n1/dram0"])
        probes += forgets(core.tick()[1]) + forgets(core.timers())
        assert put(core, "b")[0].status is not KeyStatus.OK, "the writer may still copy there"
    assert probes, "the Forget is sent again"
    effects = core.node_answered("n1", probes[-1].command_id, True)  # (the writer let go)
    for again in forgets(effects):  # (the others waiting go at once)
        core.node_answered("n1", again.command_id, True)
    assert put(core, "c")[0].status is KeyStatus.OK


def test_a_reservation_removed_by_force_gets_a_forget_again_once_its_writers_window_is_over():
    """Removed while its writer may not have begun: the writer may still lock the range and
    copy, within its window, after the node answered the first Forget. So its space is
    freed only after the window, with a Forget then, which the next writer waits for."""
    config = MasterConfig(high_watermark=1.0, reclaim_delay=1.0, write_timeout=3.0)
    core, clock = mapped_core(config)
    put(core, "a")
    [first] = forgets(core.remove(next(_calls), ["a"], True))
    core.node_answered("n1", first.command_id, True)
    late = []
    for _ in range(3):  # (past the reclaim delay, within the window)
        clock.advance(1.0)
        core.heartbeat(next(_calls), "n1", ["n1/dram0"])
        late += forgets(core.tick()[1])
        assert put(core, "b")[0].status is KeyStatus.NO_SPACE, "the window is not over"
    clock.advance(1.0)
    core.heartbeat(next(_calls), "n1", ["n1/dram0"])
    late += forgets(core.tick()[1])
    assert [(f.objects[0].key, f.objects[0].offset) for f in late] == [("a", 0)]
    held, call_id = put(core, "b")
    assert held is None, "the next writer waits for the node's answer"
    assert answer(core, late[0], call_id).status is KeyStatus.OK


def test_a_forget_says_when_the_grants_for_its_segment_end():
    """What the node keeps its seal for (storage_node/checked_seals.py): the latest grant
    this master made on the segment, the clock allowance included."""
    core, clock = one_buffer_core()
    state = core.state
    segment_id = next(iter(state.segments))
    assert state.grants_end(segment_id) == clock(), "no grant runs: the seal may go at once"
    state.capabilities_until[segment_id] = clock() + 10 + SKEW  # (a 10 s lease granted now)
    assert state.grants_end(segment_id) == clock() + 10 + SKEW
    assert state.grants_end("another segment") == clock()


def test_a_master_that_grants_nothing_says_the_grants_end_now():
    config = dataclasses.replace(WITH_CAPABILITIES, capability_skew=None)
    core, clock = one_buffer_core(config)
    assert core.state.grants_end(next(iter(core.state.segments))) == clock()
