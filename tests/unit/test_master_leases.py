"""A reader that is done gives its leases back (``release_leases``), and never cuts another
reader's lease short.

A lease keeps an object from removal and eviction while a reader may still be copying it. A
reader that exits (the CLI after ``kvpool get``) no longer needs it, and an operator's ``rm``
right after should not wait out the lease. The core remembers which client leased an object
last and when every other reader's lease ends at the latest: only that client's lease can be
given back, and only down to the others'.
"""

from __future__ import annotations

from state_helpers import mount, new_state, publish

from kvpool.common.status import KeyStatus


def test_a_reader_that_gives_its_lease_back_lets_the_object_go_at_once():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")
    state.get_replicas(["k"], 10.0, client_id="reader")
    assert state.remove(["k"]) == [KeyStatus.HAS_LEASE]

    assert state.release_leases("reader", ["k"]) == 1

    assert state.remove(["k"]) == [KeyStatus.OK]


def test_another_reader_s_lease_is_never_cut_short():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k")
    state.get_replicas(["k"], 30.0, client_id="a")  # a reads until +30 s
    clock.advance(1)
    state.get_replicas(["k"], 5.0, client_id="b")  # b leases last, until +6 s

    assert state.release_leases("b", ["k"]) == 1
    assert state.remove(["k"]) == [KeyStatus.HAS_LEASE], "a's lease still holds"
    assert state.release_leases("a", ["k"]) == 0, "a did not lease last: nothing to give back"
    clock.advance(29.5)
    assert state.remove(["k"]) == [KeyStatus.OK], "a's lease ended on time"


def test_leases_taken_in_turns_keep_every_reader_covered():
    state, clock = new_state()
    mount(state, "n1")
    publish(state, "k")
    state.exists(["k"], 10.0, client_id="a")  # a until +10
    state.exists(["k"], 12.0, client_id="b")  # b until +12
    state.exists(["k"], 15.0, client_id="a")  # a again, until +15

    state.release_leases("a", ["k"])

    clock.advance(11.9)
    assert state.remove(["k"]) == [KeyStatus.HAS_LEASE], "b's lease (until +12) still holds"
    clock.advance(0.2)
    assert state.remove(["k"]) == [KeyStatus.OK]


def test_anonymous_leases_and_unknown_keys_release_nothing():
    state, _ = new_state()
    mount(state, "n1")
    publish(state, "k")
    state.get_replicas(["k"], 10.0)  # no client id

    assert state.release_leases("", ["k"]) == 0
    assert state.release_leases("someone", ["k", "missing"]) == 0
    assert state.remove(["k"]) == [KeyStatus.HAS_LEASE]
