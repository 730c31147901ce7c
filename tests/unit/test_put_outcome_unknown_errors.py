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
from kvpool.errors import MasterNotTrusted, MasterUnavailable, PutOutcomeUnknown
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


def store(master: Master, keys: list[str]) -> list[Any]:
    client = Client.__new__(Client)
    client._session = session_of(master)
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
