"""What a fork child does with its parent's client state (client/session.py,
client/lane_client.py), without a cluster:

- a session is abandoned in the child: every use of its link or data path raises
  ClientForked naming the parent, closing it touches nothing of the parent's, and the
  parent's session is as it was;
- a lane client's idle connections are let go of in the child (its copies of the
  descriptors only: the parent's connection stays open and usable);
- a new client's UCX settings in such a child turn the registration cache off (its set-up
  could wait for ever on a lock a parent's thread held at the fork), unless set either way.
"""

from __future__ import annotations

import os
import socket

import pytest
from helpers import in_fork_child

from kvpool.client import session as session_module
from kvpool.client.lane_client import LaneClient, _Connection
from kvpool.client.session import Session, ucx_config_after_fork
from kvpool.errors import ClientClosed, ClientForked


class Fake:
    """Stands in for a link or data path: notes what was called on it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.retries = 0

    def call(self, *args: object) -> str:
        self.calls.append("call")
        return "answer"

    def close(self) -> None:
        self.calls.append("close")


def test_a_session_is_abandoned_in_a_fork_child_and_left_alone_in_the_parent():
    link, data = Fake(), Fake()
    session = Session(link, data, timeout=1.0)  # type: ignore[arg-type]
    parent = os.getpid()

    def child() -> str:
        answers = []
        for use in (
            lambda: session.link.call("Get"),
            lambda: session.data.close(),
            lambda: session.link.retries,
            session.writing,
            session.check_process,
        ):
            try:
                use()
                answers.append("no error")
            except ClientForked as error:
                assert isinstance(error, ClientClosed)
                answers.append(str(error))
        session.close()  # nothing of the parent's is closed
        answers.append(f"closed on the parent's objects: {link.calls + data.calls}")
        answers.append(f"forked: {session.forked}")
        return "\n".join(answers)

    answers = in_fork_child(child).splitlines()
    assert len(answers) == 7, answers
    for answer in answers[:5]:
        assert answer.startswith(f"this Client was made in process {parent} before fork()")
        assert "make a new Client in the child" in answer
    assert answers[5] == "closed on the parent's objects: []"
    assert answers[6] == "forked: True"

    assert not session.forked and session.link is link and session.data is data
    session.check_process()
    assert session.link.call("Get") == "answer"
    session.close()
    assert link.calls == ["call", "close"] and data.calls == ["close"]


def test_a_lane_clients_idle_connections_are_let_go_of_in_a_fork_child_only():
    ours, master = socket.socketpair()
    lane = LaneClient("127.0.0.1", 1)
    connection = _Connection(ours)
    lane._give_back(connection)
    assert lane._idle == [connection]

    def child() -> str:
        closed = ours.fileno() == -1
        return f"idle={len(lane._idle)} closed={closed}"

    assert in_fork_child(child) == "idle=0 closed=True"
    # the parent's connection is its own as before: still pooled, still open both ways
    assert lane._idle == [connection] and connection.reusable()
    ours.sendall(b"ping")
    assert master.recv(4) == b"ping"
    master.sendall(b"pong")
    assert ours.recv(4) == b"pong"
    lane.close()
    master.close()


@pytest.mark.parametrize(
    ("given", "environment", "expected"),
    [
        (None, None, {"RCACHE_ENABLE": "n"}),
        ({"TLS": "tcp"}, None, {"TLS": "tcp", "RCACHE_ENABLE": "n"}),
        ({"RCACHE_ENABLE": "y"}, None, {"RCACHE_ENABLE": "y"}),  # (set by the caller: kept)
        (None, "y", None),  # (set in the environment: kept)
    ],
)
def test_a_new_client_in_a_fork_child_of_a_client_process_skips_ucxs_registration_cache(
    monkeypatch, given, environment, expected
):
    if environment is None:
        monkeypatch.delenv("UCX_RCACHE_ENABLE", raising=False)
    else:
        monkeypatch.setenv("UCX_RCACHE_ENABLE", environment)
    monkeypatch.setattr(session_module, "_forked_after_sessions", False)
    assert ucx_config_after_fork(given) == given, "not a fork child: as given"
    Session(Fake(), Fake(), timeout=1.0)  # type: ignore[arg-type]  # (a client was made)
    assert in_fork_child(lambda: repr(ucx_config_after_fork(given))) == repr(expected)
