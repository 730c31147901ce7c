"""A put whose commit (PutEnd) went unanswered says that its outcome is unknown
(PutOutcomeUnknown, a MasterUnavailable): the master may have published the object, or may
yet, as a commit that reached its host is still read. A failure before PutEnd keeps its own
error. And a lane call that fails before its answer resets its connection, so that a request
still queued in it is dropped rather than delivered after the caller was told it failed.

The put path runs against a stand-in for the master link (as in test_client_put_interrupts);
the lane's end against a plain socket standing in for the master
(tests/integration/test_put_outcome_unknown.py stops a real master).
"""

from __future__ import annotations

import socket
import threading
import time
import types
from typing import Any

import pytest

from kvpool.client import batch_split
from kvpool.client.buffers import readable_address
from kvpool.client.client import Client
from kvpool.client.lane_client import LaneClient, LaneError
from kvpool.client.put_path import PendingPut, WriteOptions
from kvpool.client.reservation import Reservation
from kvpool.common import lane_protocol as lp
from kvpool.common.status import KeyStatus
from kvpool.errors import (
    MasterNotTrusted,
    MasterUnavailable,
    NoSpace,
    PutOutcomeUnknown,
    TransferError,
)
from kvpool.proto import master_pb2 as pb

NOT_ANSWERED = (
    "master m:1 did not answer PutEnd before the deadline (m:1: DEADLINE_EXCEEDED: the lane "
    "did not answer in time). Check that `kvpool master` runs there and is reachable, or "
    "raise the client's timeout."
)


class Master:
    """Answers PutStart and PutRevoke; PutEnd raises ``end_fails`` (its first ``times``)."""

    def __init__(
        self,
        end_fails: MasterUnavailable | None = None,
        start_fails: MasterUnavailable | None = None,
        times: int = 1,
    ) -> None:
        self.end_fails, self.start_fails, self.times = end_fails, start_fails, times
        self.calls: list[str] = []

    def call(self, method: str, request: Any, deadline: float) -> Any:
        self.calls.append(method)
        if method == "PutStart":
            if self.start_fails is not None:
                raise self.start_fails
            answer = pb.PutStartResponse()
            for _ in request.keys:
                slot = answer.slots.add(status=int(KeyStatus.OK), put_id=42)
                slot.replicas.add(segment_id="n1/dram0", address=0x1000)
            return answer
        if method == "PutEnd":
            if self.end_fails is not None and self.times:
                self.times -= 1
                raise self.end_fails
            return pb.PutEndResponse(statuses=[0] * len(request.commits))
        if method == "PutRevoke":
            return pb.PutRevokeResponse(statuses=[0] * len(request.keys))
        raise AssertionError(method)


def session_of(master: Master) -> Any:
    data = types.SimpleNamespace(
        unreachable=types.SimpleNamespace(current=lambda: []),
        mapped_for=lambda writing: [],
        learn=lambda segments: None,
        may_write_file=lambda segment: False,
        run=lambda transfers, is_get, deadline: [None] * len(transfers),
    )
    return types.SimpleNamespace(
        link=master,
        data=data,
        client_id="c",
        timeout=5.0,
        writing=lambda: None,
        check_process=lambda: None,
        hold=lambda reservation: True,
        let_go=lambda reservation: None,
    )


def store(master: Master, keys: list[str], session: Any = None) -> list[Any]:
    """``Client._store`` of ``keys`` against ``master`` (in ``session``, where given)."""
    client = Client.__new__(Client)
    client._session = session if session is not None else session_of(master)
    source = readable_address(bytes(4096))
    return client._store(
        [(key, None) for key in keys],
        dict.fromkeys(range(len(keys)), source),
        [None] * len(keys),
        WriteOptions(),
        time.monotonic() + 5,
    )


def test_a_put_whose_put_end_went_unanswered_says_its_outcome_is_unknown():
    master = Master(end_fails=MasterUnavailable(NOT_ANSWERED))
    with pytest.raises(PutOutcomeUnknown) as raised:
        store(master, ["k"])
    error = raised.value
    assert isinstance(error, MasterUnavailable), "caught as the error it was"
    assert error.key == "k" and error.keys == ("k",)
    message = str(error)
    assert message.startswith("the outcome of the put is unknown"), message
    assert "'k' may have been published" in message and "exists('k')" in message
    assert NOT_ANSWERED in message, "the link's own error is kept"
    assert master.calls == ["PutStart", "PutEnd"], "nothing revoked: it may be published"


def test_a_batch_whose_put_end_went_unanswered_names_every_key_of_the_commit():
    master = Master(end_fails=MasterUnavailable(NOT_ANSWERED))
    with pytest.raises(PutOutcomeUnknown) as raised:
        store(master, ["a", "b", "c"])
    assert raised.value.keys == ("a", "b", "c") and raised.value.key is None
    assert "each of its 3 objects ('a', ...: the error's `keys`)" in str(raised.value)
    # (a later part of a large batch gives each of its keys the error, of its type)
    per_key = batch_split.part_failed(raised.value, "b", 4096, 8191)
    assert isinstance(per_key, PutOutcomeUnknown) and per_key.keys == ("b",)
    assert "the outcome of the put is unknown" in str(per_key)


def test_a_put_whose_put_start_went_unanswered_keeps_master_unavailable():
    master = Master(start_fails=MasterUnavailable("master m:1 did not answer PutStart"))
    with pytest.raises(MasterUnavailable) as raised:
        store(master, ["k"])
    assert type(raised.value) is MasterUnavailable and master.calls == ["PutStart"]


def test_a_master_not_trusted_at_put_end_is_raised_as_it_is():
    refused = MasterNotTrusted("master m:1 did not prove who it is")
    with pytest.raises(MasterNotTrusted) as raised:
        store(Master(end_fails=refused), ["k"])
    assert raised.value is refused


def test_a_reservation_commit_unanswered_stays_open_and_a_commit_again_learns_the_outcome():
    master = Master(end_fails=MasterUnavailable(NOT_ANSWERED))
    session = session_of(master)
    slot = master.call("PutStart", pb.PutStartRequest(keys=["k"]), 0.0).slots[0]
    put = PendingPut(0, "k", slot, None, time.monotonic() + 5)
    reservation = Reservation(session, put, 8, False)
    reservation.write(bytes(8))
    with pytest.raises(PutOutcomeUnknown, match=r"outcome of the put is unknown") as raised:
        reservation.commit()
    assert "Call commit() again once the master answers" in str(raised.value)
    assert reservation.commit() == 1  # (answered this time: the first one's outcome)
    assert master.calls == ["PutStart", "PutEnd", "PutEnd"]


def test_a_lane_call_that_timed_out_resets_its_connection():
    """The master's host holds the request unanswered: the client's end gives up at its
    deadline with a reset (its peer reads ECONNRESET after the request), not a graceful
    close (an empty read), which would have sent whatever of it was still queued."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, Any] = {}

    def master() -> None:
        conn, _ = listener.accept()
        with conn:
            header = conn.recv(lp.HEADER.size, socket.MSG_WAITALL)
            length, call_id, method, _ = lp.HEADER.unpack(header)
            conn.recv(length, socket.MSG_WAITALL) if length else b""
            conn.sendall(lp.encode(call_id, method, b""))  # (AUTH: OK)
            request = conn.recv(lp.HEADER.size, socket.MSG_WAITALL)
            seen["request"] = lp.HEADER.unpack(request)[2]
            conn.settimeout(10)
            try:
                while conn.recv(65536):  # (the request's body, then the end)
                    pass
                seen["end"] = "closed"
            except ConnectionResetError:
                seen["end"] = "reset"

    thread = threading.Thread(target=master, daemon=True)
    thread.start()
    lane = LaneClient("127.0.0.1", listener.getsockname()[1])
    try:
        with pytest.raises(LaneError) as raised:
            lane.call("PutEnd", pb.PutEndRequest(client_id="c"), pb.PutEndResponse, 0.3)
        assert raised.value.code == lp.DEADLINE_EXCEEDED
        thread.join(10)
    finally:
        lane.close()
        listener.close()
    assert seen == {"request": lp.METHOD_IDS["PutEnd"], "end": "reset"}


# ---------------------------------------------------------------- results already known are kept


class PlacedAgainMaster(Master):
    """The first PutEnd publishes ``a`` and answers NO_REPLICA for the rest (their node could
    not be reached); a later PutEnd (of those placed again) raises ``end_fails``, and a later
    PutStart ``start_fails`` (each where given)."""

    def __init__(
        self,
        end_fails: MasterUnavailable | None = None,
        start_fails: MasterUnavailable | None = None,
    ) -> None:
        super().__init__()
        self.later_end_fails, self.later_start_fails = end_fails, start_fails
        self.ends = self.starts = 0

    def call(self, method: str, request: Any, deadline: float) -> Any:
        if method == "PutStart":
            self.starts += 1
            self.start_fails = self.later_start_fails if self.starts > 1 else None
        if method == "PutEnd":
            self.ends += 1
            if self.ends == 1:
                self.calls.append(method)
                ok, failed = int(KeyStatus.OK), int(KeyStatus.NO_REPLICA)
                return pb.PutEndResponse(
                    statuses=[ok if c.key == "a" else failed for c in request.commits]
                )
            self.end_fails, self.times = self.later_end_fails, 1
        return super().call(method, request, deadline)


def store_with_b_unreachable_first(master: Master, keys: list[str]) -> list[Any]:
    """``store``, where the first write of every key but ``a`` finds its node unreachable."""
    from kvpool.client.data_path import Failure

    session = session_of(master)
    runs: list[int] = []

    def run(transfers: Any, is_get: bool, deadline: float) -> list[Any]:
        runs.append(len(transfers))
        if len(runs) > 1:
            return [None] * len(transfers)
        return [
            None if owner == "a" else Failure("unreachable", node_id="n2", unreachable=True)
            for owner in order[: len(transfers)]
        ]

    order = list(keys)  # (one replica each, written in the keys' order)
    session.data.run = run
    return store(master, keys, session)


def test_a_commit_unanswered_after_another_was_answered_keeps_the_results_known():
    """put_many of a and b: the first PutEnd publishes a and fails b (its node unreachable);
    b is placed again, and that PutEnd goes unanswered. a's result (published) is kept; b
    alone is unknown, in an error of its own."""
    master = PlacedAgainMaster(end_fails=MasterUnavailable(NOT_ANSWERED))
    results = store_with_b_unreachable_first(master, ["a", "b", "c"])
    assert master.calls == ["PutStart", "PutEnd", "PutStart", "PutEnd"]
    assert results[0] == 1, "a was published, and says so"
    for key, error in zip(["b", "c"], results[1:], strict=True):
        assert isinstance(error, PutOutcomeUnknown), error
        assert error.key == key and error.keys == (key,)
        message = str(error)
        assert f"object '{key}' may have been published" in message, message
        assert "'a'" not in message and NOT_ANSWERED in message


def test_a_single_put_placed_again_whose_commit_went_unanswered_raises_it():
    """``put`` (one key) raises its key's error: PutOutcomeUnknown, naming it."""
    from kvpool.client.client import _raise_if_error

    master = PlacedAgainMaster(end_fails=MasterUnavailable(NOT_ANSWERED))
    [result] = store_with_b_unreachable_first(master, ["b"])
    with pytest.raises(PutOutcomeUnknown) as raised:
        _raise_if_error(result)
    assert raised.value.keys == ("b",)
    assert "object 'b' may have been published" in str(raised.value)


def test_placing_again_that_fails_before_its_commit_keeps_the_results_known():
    master = PlacedAgainMaster(start_fails=MasterUnavailable("master m:1 did not answer"))
    results = store_with_b_unreachable_first(master, ["a", "b"])
    assert master.calls == ["PutStart", "PutEnd", "PutStart"]
    assert results[0] == 1
    error = results[1]
    assert isinstance(error, TransferError) and error.key == "b", error
    assert "nothing was published" in str(error) and "did not answer" in str(error)


class SecondPartMaster(Master):
    """Refuses ``refused`` at PutStart (NO_SPACE); answers the first PutEnd, and raises
    ``end_fails`` for every later one."""

    def __init__(self, refused: set[str]) -> None:
        super().__init__(end_fails=MasterUnavailable(NOT_ANSWERED), times=0)
        self.refused = refused
        self.ends = 0

    def call(self, method: str, request: Any, deadline: float) -> Any:
        if method == "PutStart":
            answer = pb.PutStartResponse()
            for key in request.keys:
                if key in self.refused:
                    answer.slots.add(status=int(KeyStatus.NO_SPACE), message=f"no space for {key}")
                    continue
                slot = answer.slots.add(status=int(KeyStatus.OK), put_id=42)
                slot.replicas.add(segment_id="n1/dram0", address=0x1000)
            self.calls.append(method)
            return answer
        if method == "PutEnd":
            self.ends += 1
            self.times = int(self.ends > 1)
        return super().call(method, request, deadline)


def test_a_later_part_whose_commit_went_unanswered_keeps_its_refusals_and_names_each_key():
    """A batch of two parts: in the second, k4097 is refused at PutStart (nothing stored);
    the commit of k4096 and k4098 goes unanswered. k4097 keeps its refusal, and each of the
    others gets an error naming it alone."""
    count = lp.MAX_BATCH_KEYS + 3
    master = SecondPartMaster({"k4097"})
    results = store(master, [f"k{i}" for i in range(count)])
    assert master.calls == ["PutStart", "PutEnd", "PutStart", "PutEnd"]
    assert results[: lp.MAX_BATCH_KEYS] == [1] * lp.MAX_BATCH_KEYS
    refused = results[4097]
    assert isinstance(refused, NoSpace) and refused.key == "k4097", refused
    assert str(refused) == "no room for 'k4097': no space for k4097", "its own refusal, kept"
    for i in (4096, 4098):
        error = results[i]
        assert isinstance(error, PutOutcomeUnknown), error
        assert error.key == f"k{i}" and error.keys == (f"k{i}",)
        assert f"object 'k{i}' may have been published" in str(error)
        other = 4096 + 4098 - i
        assert f"k{other}" not in str(error)


def test_a_later_part_that_fails_before_its_commit_keeps_its_refusals():
    """answer_each_part gives a failed part's error only to its keys not answered yet."""
    results: list[Any] = [None] * 6

    def call(positions: Any) -> bool:
        if positions[0] == 0:
            for i in positions:
                results[i] = 1
            return True
        results[positions[1]] = "refused"  # (answered before the part failed)
        raise MasterUnavailable("master m:1 did not answer PutEnd")

    batch_split.answer_each_part(range(6), "k{}".format, results, call, most=3)
    assert results[:3] == [1, 1, 1] and results[4] == "refused"
    assert [type(results[i]) for i in (3, 5)] == [MasterUnavailable] * 2
    assert results[3].key == "k3" and results[5].key == "k5"


# ---------------------------------------------------------------- a revoke after an unknown commit


class PublishingMaster(Master):
    """Publishes at PutEnd but its answer is lost (the first ``times``); PutRevoke answers as
    master/state.py's put_revoke: STALE_PUT for a reservation no longer held."""

    def __init__(self, applied: bool) -> None:
        super().__init__(end_fails=MasterUnavailable(NOT_ANSWERED))
        self.applied, self.published, self.revoked = applied, False, False

    def call(self, method: str, request: Any, deadline: float) -> Any:
        if method == "PutEnd" and not self.revoked:
            self.published = self.published or self.applied or not self.times
        if method == "PutRevoke":
            self.calls.append(method)
            held = not self.published and not self.revoked
            self.revoked = self.revoked or held
            status = KeyStatus.OK if held else KeyStatus.STALE_PUT
            return pb.PutRevokeResponse(statuses=[int(status)] * len(request.keys))
        if method == "PutEnd" and self.revoked:
            self.calls.append(method)
            return pb.PutEndResponse(statuses=[int(KeyStatus.STALE_PUT)])
        return super().call(method, request, deadline)


def reservation_of(master: Master) -> Reservation:
    session = session_of(master)
    slot = master.call("PutStart", pb.PutStartRequest(keys=["k"]), 0.0).slots[0]
    put = PendingPut(0, "k", slot, None, time.monotonic() + 5)
    reservation = Reservation(session, put, 8, False)
    reservation.write(bytes(8))
    return reservation


def test_a_revoke_after_an_unanswered_commit_that_published_says_so():
    """The commit reached the master (published) but its answer was lost; the caller's
    cleanup revokes. The master no longer holds the reservation (STALE_PUT): revoke() must
    not report the key free."""
    master = PublishingMaster(applied=True)
    reservation = reservation_of(master)
    with pytest.raises(PutOutcomeUnknown):
        reservation.commit()
    with pytest.raises(PutOutcomeUnknown) as raised:
        reservation.revoke()
    assert master.published
    assert raised.value.key == "k" and raised.value.keys == ("k",)
    message = str(raised.value)
    assert "may have reached the master and published the object" in message, message
    assert "exists('k')" in message and "commit() again" in message
    # (the reservation is as it was: a commit again learns the outcome)
    assert reservation.commit() == 1
    assert master.calls == ["PutStart", "PutEnd", "PutRevoke", "PutEnd"]


def test_a_revoke_after_an_unanswered_commit_that_never_arrived_frees_the_key():
    master = PublishingMaster(applied=False)
    reservation = reservation_of(master)
    with pytest.raises(PutOutcomeUnknown):
        reservation.commit()
    reservation.revoke()  # (the master still held it: given up, never published)
    assert not master.published and master.revoked
    reservation.revoke()  # (a second revoke does nothing)
    assert master.calls == ["PutStart", "PutEnd", "PutRevoke"]


def test_a_client_closed_as_a_placement_again_commits_is_raised_not_called_unpublished():
    """The second PutEnd may have been applied when the closing client's link gives up on
    it (ClientClosed): its puts are not reported "nothing was published"; the call raises
    ClientClosed, as it did before results already known were kept."""
    from kvpool.errors import ClientClosed

    class ClosingMaster(PlacedAgainMaster):
        def call(self, method: str, request: Any, deadline: float) -> Any:
            if method == "PutEnd" and self.ends == 1:  # (the second PutEnd: applied, say)
                self.ends += 1
                raise ClientClosed("the client is closed: make a new one")
            return super().call(method, request, deadline)

    with pytest.raises(ClientClosed):
        store_with_b_unreachable_first(ClosingMaster(), ["a", "b"])


def test_a_reservation_closed_after_an_unanswered_commit_does_not_say_nothing_was_published():
    from kvpool.errors import ClientClosed

    master = PublishingMaster(applied=True)
    reservation = reservation_of(master)
    with pytest.raises(PutOutcomeUnknown):
        reservation.commit()
    reservation.closed()  # (Client.close)
    with pytest.raises(ClientClosed) as raised:
        reservation.commit()
    message = str(raised.value)
    assert "nothing was published" not in message, message
    assert "may have been published" in message and "exists('k')" in message, message


def test_placing_again_that_fails_says_why_it_was_placed_again():
    master = PlacedAgainMaster(start_fails=MasterUnavailable("master m:1 did not answer"))
    _, error = store_with_b_unreachable_first(master, ["a", "b"])
    assert "(it was being placed again: " in str(error)
    assert "(it was being placed again: )" not in str(error), str(error)


def test_a_reservation_whose_client_closes_mid_commit_does_not_say_nothing_was_published():
    """Client.close in another thread while the PutEnd is in flight (the master applies it):
    the reservation ends as one that may have been published."""
    from kvpool.errors import ClientClosed

    class ClosingMidCommit(Master):
        reservation: Reservation | None = None

        def call(self, method: str, request: Any, deadline: float) -> Any:
            if method == "PutEnd" and self.reservation is not None:
                self.reservation.closed()  # (Client.close, from another thread)
                raise ClientClosed("the client is closed: make a new one")
            return super().call(method, request, deadline)

    master = ClosingMidCommit()
    reservation = reservation_of(master)
    master.reservation = reservation
    with pytest.raises(ClientClosed):
        reservation.commit()
    with pytest.raises(ClientClosed) as raised:
        reservation.commit()
    message = str(raised.value)
    assert "nothing was published" not in message and "may have been published" in message


def test_a_close_just_before_the_commit_sends_no_put_end_and_says_so_truly():
    """Client.close in another thread between commit()'s first check and its PutEnd: either
    the PutEnd goes and the close says it may have been published, or (this order) the
    commit stops before sending it, and "nothing was published" is true."""
    from kvpool.errors import ClientClosed

    master = PublishingMaster(applied=True)
    reservation = reservation_of(master)
    first_check = reservation._refuse_if_over
    checks = []

    def check_then_close(step: str) -> None:
        first_check(step)
        if not checks:
            checks.append(step)
            reservation.closed()  # (Client.close, from another thread, just now)

    reservation._refuse_if_over = check_then_close  # type: ignore[method-assign]
    with pytest.raises(ClientClosed) as raised:
        reservation.commit()
    assert "PutEnd" not in master.calls and not master.published
    assert "nothing was published" in str(raised.value)


def test_a_close_from_a_signal_handler_during_the_commits_check_does_not_hang(monkeypatch):
    """The thread holding the order (its commit about to send PutEnd) is the one a signal
    handler's close runs on: the close waits a moment, then counts the commit under way."""
    from kvpool.client import reservation as module
    from kvpool.errors import ClientClosed

    monkeypatch.setattr(module, "CLOSE_WAIT", 0.05)
    reservation = reservation_of(PublishingMaster(applied=True))
    with reservation._closing:  # (as commit() holds it, marked under way)
        reservation._committing = True
        reservation.closed()
    with pytest.raises(ClientClosed, match="may have been published"):
        reservation.commit()


def test_a_revoke_after_a_published_commit_says_so_though_a_close_ended_it_meanwhile():
    """A close just as the commit was answered (before it recorded the replicas) ends the
    reservation; revoke() still says it was published rather than return quietly."""
    from kvpool.errors import InvalidArgument

    master = Master()
    reservation = reservation_of(master)
    assert reservation.commit() == 1
    reservation._over = (InvalidArgument, "(as a close in that window leaves it)")
    with pytest.raises(InvalidArgument, match="object is published"):
        reservation.revoke()


def test_an_interrupt_before_the_put_end_leaves_the_commit_not_under_way(monkeypatch):
    """Ctrl-C inside commit() before its PutEnd went: the close after it (a `with Client()`
    block's) says nothing was published, which is true."""
    from kvpool.client import put_path
    from kvpool.errors import ClientClosed

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    master = PublishingMaster(applied=True)
    reservation = reservation_of(master)
    monkeypatch.setattr(put_path, "commit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reservation.commit()
    assert not reservation._committing
    reservation.closed()
    monkeypatch.undo()
    with pytest.raises(ClientClosed, match="nothing was published"):
        reservation.commit()
    assert "PutEnd" not in master.calls
