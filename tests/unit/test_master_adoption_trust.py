"""What a node's report cannot do to objects the master knows (master/state.py's ``_adopt``).

A node is trusted with its own node id and what it holds, not with other nodes' objects: a
report claiming a newer generation of a key the master serves from elsewhere would take that
key over (readers sent to the reporting node, the real replicas forgotten). So:

- a generation of this master's own term never supersedes a published object: the master
  made that put and never published it over the one it knows;
- no generation supersedes an object this master published itself, of a term ahead
  included: keys are written once, so a later put of the key went through this master;
- a generation of a term too far ahead (EPOCHS_AHEAD) is refused outright: put ids go on
  from the largest adopted and would run out;
- an older term's newer generation still supersedes (a node back late with a newer copy
  from before a failover), as before.
"""

from __future__ import annotations

from state_helpers import CONFIG, FakeClock, get, mount, publish, segment_info

from kvpool.common.status import KeyStatus
from kvpool.master.records import StoredObject
from kvpool.master.state import EPOCHS_AHEAD, MasterState

EPOCH = 1_700_000_000


def serving_state() -> tuple[MasterState, int]:
    """A master of epoch EPOCH serving key k, published on n1; n2 mounted empty."""
    state = MasterState(CONFIG, clock=FakeClock(), epoch=EPOCH)
    mount(state, "n1")
    slot = publish(state, "k", 4096)
    state.outbox.clear()
    return state, slot.put_id


def report(state: MasterState, generation: int) -> None:
    """n2 mounts a segment whose index claims key k at ``generation``."""
    info = segment_info("n2", 1 << 20)
    state.mount_segment(info, [StoredObject("k", 0, 4096, generation)])


def test_a_report_of_this_terms_generation_does_not_take_over_a_published_key():
    state, put_id = serving_state()
    report(state, put_id + 1000)

    location = get(state, "k")
    assert location.status is KeyStatus.OK
    assert state.objects["k"].generation == put_id
    assert [p.segment.node_id for p in location.replicas] == ["n1"]


def test_a_report_of_a_term_ahead_does_not_take_over_a_key_this_master_published():
    # (the audit's attack: a node token, a term one hour ahead, within EPOCHS_AHEAD)
    state, put_id = serving_state()
    report(state, (EPOCH + 3600) << 32)

    location = get(state, "k")
    assert state.objects["k"].generation == put_id
    assert [p.segment.node_id for p in location.replicas] == ["n1"]


def test_a_report_of_a_term_too_far_ahead_is_refused_and_put_ids_do_not_jump():
    state, put_id = serving_state()
    report(state, (EPOCH + EPOCHS_AHEAD + 1) << 32)

    assert state.objects["k"].generation == put_id
    assert [p.segment.node_id for p in get(state, "k").replicas] == ["n1"]
    assert publish(state, "k2", 4096).put_id >> 32 == EPOCH, "put ids stay in this term"


def test_a_newer_copy_from_an_earlier_term_still_supersedes():
    # (the object the master knows came from a report too: a failover adopted it)
    state = MasterState(CONFIG, clock=FakeClock(), epoch=EPOCH)
    state.mount_segment(segment_info("n1", 1 << 20), [StoredObject("k", 0, 4096, 5)])
    assert state.objects["k"].generation == 5

    report(state, (EPOCH - 1) << 32 | 7)  # written by the previous master, after 5

    assert state.objects["k"].generation == (EPOCH - 1) << 32 | 7
    assert [p.segment.node_id for p in get(state, "k").replicas] == ["n2"]
