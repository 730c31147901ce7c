"""Finding the leader through etcd's JSON gateway, against endpoints that misbehave.

A lookup ends by the caller's deadline (or LOOKUP_BUDGET, whichever is first) whatever the
endpoints do: accept and say nothing, trickle a byte at a time, or answer something that is
not etcd's answer. None of it reaches the caller as anything but "no leader known" (""), so
the caller retries with backoff within its own deadline.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from kvpool.common.leader_resolver import LOOKUP_BUDGET, LeaderResolver
from kvpool.common.master_address import parse_master


@contextmanager
def endpoint(serve: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP endpoint on loopback that runs ``serve`` on each connection it accepts."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def silent(connection: socket.socket) -> None:
    time.sleep(30)
    connection.close()


def trickling(connection: socket.socket) -> None:
    connection.recv(65536)
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    try:
        for _ in range(300):
            connection.sendall(b" ")
            time.sleep(0.1)
    except OSError:
        pass
    connection.close()


def answering(body: bytes) -> Callable[[socket.socket], None]:
    def serve(connection: socket.socket) -> None:
        connection.recv(65536)
        connection.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        connection.close()

    return serve


def resolver(*endpoints: str) -> LeaderResolver:
    return LeaderResolver(parse_master("etcd://" + ",".join(endpoints) + "/test-cluster"))


def test_etcd_names_the_leader():
    value = base64.b64encode(b"10.0.0.7:50051").decode()
    body = json.dumps({"kvs": [{"key": "x", "value": value}]}).encode()
    with endpoint(answering(body)) as address:
        assert resolver(address).leader(time.monotonic() + 5) == "10.0.0.7:50051"


def test_endpoints_that_accept_and_say_nothing_cost_no_more_than_the_deadline():
    with endpoint(silent) as a, endpoint(silent) as b, endpoint(silent) as c:
        found = resolver(a, b, c)
        start = time.monotonic()
        assert found.leader(time.monotonic() + 0.5) == ""
        assert found.failed(deadline=time.monotonic() + 0.5) == ""
        assert time.monotonic() - start < 1.5


def test_an_endpoint_that_trickles_its_answer_is_given_up_on():
    with endpoint(trickling) as address:
        start = time.monotonic()
        assert resolver(address).leader() == ""  # (no deadline: LOOKUP_BUDGET bounds it)
        assert time.monotonic() - start < LOOKUP_BUDGET + 1.0


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'{"kvs": "no list"}',
        b'{"kvs": [{"no value": 1}]}',
        b'{"kvs": [{"value": "!!! not base64"}]}',
        json.dumps({"kvs": [{"value": base64.b64encode(b"\xff\xfe").decode()}]}).encode(),
    ],
    ids=["not json", "a list", "kvs not a list", "no value", "not base64", "not utf-8"],
)
def test_an_answer_that_is_not_etcds_means_no_leader_known(body):
    with endpoint(answering(body)) as address:
        assert resolver(address).leader(time.monotonic() + 5) == ""


def test_a_thread_that_knows_the_leader_is_not_held_up_by_a_slow_lookup():
    with endpoint(silent) as address:
        found = resolver(address)
        asking = threading.Thread(target=found.failed, kwargs={"deadline": time.monotonic() + 3})
        asking.start()
        time.sleep(0.2)  # (the lookup is under way, against an endpoint that says nothing)
        start = time.monotonic()
        assert found.failed(hint="10.0.0.8:50051") == "10.0.0.8:50051"
        assert time.monotonic() - start < 0.5
        asking.join(5)


def test_threads_failing_on_the_same_master_move_on_once_not_back_to_it():
    """(Each failure moved to the next master: two threads failing on A together went to B
    and straight back to A, the dead one, and each move replaced the gRPC channel.)"""
    resolver = LeaderResolver(parse_master("a:1,b:2,c:3"))
    assert resolver.leader() == "a:1"
    assert resolver.failed(tried="a:1") == "b:2"
    assert resolver.failed(tried="a:1") == "b:2", "the second failure on a:1 moves nothing"
    assert resolver.failed(hint="c:3", tried="a:1") == "b:2"
    assert resolver.failed(tried="b:2") == "c:3"


def test_a_hinted_leader_that_fails_sends_the_caller_back_to_the_address_given():
    """(A standby's hint was kept for good: behind one Service address, a caller whose hinted
    leader could not be reached, or did not prove who it is there, retried it forever.)"""
    resolver = LeaderResolver(parse_master("kv-master.ns.svc:50051"))
    assert resolver.failed(hint="10.1.2.3:50051") == "10.1.2.3:50051"
    assert resolver.hinted("10.1.2.3:50051")
    assert not resolver.hinted("kv-master.ns.svc:50051")
    assert resolver.failed(tried="10.1.2.3:50051") == "kv-master.ns.svc:50051"
    assert resolver.leader() == "kv-master.ns.svc:50051"
    # and a hint again after that is followed again
    assert resolver.failed(hint="10.1.2.4:50051") == "10.1.2.4:50051"
    assert resolver.failed() == "kv-master.ns.svc:50051"  # (a node: no ``tried``)


def test_a_failed_hint_goes_on_down_the_list_of_masters():
    resolver = LeaderResolver(parse_master("a:1,b:2,c:3"))
    assert resolver.failed(hint="x:9", tried="a:1") == "x:9"
    assert resolver.failed(tried="x:9") == "b:2", "the master after the one that named x:9"
    assert resolver.failed(hint="c:3", tried="b:2") == "c:3"
    assert not resolver.hinted("c:3")  # a listed master: the list goes on from it
    assert resolver.failed(tried="c:3") == "a:1"


def test_where_etcd_names_the_leader_nothing_is_a_hint():
    assert not resolver("127.0.0.1:1").hinted("10.0.0.7:50051")
