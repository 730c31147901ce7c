"""A Forget its node leaves unanswered holds writers back for ``forget_wait`` at most; then its
space is quarantined and writers go elsewhere (issue: a Forget left unanswered fenced every put
for more than 80 s).

Until the node confirms it forgot an object, the space must not hold anyone else's bytes (a
new leader would adopt the old object over them). Waiting for the node stalls writers for as
long as it is silent, so after ``forget_wait`` the core keeps that space out of use instead
(allocated to the quarantine, and freed buffers in it join it) until the node answers.
"""

from __future__ import annotations

from state_helpers import FakeClock, segment_info

from kvpool.common.status import KeyStatus
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.quarantine import Quarantine
from kvpool.master.records import Commit, ForgetCommand, PersistCommand, PutOptions
from kvpool.master.state import MasterState

KiB = 1024


def one_node_core() -> tuple[MasterCore, FakeClock]:
    clock = FakeClock()
    core = MasterCore(
        MasterState(MasterConfig(), clock=clock), forget_wait=1.0, command_timeout=5.0
    )
    core.mount_segment(0, segment_info("n1", 64 * KiB), [], False, 0.0)
    core.node_connected("n1", "stream", "process")
    return core, clock


def put(core: MasterCore, call_id: int, key: str, size: int = 16 * KiB):
    effects = core.put_start(call_id, "c", [key], [size], PutOptions(replicas=1))
    return effects.answers.get(call_id), effects


def publish(core: MasterCore, key: str) -> int:
    [slot], _ = put(core, 1, key)
    effects = core.put_end(2, [Commit(key, slot.put_id, (True,))])
    [persist] = [c for c in effects.transmit if isinstance(c, PersistCommand)]
    core.node_answered("n1", persist.command_id, True)
    return slot.replicas[0].address - slot.replicas[0].segment.base_address


def test_a_silent_node_s_forget_quarantines_its_space_and_writers_go_elsewhere():
    core, clock = one_node_core()
    offset = publish(core, "old")
    effects = core.remove(10, ["old"], False)
    [forget] = [c for c in effects.transmit if isinstance(c, ForgetCommand)]  # never answered

    held, _ = put(core, 11, "new")
    assert held is None, "the freed space is where the new object would go: it waits"
    clock.advance(1.0)
    effects = core.timers()
    [fenced] = effects.answers[11]
    assert fenced.status is KeyStatus.FENCED and "retry" in fenced.message
    assert effects.answers[10] == [KeyStatus.OK], "the removal answers after its wait"

    for call_id in range(20, 23):  # later puts are answered at once, elsewhere
        [slot], _ = put(core, call_id, f"next{call_id}")
        assert slot.status is KeyStatus.OK
        start = slot.replicas[0].address - slot.replicas[0].segment.base_address
        assert start >= offset + 16 * KiB or start + 16 * KiB <= offset, "not in quarantine"
    core.state.validate()

    core.node_answered("n1", forget.command_id, True)  # at last
    core.state.validate()
    assert not core.state._quarantine
    [slot], _ = put(core, 30, "reuses")
    assert slot.status is KeyStatus.OK, "the space is back in use"


def test_a_forget_the_node_failed_is_sent_again_until_it_succeeds_and_frees_the_space():
    """A node that cannot write its index log (a full disk) answers a Forget with a failure:
    the space stays quarantined, and the master sends the Forget again, backing off, until
    the node confirms it (before, it was never sent again: the space was lost until the
    node remounted)."""
    core, clock = one_node_core()
    publish(core, "old")
    effects = core.remove(10, ["old"], False)
    [forget] = [c for c in effects.transmit if isinstance(c, ForgetCommand)]

    effects = core.node_answered("n1", forget.command_id, False)  # disk full
    assert any("sent again later" in note for note, _ in effects.notes)
    clock.advance(1.0)
    effects = core.timers()
    assert effects.answers[10] == [KeyStatus.OK], "the removal answers after its wait"
    assert forget in effects.transmit, "sent again after FORGET_RETRY_FIRST"
    assert core.state._quarantine, "its space stays out of use meanwhile"

    core.node_answered("n1", forget.command_id, False)  # still full: waits twice as long
    clock.advance(1.5)
    assert forget not in core.timers().transmit
    clock.advance(0.5)
    assert forget in core.timers().transmit
    assert core.next_deadline() is None or core.next_deadline() > clock()

    core.node_answered("n1", forget.command_id, True)  # room again
    core.state.validate()
    assert not core.state._quarantine
    clock.advance(60.0)
    assert forget not in core.timers().transmit, "nothing more once it succeeded"
    [slot], _ = put(core, 30, "reuses")
    assert slot.status is KeyStatus.OK


def test_a_segment_s_failed_forgets_are_probed_one_at_a_time_and_sent_together_after():
    """A full disk fails every Forget of the segment alike: one of them goes again as a
    probe, and once it succeeds the others go at once (not a command per Forget every few
    seconds for as long as the disk stays full)."""
    core, clock = one_node_core()
    for key in ("a", "b", "c"):
        publish(core, key)
    forgets = [  # (one removal each: one Forget each)
        c
        for n, key in enumerate(("a", "b", "c"))
        for c in core.remove(10 + n, [key], False).transmit
        if isinstance(c, ForgetCommand)
    ]
    assert len(forgets) == 3
    for forget in forgets:
        core.node_answered("n1", forget.command_id, False)

    clock.advance(1.0)
    [probe] = [c for c in core.timers().transmit if isinstance(c, ForgetCommand)]
    core.node_answered("n1", probe.command_id, False)
    clock.advance(1.0)
    assert not [c for c in core.timers().transmit if isinstance(c, ForgetCommand)], "2 s now"
    clock.advance(1.0)
    [probe] = [c for c in core.timers().transmit if isinstance(c, ForgetCommand)]

    effects = core.node_answered("n1", probe.command_id, True)
    rest = [c for c in effects.transmit if isinstance(c, ForgetCommand)]
    assert sorted(c.command_id for c in [probe, *rest]) == sorted(c.command_id for c in forgets)
    for forget in rest:
        core.node_answered("n1", forget.command_id, True)
    core.state.validate()
    assert not core.state._quarantine and not core._forget_retries
    assert core._forget_retries.next_deadline() is None


def test_a_failed_forget_is_not_sent_again_to_a_segment_mounted_anew_under_its_id():
    """A node restarted (a new process, a new mapping) mounts the segment again under the
    same id: the mount reconciles what it holds itself. The old mount's Forget, sent after
    that, could name an object copied since to the same place and generation."""
    core, clock = one_node_core()
    publish(core, "old")
    [forget] = [c for c in core.remove(10, ["old"], False).transmit if isinstance(c, ForgetCommand)]
    core.node_answered("n1", forget.command_id, False)
    before = core.state.segments["n1/dram0"]

    core.mount_segment(11, segment_info("n1", 64 * KiB, base=0x20_0000), [], True, 0.0)
    core.node_connected("n1", "stream 2", "process 2")
    assert core.state.segments["n1/dram0"] is not before, "(a new record for the new mount)"
    clock.advance(60.0)
    assert forget not in core.timers().transmit
    assert not core._forget_retries


def test_a_failed_forget_of_a_segment_that_went_is_not_sent_again():
    core, clock = one_node_core()
    publish(core, "old")
    [forget] = [c for c in core.remove(10, ["old"], False).transmit if isinstance(c, ForgetCommand)]
    core.node_answered("n1", forget.command_id, False)
    core.unmount_segment(11, "n1", "n1/dram0")
    clock.advance(1.0)
    assert forget not in core.timers().transmit


def test_a_buffer_freed_later_inside_quarantined_space_stays_out_of_use():
    """A leased object's replica dropped by force: its space is freed when the lease ends,
    which may come after the Forget was quarantined: it joins the quarantine then."""
    core, clock = one_node_core()
    publish(core, "read")
    core.get_replicas(5, ["read"], 30.0)
    effects = core.remove(6, ["read"], True)  # freed only when the lease ends
    [forget] = [c for c in effects.transmit if isinstance(c, ForgetCommand)]
    clock.advance(1.0)
    core.timers()  # quarantined while the buffer is still the lease's
    for _ in range(31):  # the lease ends (the node heartbeats meanwhile)
        clock.advance(1.0)
        core.heartbeat(7, "n1", ["n1/dram0"])
    core.tick()  # the buffer is freed... into the quarantine
    allocator = core.state.segments["n1/dram0"].allocator
    assert allocator.used >= allocator.rounded(16 * KiB), "still out of use"
    core.state.validate()

    core.node_answered("n1", forget.command_id, True)
    assert allocator.used == 0


def test_space_two_unanswered_forgets_name_stays_out_of_use_until_both_are_answered():
    """An object's Forget and, later, a copy's that landed in the same space (both
    quarantined while the node was silent): the first answer leaves the space held by the
    second (found by the core's model check, a node declared dead and re-replication)."""
    state = MasterState(MasterConfig(), clock=FakeClock())
    state.mount_segment(segment_info("n1", 64 * KiB))
    segment = state.segments["n1/dram0"]
    quarantine = Quarantine()
    quarantine.add(1, segment, [(0, 16 * KiB)])  # the object's Forget
    quarantine.add(2, segment, [(0, 16 * KiB)])  # the copy's, into the same space

    quarantine.release(1)
    assert segment.allocator.allocate_at(0, 16 * KiB) is False, "still held by the second"
    quarantine.release(2)
    assert segment.allocator.allocate_at(0, 16 * KiB) is True, "both answered: back in use"


def test_a_buffer_overlapping_any_held_range_is_kept_wherever_that_range_starts():
    # (held ranges are found by start: a long one starting well before the buffer counts)
    state = MasterState(MasterConfig(), clock=FakeClock())
    state.mount_segment(segment_info("n1", 256 * KiB), [])
    segment = state.segments[next(iter(state.segments))]
    allocator = segment.allocator
    quarantine = Quarantine()
    for offset in (0, 96 * KiB, 112 * KiB, 128 * KiB):  # (in use: joins when freed)
        assert allocator.allocate_at(offset, 16 * KiB)
    quarantine.add(1, segment, [(0, 64 * KiB)])  # long, starting far before 48 KiB
    quarantine.add(2, segment, [(i * KiB, (i + 4) * KiB) for i in range(64, 96, 4)])

    assert quarantine.claim(segment, 0), "inside the long range"
    assert not quarantine.claim(segment, 96 * KiB), "after every range"
    quarantine.release(2)
    assert allocator.allocate_at(64 * KiB, 32 * KiB), "the second's space came back whole"
    assert not quarantine.claim(segment, 112 * KiB)
    quarantine.release(1)
    assert allocator.allocate_at(16 * KiB, 48 * KiB), "the free part of the first came back"
    assert allocator.allocate_at(0, 16 * KiB), "and the buffer it kept"


def test_releasing_many_forgets_of_many_objects_frees_every_buffer_once():
    # (the audit's burst: Forgets of thousands of objects each, answered late; every buffer
    # freed meanwhile asks the quarantine, and each release hands its buffers back)
    state = MasterState(MasterConfig(), clock=FakeClock())
    state.mount_segment(segment_info("n1", 64 << 20), [])
    segment = state.segments[next(iter(state.segments))]
    allocator = segment.allocator
    quarantine = Quarantine()
    size, count = 4 * KiB, 1024
    for forget in range(4):
        base = forget * count * size
        for i in range(count):  # (half in use: they join the quarantine when freed)
            if i % 2:
                assert allocator.allocate_at(base + i * size, size)
        quarantine.add(
            forget, segment, [(base + i * size, base + (i + 1) * size) for i in range(count)]
        )
    for forget in range(4):
        base = forget * count * size
        assert all(quarantine.claim(segment, base + i * size) for i in range(1, count, 2))
    for forget in range(4):
        quarantine.release(forget)
    assert len(quarantine) == 0 and quarantine.buffers() == []
    assert allocator.free_extents() == [(0, 64 << 20)]
