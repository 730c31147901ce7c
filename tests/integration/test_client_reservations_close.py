"""What a client leaves behind when it closes, and the edges of its reservations and buffers:
reservations of ``reserve`` given back at close, a write past the write window refused for
what it is, leases whose answer was lost given back, calls after close, one buffer passed
where a list of them is asked for."""

from __future__ import annotations

import array
import signal
import threading
import time
import uuid

import numpy as np
import pytest
import torch
from helpers import wait_until

from kvpool import Client
from kvpool.errors import (
    ClientClosed,
    InvalidArgument,
    MasterUnavailable,
    ObjectHasLease,
    ObjectNotFound,
    PutAborted,
)
from kvpool.master.config import MasterConfig

#: The master's write window (``kvpool master --write-timeout``: the tests' clusters keep the
#: default).
WRITE_TIMEOUT = MasterConfig().write_timeout


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def other(shared_cluster):
    with Client(shared_cluster.master_address) as client:
        yield client


# ---------------------------------------------------------------- reservations at close


def test_closing_a_client_gives_back_its_open_reservations(shared_cluster, other):
    kept, dropped, written = fresh("open"), fresh("dropped"), fresh("written")
    client = Client(shared_cluster.master_address)
    reservation = client.reserve(kept, 5)
    client.reserve(dropped, 5)  # (its Reservation dropped at once: still given back)
    half = client.reserve(written, 4)
    half.write(b"abcd")  # (written, never committed)
    done = client.reserve(fresh("done"), 3)
    done.write(b"xyz")
    done.commit()
    client.close()
    # at once, not after the client's heartbeat or the reservation runs out
    for key, data in ((kept, b"abcde"), (dropped, b"12345"), (written, b"wxyz")):
        assert other.put(key, data) >= 1
        assert other.get(key) == data
    assert other.get(done.key) == b"xyz"  # (a committed one is left as it is)
    # the Reservation knows: revoking it is nothing to do, writing it says why not
    reservation.revoke()
    with pytest.raises(ClientClosed, match=r"reservation of .* given up with it"):
        reservation.write(b"abcde")
    with pytest.raises(ClientClosed, match="client was closed"):
        reservation.commit()


def test_reservations_of_many_threads_are_given_back_at_close(shared_cluster, other):
    client = Client(shared_cluster.master_address)
    left_open: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(10):
            key = fresh("threads")
            reservation = client.reserve(key, 8)
            reservation.write(b"01234567")
            reservation.commit()
            reservation = client.reserve(fresh("threads-revoked"), 8)
            reservation.revoke()
            key = fresh("threads-open")
            client.reserve(key, 8)
            with lock:
                left_open.append(key)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    noted = len(getattr(client._session, "_open", ()))
    client.close()
    results = other.put_many([(key, b"mine now") for key in left_open])
    assert results == [1] * len(left_open)
    assert noted == len(left_open)  # (only the open ones were noted)


# ---------------------------------------------------------------- the write window


def test_a_write_past_the_write_window_says_so_and_frees_the_key(shared_cluster, other):
    key = fresh("late")
    with Client(shared_cluster.master_address, timeout=0.5) as client:
        reservation = client.reserve(key, 4096)
        time.sleep(WRITE_TIMEOUT + 0.2)  # (the master's --write-timeout)
        began = time.monotonic()
        with pytest.raises(PutAborted, match=r"write window .* ran out .* write it sooner"):
            reservation.write(bytes(4096))
        assert time.monotonic() - began < 1.0
        assert other.put(key, b"the key is free at once") >= 1
        with pytest.raises(PutAborted, match="write window"):
            reservation.commit()
        reservation.revoke()  # (over already: nothing to do, nothing raised)
        reservation.revoke()
    assert other.get(key) == b"the key is free at once"


def test_the_write_window_is_the_master_s_not_the_reserve_call_s_timeout(shared_cluster):
    """``write`` is a call of its own: a write later than the client's timeout after
    ``reserve``, within the master's write window, is written and committed."""
    key = fresh("later")
    with Client(shared_cluster.master_address, timeout=0.5) as client:
        reservation = client.reserve(key, 5)
        time.sleep(0.8)
        reservation.write(b"later")
        assert reservation.commit() >= 1
        assert client.get(key) == b"later"


def test_an_empty_reservation_has_no_write_window(shared_cluster):
    key = fresh("empty-late")
    with Client(shared_cluster.master_address, timeout=0.3) as client:
        reservation = client.reserve(key, 0)
        time.sleep(0.4)
        assert reservation.commit() >= 1
        assert client.get(key) == b""


def test_revoking_a_reservation_whose_commit_failed_does_nothing(shared_cluster, other):
    key = fresh("failed-commit")
    with Client(shared_cluster.master_address) as client:
        reservation = client.reserve(key, 4)
        reservation.write(b"abcd")
        other.remove(key, force=True)  # (the reservation is gone at the master)
        with pytest.raises(PutAborted, match="put it again"):
            reservation.commit()
        reservation.revoke()  # (a cleanup's revoke: nothing to give back, nothing raised)
        with pytest.raises(PutAborted, match="put it again"):
            reservation.commit()
        assert not getattr(client._session, "_open", None)  # (nothing left to give back)


def test_revoking_a_reservation_the_master_no_longer_holds_does_nothing(shared_cluster, other):
    key = fresh("gone")
    with Client(shared_cluster.master_address) as client:
        reservation = client.reserve(key, 4)
        other.remove(key, force=True)
        reservation.revoke()
        with pytest.raises(InvalidArgument, match="was revoked"):
            reservation.write(b"abcd")


# ---------------------------------------------------------------- leases whose answer was lost


READS = {
    "get": lambda client, key: client.get(key),
    "exists": lambda client, key: client.exists(key),
    "get_into_many": lambda client, key: client.get_into_many([key], [bytearray(4)]),
    "get_range": lambda client, key: client.get_range(key, 0, 2),
    "get_tensor": lambda client, key: client.get_tensors([key]),
}


@pytest.mark.parametrize("call", list(READS))
def test_a_lease_whose_answer_was_lost_is_given_back_at_close(shared_cluster, other, call):
    key = fresh(call)
    reader = Client(shared_cluster.master_address, timeout=0.5)
    reader.put(key, b"data")
    reader.release_leases([key])
    assert other.stat(key).lease_remaining_ms == 0
    shared_cluster.master.signal(signal.SIGSTOP)  # (the reader's call runs out meanwhile)
    try:
        with pytest.raises(MasterUnavailable):
            READS[call](reader, key)
    finally:
        shared_cluster.master.signal(signal.SIGCONT)
    # (the master answers the call once it runs again, to no one: the lease is taken)
    assert wait_until(lambda: other.stat(key).lease_remaining_ms > 0, 5.0)
    with pytest.raises(ObjectHasLease):
        other.remove(key)
    reader.close()
    other.remove(key)  # (given back: no force needed)
    with pytest.raises(ObjectNotFound):
        other.get(key)


# ---------------------------------------------------------------- calls after close


def test_unregistering_a_buffer_after_close_raises_client_closed(shared_cluster):
    client = Client(shared_cluster.master_address)
    region = client.register_buffer(bytearray(1 << 20))
    client.close()
    with pytest.raises(ClientClosed, match="closed"):
        client.unregister_buffer(region)


# ---------------------------------------------------------------- one buffer for a list


@pytest.mark.parametrize(
    "buffer",
    [
        memoryview(bytearray(8)),
        memoryview(bytearray(1)),
        np.zeros(1, np.uint8),
        np.zeros(8, np.uint8),
        torch.zeros(8, dtype=torch.uint8),
        torch.zeros(1, dtype=torch.uint8),
        array.array("b", bytes(8)),
        bytearray(8),
    ],
    ids=lambda b: f"{type(b).__name__}",
)
def test_one_buffer_for_a_list_of_buffers_is_refused_as_such(other, buffer):
    key = fresh("one-buffer")
    other.put(key, b"abcd")
    with pytest.raises(InvalidArgument, match=r"for one key, call get_into\(key, buffer\)"):
        other.get_into_many([key], buffer)
    with pytest.raises(InvalidArgument, match=r"for one buffer, pass \[part\]"):
        other.put_parts(fresh("one-part"), buffer)
    [result] = other.get_into_parts_many([(key, buffer)])
    assert isinstance(result, InvalidArgument) and "for one buffer" in str(result)


def test_the_rows_of_one_array_are_still_a_list_of_buffers(other):
    keys = [fresh("rows") for _ in range(3)]
    other.put_many([(key, bytes([i]) * 4) for i, key in enumerate(keys)])
    rows = np.zeros((3, 4), np.uint8)
    assert other.get_into_many(keys, list(rows)) == [4, 4, 4]
    assert rows.tolist() == [[0] * 4, [1] * 4, [2] * 4]


def test_a_reserve_answered_while_its_client_closes_raises_client_closed(shared_cluster):
    """close() gives back the reservations it knows of; one whose PutStart answer comes in
    after that is not handed to its caller as if it were open: ClientClosed."""
    key = fresh("closing")
    client = Client(shared_cluster.master_address)
    link, answered = client._session.link, threading.Event()
    real_call = link.call

    def slow_answer(method, request, deadline, *args, **kwargs):
        answer = real_call(method, request, deadline, *args, **kwargs)
        if method == "PutStart":
            answered.set()
            time.sleep(0.5)  # (the answer on its way while close runs)
        return answer

    link.call = slow_answer
    outcome: dict[str, object] = {}

    def reserve() -> None:
        try:
            outcome["reservation"] = client.reserve(key, 5)
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=reserve)
    thread.start()
    assert answered.wait(10)
    client.close()
    thread.join(10)
    error = outcome.get("error")
    assert isinstance(error, ClientClosed) and key in str(error), outcome
