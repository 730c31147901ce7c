"""``/readyz?role=any`` (common/http_server.py) and what a master's election says of its
contact with etcd (master/election.py ``in_touch``), which that endpoint answers on a standby.
With real etcd and masters: tests/ha/test_readiness.py."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from kvpool.common.http_server import QUERY_FIELDS, HealthServer
from kvpool.master.election import Election


def get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture
def standby() -> Iterator[HealthServer]:
    server = HealthServer(
        "127.0.0.1",
        0,
        readiness=lambda: (False, "standby; the leader is x"),
        any_role=lambda: (True, "standby; the leader is x"),
    )
    server.start()
    yield server
    server.stop()


def test_readyz_is_the_leaders_and_role_any_asks_for_any_role(standby):
    port = standby.port
    assert get(port, "/readyz") == (503, b"standby; the leader is x\n")
    assert get(port, "/readyz?role=leader") == (503, b"standby; the leader is x\n")
    assert get(port, "/readyz?role=any") == (200, b"standby; the leader is x\n")
    assert get(port, "/readyz?verbose=1&role=any") == (200, b"standby; the leader is x\n")
    assert get(port, "/readyz?verbose=1")[0] == 503, "other fields are ignored, as before"
    assert get(port, "/readyz?role=any", method="HEAD") == (200, b"")
    assert get(port, "/healthz?role=any") == (200, b"ok\n")


def test_a_role_not_known_is_a_400_not_an_answer_for_another_role(standby):
    port = standby.port
    for query in ("role=follower", "role=", "role=any&role=leader", "role=any&role=any"):
        status, body = get(port, f"/readyz?{query}")
        assert status == 400, query
        assert body == b"role: leader (the default) or any\n"
    fields = "&".join(f"f{i}=1" for i in range(QUERY_FIELDS + 1))
    assert get(port, f"/readyz?role=any&{fields}")[0] == 400
    # (the request head's bound holds as before: a longer query is a 431)
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /readyz?role=any&" + b"x" * 20000 + b" HTTP/1.1\r\n\r\n")
    assert sock.recv(1 << 16).startswith(b"HTTP/1.1 431 ")
    sock.close()


def test_a_process_with_one_role_answers_role_any_as_readyz():
    server = HealthServer("127.0.0.1", 0, readiness=lambda: (False, "2 segment(s) to mount"))
    server.start()
    try:
        assert get(server.port, "/readyz?role=any") == (503, b"2 segment(s) to mount\n")
    finally:
        server.stop()


def test_a_master_is_in_touch_with_etcd_for_a_window_after_its_last_answer():
    election = Election(["127.0.0.1:1"], "c", "127.0.0.1:2", ttl=2)
    assert election.contact_window == 2.0
    assert election.in_touch() == (False, "etcd not reached yet")
    election._answered()
    assert election.in_touch() == (True, "")
    election._etcd_error = "Deadline Exceeded"
    election._answered_at = time.monotonic() - election.contact_window - 0.5
    in_touch, why = election.in_touch()
    assert not in_touch
    assert why.startswith("etcd unreachable since ") and why.endswith(": Deadline Exceeded")
    # a round that goes well (a pause of TTL/4, then a call of up to its timeout) never
    # leaves a longer gap between answers than the window
    for ttl in (1, 2, 3, 5, 30):
        election = Election(["127.0.0.1:1"], "c", "", ttl=ttl)
        assert election.contact_window >= max(ttl, ttl / 4 + election.call_timeout)
