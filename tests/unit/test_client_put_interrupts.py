"""A put interrupted (Ctrl-C, a signal handler's exception) once the master granted its
reservations gives them back (PutRevoke), wherever the interrupt lands before its PutEnd:
the keys are free for a put again at once, not held until the write timeout.

The client's put path (``Client._store``, ``put_path``) runs here against a stand-in for the
master link that answers as a master would and records what the client asked: the rule is
the client's, and where the interrupt lands is chosen, which a real cluster leaves to chance
(tests/integration/test_interrupted_calls.py interrupts real puts at random moments).
"""

from __future__ import annotations

import time
import types
from typing import Any

import pytest

from kvpool.client import client as client_module
from kvpool.client import put_path
from kvpool.client.buffers import readable_address
from kvpool.client.client import Client
from kvpool.client.data_path import Failure
from kvpool.client.put_path import PendingPut, WriteOptions
from kvpool.client.reservation import Reservation
from kvpool.common.status import KeyStatus
from kvpool.errors import PutAborted, TransferError
from kvpool.proto import master_pb2 as pb


class Interrupted(BaseException):
    """What a signal handler raises in the caller's thread (as KeyboardInterrupt is)."""


class Master:
    """Answers PutStart (``fenced``: those keys FENCED), PutEnd and PutRevoke; records each
    call and the keys revoked."""

    def __init__(self, fenced: tuple[str, ...] = ()) -> None:
        self.fenced = fenced
        self.calls: list[str] = []
        self.revoked: list[str] = []

    def call(self, method: str, request: Any, deadline: float) -> Any:
        self.calls.append(method)
        if method == "PutStart":
            answer = pb.PutStartResponse()
            for key in request.keys:
                if key in self.fenced:
                    answer.slots.add(status=int(KeyStatus.FENCED))
                else:
                    slot = answer.slots.add(status=int(KeyStatus.OK), put_id=42)
                    slot.replicas.add(segment_id="n1/dram0", address=0x1000)
            return answer
        if method == "PutEnd":
            return pb.PutEndResponse(statuses=[0] * len(request.commits))
        if method == "PutRevoke":
            self.revoked.extend(request.keys)
            return pb.PutRevokeResponse(statuses=[0] * len(request.keys))
        raise AssertionError(method)


def client_of(
    master: Master, interrupt_in_learn: bool = False, write_raises: BaseException | None = None
) -> Client:
    def learn(segments: Any) -> None:
        if interrupt_in_learn:
            raise Interrupted  # (PutStart's answer is in hand)

    def run(transfers: Any, is_get: bool, deadline: float) -> list[None]:
        if write_raises is not None:
            raise write_raises
        return [None] * len(transfers)

    data = types.SimpleNamespace(
        unreachable=types.SimpleNamespace(current=lambda: []),
        mapped_for=lambda writing: [],
        learn=learn,
        may_write_file=lambda segment: False,
        run=run,
    )
    client = Client.__new__(Client)
    client._session = types.SimpleNamespace(
        link=master, data=data, client_id="c", timeout=5.0, writing=lambda: None
    )
    return client


def store(client: Client, keys: list[str]) -> None:
    source = readable_address(bytes(4096))
    client._store(
        [(key, None) for key in keys],
        dict.fromkeys(range(len(keys)), source),
        [None] * len(keys),
        WriteOptions(),
        time.monotonic() + 5,
    )


def test_an_interrupt_right_after_put_start_answered_gives_the_reservation_back():
    master = Master()
    with pytest.raises(Interrupted):
        store(client_of(master, interrupt_in_learn=True), ["k"])
    assert master.calls == ["PutStart", "PutRevoke"] and master.revoked == ["k"]


def test_an_interrupt_during_the_write_gives_the_reservation_back_once():
    master = Master()
    with pytest.raises(Interrupted):
        store(client_of(master, write_raises=Interrupted()), ["k"])
    assert master.calls == ["PutStart", "PutRevoke"] and master.revoked == ["k"]


def test_a_write_failed_as_a_whole_gives_the_reservation_back_once():
    master = Master()
    with pytest.raises(TransferError):
        store(client_of(master, write_raises=TransferError("no lane to n1")), ["k"])
    assert master.calls == ["PutStart", "PutRevoke"] and master.revoked == ["k"]


def test_an_interrupt_after_the_write_before_put_end_gives_the_reservation_back(monkeypatch):
    master = Master()
    real, seen = put_path.revoke_if_cancelled, []

    def interrupted_second_time(session: Any, puts: Any) -> None:
        seen.append(1)
        if len(seen) == 2:  # (the bytes are written; PutEnd is next)
            raise Interrupted
        real(session, puts)

    monkeypatch.setattr(put_path, "revoke_if_cancelled", interrupted_second_time)
    with pytest.raises(Interrupted):
        store(client_of(master), ["k"])
    assert master.calls == ["PutStart", "PutRevoke"] and master.revoked == ["k"]


def test_an_interrupt_while_waiting_to_ask_again_for_fenced_keys_gives_the_others_back(
    monkeypatch,
):
    master = Master(fenced=("b",))

    def sleep(seconds: float) -> None:
        raise Interrupted

    monkeypatch.setattr(client_module.time, "sleep", sleep)
    with pytest.raises(Interrupted):
        store(client_of(master), ["a", "b"])
    assert master.calls == ["PutStart", "PutRevoke"] and master.revoked == ["a"]


def test_an_uninterrupted_put_revokes_nothing():
    master = Master()
    store(client_of(master), ["k"])
    assert master.calls == ["PutStart", "PutEnd"]


def reservation_cut_off(failure: Failure, master: Master) -> Reservation:
    """A reservation whose write ends past its window's end, each transfer failing with
    ``failure``."""
    session = types.SimpleNamespace(
        link=master, client_id="c", timeout=5.0, check_process=lambda: None, let_go=lambda r: None
    )
    window_end = time.monotonic() + 0.05

    def run(transfers: Any, is_get: bool, deadline: float) -> list[Any]:
        assert deadline <= window_end, "held to the window"
        time.sleep(max(0.0, deadline - time.monotonic()))
        return [failure] * len(transfers)

    session.data = types.SimpleNamespace(may_write_file=lambda segment: False, run=run)
    session.hold = lambda reservation: True
    slot = master.call("PutStart", pb.PutStartRequest(keys=["k"]), window_end).slots[0]
    master.calls.clear()
    return Reservation(session, PendingPut(0, "k", slot, None, window_end), 8, False)


def test_a_reservation_write_cut_off_by_the_end_of_its_window_says_so_and_gives_it_up():
    """A ``Reservation.write`` begun within the master's write window whose transfers ran
    past its end: PutAborted naming the window (not a transfer error that blames a node),
    and the reservation given back."""
    master = Master()
    late = Failure("transfer with segment n1/dram0 missed its deadline", timed_out=True)
    reservation = reservation_cut_off(late, master)
    with pytest.raises(PutAborted, match=r"write window .* ended before the write did"):
        reservation.write(bytes(8))
    assert master.calls == ["PutRevoke"] and master.revoked == ["k"]
    reservation.revoke()  # (over already: nothing sent)
    assert master.calls == ["PutRevoke"]


def test_a_reservation_write_refused_as_its_window_ends_says_what_the_node_said():
    master = Master()
    refused = Failure("node n1 refused the transfer: SEALED", node_id="n1")
    with pytest.raises(PutAborted) as error:
        reservation_cut_off(refused, master).write(bytes(8))
    message = str(error.value)
    assert "had ended by the time the write failed (node n1 refused" in message, message
    assert "write it sooner" not in message and master.revoked == ["k"]
