"""How a get shares its time between the replicas it may try (client/get_path.py,
``attempt_deadline``), and how long a checked-stream connection may take to be made
(transport/checked_stream.py, ``CONNECT_TIMEOUT``): a node that drops every packet must not
take the whole call's time while another replica could serve."""

from __future__ import annotations

import socket
import time

import pytest

from kvpool.client.get_path import MIN_ATTEMPT, SLOW_RATE, attempt_deadline
from kvpool.transport import checked_stream
from kvpool.transport.checked_stream import CheckedStreams, Job, Outcome

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
    nbytes = 400 * MiB
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


@pytest.fixture
def full_listener():
    """An address whose listener never accepts and whose queue is full: a SYN to it is
    dropped, as one to a node cut off silently is."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    address = f"127.0.0.1:{server.getsockname()[1]}"
    queued = []
    for _ in range(8):  # (fill the accept queue: backlog 0 takes one or two)
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(server.getsockname())
        queued.append(sock)
    time.sleep(0.2)
    yield address
    for sock in queued:
        sock.close()
    server.close()


def test_a_connection_that_is_not_made_in_time_makes_its_node_unreachable(
    full_listener, monkeypatch
):
    monkeypatch.setattr(checked_stream, "CONNECT_TIMEOUT", 0.5)
    streams = CheckedStreams()
    try:
        job = Job(full_listener, b"grant", 0, 16, 0)  # (no connection: nothing is read)
        start = time.monotonic()
        (result,) = streams.run([job], is_get=True, deadline=time.monotonic() + 10.0)
        took = time.monotonic() - start
    finally:
        streams.close()
    assert result.outcome is Outcome.UNREACHABLE, result
    assert "no answer in 0.5 s" in result.message
    assert took < 2.0


def test_a_connect_cut_by_the_deadline_is_a_timeout(full_listener, monkeypatch):
    monkeypatch.setattr(checked_stream, "CONNECT_TIMEOUT", 5.0)
    streams = CheckedStreams()
    try:
        job = Job(full_listener, b"grant", 0, 16, 0)
        (result,) = streams.run([job], is_get=True, deadline=time.monotonic() + 0.5)
    finally:
        streams.close()
    assert result.outcome is Outcome.TIMED_OUT, result
