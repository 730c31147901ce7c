"""How a get shares its time between the replicas it may try (client/get_path.py,
``attempt_deadline``): a node that drops every packet must not take the whole call's time
while another replica could serve, and a healthy but slow one must not be cut short."""

from __future__ import annotations

import pytest

from kvpool.client.get_path import MIN_ATTEMPT, SLOW_RATE, attempt_deadline

MiB = 1 << 20


def test_the_last_replica_gets_all_the_time_left():
    assert attempt_deadline(100.0, 108.0, 200.0, 1, 1 << 30) == 108.0


def test_a_replica_with_others_left_gets_its_share():
    assert attempt_deadline(100.0, 108.0, 200.0, 2, 4096) == pytest.approx(104.0)
    assert attempt_deadline(100.0, 112.0, 200.0, 3, 4096) == pytest.approx(104.0)


def test_no_attempt_runs_past_the_lease():
    assert attempt_deadline(100.0, 108.0, 104.0, 1, 4096) == 104.0
    # the share is of the time until the lease ends
    assert attempt_deadline(100.0, 108.0, 104.0, 2, 4096) == pytest.approx(102.0)
    assert attempt_deadline(100.0, 108.0, 101.0, 2, 100 * MiB) == 101.0


def test_a_share_is_never_below_the_floor_the_time_left_allows():
    # a small read: at least MIN_ATTEMPT
    assert attempt_deadline(100.0, 101.5, 200.0, 2, 4096) == pytest.approx(
        100.0 + MIN_ATTEMPT + 4096 / SLOW_RATE
    )
    # a large one: the time its bytes take at SLOW_RATE, and MIN_ATTEMPT more
    nbytes = 8 * MiB
    floor = MIN_ATTEMPT + nbytes / SLOW_RATE
    assert attempt_deadline(100.0, 108.0, 200.0, 2, nbytes) == pytest.approx(100.0 + floor)
    # too large for a share: all the time left, as if it were the last replica
    assert attempt_deadline(100.0, 104.0, 200.0, 2, nbytes) == 104.0


def test_no_time_left_gives_the_end():
    assert attempt_deadline(110.0, 108.0, 200.0, 2, 4096) == 108.0


def test_shares_leave_the_last_replica_time():
    """However the replicas' attempts run out, each leaves time for the next."""
    now, deadline = 0.0, 10.0
    for left in (3, 2):
        until = attempt_deadline(now, deadline, 100.0, left, 4096)
        assert until < deadline
        now = until
    assert attempt_deadline(now, deadline, 100.0, 1, 4096) == deadline


def test_a_read_of_many_bytes_gets_the_whole_budget_rather_than_be_cut():
    """128 MiB over a healthy link slower than 100 MiB/s (a shared 1 GbE) takes seconds: a
    share of a 10 s budget would fail it, and mark its healthy node."""
    assert attempt_deadline(100.0, 110.0, 200.0, 2, 128 * MiB) == 110.0
