"""The fence on a remounted segment (master/state.py: ``mount_segment(..., remount=True,
silent=s)``), and what it must keep out.

A storage node whose process lived on mounts its segments again: at a new master after a
failover (it reconnects, or its heartbeat asks it to), or at the same master when that declared
it dead meanwhile. Writers of reservations the master no longer knows may still be copying into
that space: they got their reservations before the node last heard from a master, ``silent``
seconds ago, or from this master until it let the segment go, and they stop copying a write
timeout after they got them. So the master hands out no buffer in the segment until
``write_timeout + FENCE_MARGIN`` seconds after the later of the two: a put that finds room
nowhere else is answered FENCED (retry shortly), never NO_SPACE meanwhile. A fresh mount (a
new process: nobody can write into it yet) is not fenced.

At a new master, an earlier one may have granted writes there until the new term began, after
the node last heard from it (it lived on, cut off from the node): where the node cannot
refuse those writers (no capability carrying the old term: UCX, or clients that map its
memory), the fence counts from the term's start at least. Most tests below run at a master
whose term began longer ago than a fence (``running_state``), where only the node's silence
counts.

The last tests are gaps the model check (test_master_model.py) found, each a strict xfail
until it was closed: bytes handed out during the fence, or too early after it
(test_master_remount_gaps.py has the others).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from state_helpers import (
    CONFIG,
    FakeClock,
    MiB,
    get,
    new_state,
    publish,
    put,
    segment_info,
    segments_of,
    stored,
)

from kvpool.common.status import KeyStatus, Tier
from kvpool.master.config import MasterConfig
from kvpool.master.records import (
    CopyCommand,
    PrepareCommand,
    PutOptions,
    SegmentInfo,
)
from kvpool.master.state import FENCE_MARGIN, MasterState

#: How long a segment remounted right after its node last heard from a master stays fenced.
FENCE = CONFIG.write_timeout + FENCE_MARGIN


def running_state(config: MasterConfig = CONFIG) -> tuple[MasterState, FakeClock]:
    """A master whose term began longer ago than a fence: only its nodes' silence counts."""
    state, clock = new_state(config)
    clock.advance(config.write_timeout + FENCE_MARGIN)
    return state, clock


def fenced_put(state: MasterState, key: str = "k", size: int = 4096) -> None:
    """A put now is answered FENCED: no buffer, no reservation, a message saying to retry."""
    used = [s.allocator.used for s in state.segments.values()]
    slot = put(state, key, size)
    assert slot.status is KeyStatus.FENCED, slot
    assert slot.replicas == () and slot.put_id == 0
    assert "fenced" in slot.message and "retry" in slot.message, slot.message
    assert key not in state.objects
    assert [s.allocator.used for s in state.segments.values()] == used
    assert not [c for c in state.outbox if isinstance(c, PrepareCommand)]


@pytest.mark.parametrize("silent", [0.0, 1.0, 2.5])
def test_a_put_before_the_fence_ends_is_fenced_and_one_after_succeeds(silent):
    state, clock = running_state()
    info = segment_info("n1", 1 * MiB)
    assert state.mount_segment(info, [], remount=True, silent=silent) == []
    fenced_put(state)
    clock.advance(FENCE - silent - 0.01)
    fenced_put(state)
    clock.advance(0.01)  # write_timeout + FENCE_MARGIN - silent after the remount
    slot = put(state, "k")
    assert slot.status is KeyStatus.OK, slot
    assert segments_of(slot) == [info.segment_id]


def test_the_answer_says_how_long_the_fence_lasts():
    state, clock = running_state()
    state.mount_segment(segment_info("n1", 1 * MiB), [], remount=True, silent=1.0)
    clock.advance(0.5)
    [slot] = state.put_start("c1", ["k"], [4096])
    assert f"{FENCE - 1.5:.1f} s" in slot.message, slot.message


def test_a_fresh_mount_is_not_fenced():
    state, _ = new_state()
    state.mount_segment(segment_info("n1", 1 * MiB), [], silent=2.0)  # a new process
    assert put(state, "k").status is KeyStatus.OK


def test_a_node_silent_longer_than_the_fence_is_not_fenced():
    state, _ = running_state()
    state.mount_segment(segment_info("n1", 1 * MiB), [], remount=True, silent=FENCE)
    assert put(state, "k").status is KeyStatus.OK


def test_a_longer_write_timeout_fences_longer():
    state, clock = running_state(MasterConfig(write_timeout=10.0))
    state.mount_segment(segment_info("n1", 1 * MiB), [], remount=True, silent=1.0)
    clock.advance(10.0 + FENCE_MARGIN - 1.0 - 0.01)
    fenced_put(state)
    clock.advance(0.01)
    assert put(state, "k").status is KeyStatus.OK


def test_puts_go_to_unfenced_segments_meanwhile_and_are_fenced_once_those_are_full():
    state, clock = running_state()
    state.mount_segment(segment_info("n1", 64 * 1024), [], remount=True, silent=0.0)
    state.mount_segment(segment_info("n2", 16 * 1024))  # a new node: not fenced
    for i in range(4):  # n2 holds four; none goes to n1, nor a second replica
        [slot] = state.put_start("c1", [f"k{i}"], [4096], 2)
        assert slot.status is KeyStatus.OK, slot
        assert segments_of(slot) == ["n2/dram0"]
    fenced_put(state, "k4")  # not NO_SPACE: there is room, fenced
    clock.advance(FENCE)
    [slot] = state.put_start("c1", ["k4"], [4096], 2)
    assert segments_of(slot) == ["n1/dram0"]


def test_objects_a_remount_reports_are_readable_during_the_fence():
    state, _ = new_state()
    old, _ = new_state()  # the old master
    info = segment_info("n1", 1 * MiB)
    old.mount_segment(info)
    slot = publish(old, "k", 4096)
    reported = stored(old, "k", info.segment_id)
    assert state.mount_segment(info, [reported], remount=True, silent=0.0) == []
    location = get(state, "k")
    assert location.status is KeyStatus.OK
    assert [r.address for r in location.replicas] == [r.address for r in slot.replicas]
    fenced_put(state, "other")


def test_after_a_failover_a_heartbeat_asks_for_the_remount_which_is_fenced():
    """A master restarted (a new term, its index empty): the node's heartbeat learns its
    segments are unknown there and it mounts them again, a live process: fenced, until a
    fence after the new term began (the old master may have granted writes until then)."""
    old, clock = new_state()
    info = segment_info("n1", 1 * MiB)
    old.mount_segment(info)
    assert old.heartbeat("n1", [info.segment_id]) == []
    clock.advance(0.3)
    state = MasterState(CONFIG, clock=clock, epoch=1)
    assert state.heartbeat("n1", [info.segment_id]) == [info.segment_id]
    state.mount_segment(info, [], remount=True, silent=0.3)
    assert state.heartbeat("n1", [info.segment_id]) == []
    fenced_put(state)
    clock.advance(FENCE - 0.01)
    fenced_put(state)
    clock.advance(0.01)
    assert put(state, "k").status is KeyStatus.OK


#: A master that grants capabilities, and a node that checks them on its checked stream.
SECURE = replace(CONFIG, capability_skew=0.5)


def checked_info(
    node: str, size: int = 1 * MiB, *, shared: bool = False, tenant: str = ""
) -> SegmentInfo:
    """A DRAM segment of a node serving the checked stream, offering its memory to clients
    on its host (``shared``), holding one tenant's objects (``tenant``, its ``--tenant``): a
    secure master lets clients map only such a node's DRAM."""
    info = replace(segment_info(node, size), checked_address=f"{node}.cluster.local:7000")
    return replace(info, shared_memory=b"a mapping handover" if shared else b"", tenant=tenant)


@pytest.mark.parametrize(
    "config, info",
    [
        (CONFIG, segment_info("n1", 4096)),
        (SECURE, checked_info("n1", 4096, shared=True, tenant="t")),
    ],
    ids=["no capabilities", "clients map it"],
)
def test_a_new_leader_fences_what_the_old_one_granted_after_the_node_last_heard_from_it(
    config, info
):
    """The old leader, cut off from the node but not from writers, grants a write there after
    the node last heard from it; then it loses its term. The node remounts at the new leader,
    which never heard of that write: its writer copies on, and nothing the node checks carries
    the old term. No buffer over those bytes until that writer is done."""
    old, clock = new_state(config)
    old.mount_segment(info)
    assert old.heartbeat("n1", [info.segment_id]) == []  # the node's last contact (t = 0)
    clock.advance(2.0)
    granted = put(old, "t/old", 1000)  # its writer copies until t = 2 + write_timeout
    assert granted.status is KeyStatus.OK
    writer_done = clock.now + config.write_timeout
    clock.advance(0.5)  # the old leader's term ends; the new one begins
    state = MasterState(config, clock=clock, epoch=1)
    clock.advance(0.1)
    state.mount_segment(info, [], remount=True, silent=2.6)
    while clock.now < writer_done:
        new = put(state, f"t/new-{clock.now}", 1000)
        assert new.status is KeyStatus.FENCED, (
            f"{new.replicas} handed out at t = {clock.now}, over bytes {granted.replicas} the "
            f"old leader's writer may copy into until t = {writer_done}"
        )
        clock.advance(0.25)
    clock.advance(FENCE)
    assert put(state, "t/later", 1000).status is KeyStatus.OK


@pytest.mark.parametrize(
    "info",
    [checked_info("n1", 4096), checked_info("n1", 4096, shared=True)],
    ids=["not shared", "shared, but of any tenant: never mapped"],
)
def test_a_new_leader_fences_from_the_contact_where_every_writer_carries_a_checked_term(info):
    """Where every writer carries a capability the node checks (the checked stream, no client
    mapping the memory), the node refuses the old term's writers once it serves the new one:
    the fence counts from the node's last contact, as at the same master."""
    old, clock = new_state(SECURE)
    old.mount_segment(info)
    clock.advance(2.5)
    state = MasterState(SECURE, clock=clock, epoch=1)
    clock.advance(0.1)
    state.mount_segment(info, [], remount=True, silent=2.6)
    clock.advance(FENCE - 2.6 - 0.01)
    fenced_put(state)
    clock.advance(0.01)
    assert put(state, "k").status is KeyStatus.OK


def test_a_node_declared_dead_while_alive_remounts_fenced_when_its_heartbeat_asks():
    state, clock = new_state(replace(CONFIG, node_ttl=1.0))  # (dead before its fence ends)
    info = segment_info("n1", 1 * MiB)
    state.mount_segment(info)
    clock.advance(1.5)
    assert state.tick().dead_nodes == ["n1"]
    assert info.segment_id not in state.segments
    assert state.heartbeat("n1", [info.segment_id]) == [info.segment_id]
    state.mount_segment(info, [], remount=True, silent=1.5)
    fenced_put(state)
    clock.advance(FENCE - 1.5)
    assert put(state, "k").status is KeyStatus.OK


def test_a_segment_dropped_and_remounted_is_fenced_past_its_grants_clock_allowance():
    """Declared dead, a node's segment is dropped, not its objects forgotten: no Forget
    sealed the write grants this master made there, which the node honours its clock
    allowance past their window. (A review found the fence ended before them.)"""
    config = replace(SECURE, node_ttl=1.0, capability_skew=5.0)  # (--capability-skew-ms 5000)
    state, clock = new_state(config)
    info = checked_info("n1", 4096)
    state.mount_segment(info)
    granted = clock()
    assert put(state, "granted", 1000).status is KeyStatus.OK  # (a write grant runs now)
    clock.advance(1.5)
    assert state.tick().dead_nodes == ["n1"]
    state.heartbeat("n1", [info.segment_id])
    state.mount_segment(info, [], remount=True, silent=0.1)
    assert config.capability_skew is not None
    grant_honoured_until = granted + config.write_timeout + config.capability_skew
    tried = 0
    while clock() < grant_honoured_until:
        fenced_put(state)
        clock.advance(0.25)
        tried += 1
    assert tried >= 8


def test_no_space_once_the_fence_is_over():
    state, clock = running_state()
    state.mount_segment(segment_info("n1", 4096), [], remount=True, silent=0.0)
    fenced_put(state, "big", 8192)  # it would not fit anyway, but space is fenced
    clock.advance(FENCE)
    assert put(state, "big", 8192).status is KeyStatus.NO_SPACE


# ------------------------------------------------------------------ gaps the model found


def nvme_info(node: str, size: int = 4096) -> SegmentInfo:
    info = segment_info(node, size, f"{node}/nvme", base=0x20_0000)
    return replace(info, tier=Tier.NVME, persistent=True)


def test_a_promotion_stays_out_of_fenced_space():
    """A read of an object held only on NVMe promotes it into DRAM on its node: the copy's
    target must not be fenced space either (an old writer may overwrite the copy)."""
    state, _ = new_state()
    dram, nvme = segment_info("n1", 4096), nvme_info("n1")
    state.mount_segment(dram, [], remount=True, silent=0.0)
    old, _ = new_state()
    old.mount_segment(nvme)
    publish(old, "k", 1000, options=PutOptions(tier=Tier.NVME))
    state.mount_segment(nvme, [stored(old, "k", nvme.segment_id)], remount=True, silent=0.0)
    assert get(state, "k").status is KeyStatus.OK
    copies = [c for c in state.outbox if isinstance(c, CopyCommand)]
    assert not copies, f"a copy into fenced space: {copies}"


def test_the_fence_covers_reservations_granted_while_the_node_was_silent():
    """The master grants writes in a node's segment up to the moment it declares it dead,
    after the node last heard from it: those writers copy on after the remount's fence."""
    state, clock = new_state()
    info = segment_info("n1", 4096)
    state.mount_segment(info)  # the node last hears from the master now (t = 0)
    clock.advance(CONFIG.node_ttl - 0.1)
    old = put(state, "old", 1000)  # its writer copies until t = 4.9 + write_timeout
    assert old.status is KeyStatus.OK
    clock.advance(0.2)
    assert state.tick().dead_nodes == ["n1"]
    clock.advance(0.4)
    assert state.heartbeat("n1", [info.segment_id]) == [info.segment_id]
    state.mount_segment(info, [], remount=True, silent=CONFIG.node_ttl + 0.5)
    new = put(state, "new", 1000)
    assert new.status is KeyStatus.FENCED, (
        f"{new.replicas} handed out {CONFIG.node_ttl + 0.5} s after the node last heard from "
        f"the master, over bytes {old.replicas} a writer may copy into for "
        f"{CONFIG.write_timeout - 0.6:.1f} s more"
    )


def test_the_fence_covers_reservations_granted_between_two_heartbeats():
    """A node hears from the master once a heartbeat (1 s by default): the master may grant a
    write in its segment up to that long after the node last heard from it, and fail then.
    The fence counts from that last contact, so its margin (FENCE_MARGIN) covers a heartbeat
    interval."""
    old, clock = new_state()
    info = segment_info("n1", 4096)
    old.mount_segment(info)
    assert old.heartbeat("n1", [info.segment_id]) == []  # the node's last contact (t = 0)
    contact = clock.now
    clock.advance(0.9)
    granted = put(old, "old", 1000)  # its writer copies until t = 0.9 + write_timeout
    assert granted.status is KeyStatus.OK
    clock.advance(0.1)  # the master fails; another one takes over
    state = MasterState(CONFIG, clock=clock, epoch=1)
    state.mount_segment(info, [], remount=True, silent=1.0)
    clock.advance(FENCE - 1.0)  # the moment the fence is over
    new = put(state, "new", 1000)
    old_writer_done = clock.now - contact >= 0.9 + CONFIG.write_timeout
    assert (
        new.status is KeyStatus.FENCED
        or new.replicas[0].address != granted.replicas[0].address
        or old_writer_done
    ), "handed out the bytes an old writer may still copy into"
