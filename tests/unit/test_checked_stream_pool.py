"""The client's pool of idle checked-stream connections (transport/checked_stream.py).

A node that restarts comes back at a new address (a new port, a new pod address), and the
old one is never asked again: its idle connections, each with 2 MiB of buffers, would stay
with every client that used it. Idle connections are kept ``IDLE_KEPT`` seconds at most (the
node closes its side after 120 s anyway).
"""

from __future__ import annotations

import socket
import time

import pytest

from kvpool.transport.checked_stream import IDLE_KEPT, CheckedStreams


@pytest.fixture
def listeners():
    """Two addresses that accept connections (what a node's checked stream does first)."""
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    yield [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
    for s in sockets:
        s.close()


@pytest.fixture
def streams():
    pool = CheckedStreams()
    yield pool
    pool.close()


def test_idle_connections_to_an_address_no_longer_used_are_closed(listeners, streams):
    old, new = listeners
    deadline = time.monotonic() + 5
    left_behind = streams._take(old, deadline)
    streams._give_back(old, left_behind)
    left_behind.idle_since -= IDLE_KEPT  # (a minute later...)
    streams._swept -= IDLE_KEPT

    streams._give_back(new, streams._take(new, deadline))  # (...traffic goes elsewhere)

    assert left_behind.socket.fileno() == -1, "closed"
    assert old not in streams._idle and len(streams._idle[new]) == 1


def test_a_connection_used_lately_is_kept(listeners, streams):
    address, _ = listeners
    deadline = time.monotonic() + 5
    connection = streams._take(address, deadline)
    streams._give_back(address, connection)
    streams._swept -= IDLE_KEPT
    streams._give_back(address, streams._take(address, deadline))  # the same one again
    assert streams._idle[address] == [connection] and connection.socket.fileno() != -1
