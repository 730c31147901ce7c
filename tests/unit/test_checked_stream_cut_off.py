"""A transfer cut off on a connection that was made (transport/checked_stream.py): a read
is ``INTERRUPTED`` (its node may have closed it because the range was forgotten: the
client locates the object again), a write stays ``UNREACHABLE`` (its put is placed on
other nodes, and the node avoided meanwhile)."""

from __future__ import annotations

import ctypes
import socket
import struct
import threading
import time

import pytest

from kvpool.transport import checked_frames as frames
from kvpool.transport.checked_stream import CheckedStreams, Job, Outcome


def a_node_that_dies_mid_request() -> tuple[str, threading.Thread]:
    """An address whose one connection is taken, read a little, then reset."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = server.accept()
        connection.recv(64)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.close()  # (a reset: the process died)
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"127.0.0.1:{server.getsockname()[1]}", thread


@pytest.mark.parametrize(
    ("is_get", "outcome"), [(False, Outcome.UNREACHABLE), (True, Outcome.INTERRUPTED)]
)
def test_a_transfer_cut_off_mid_request(is_get, outcome):
    address, server = a_node_that_dies_mid_request()
    buffer = ctypes.create_string_buffer(1 << 20)
    job = Job(address, b"\0" * frames.CAPABILITY_SIZE, 0, 1 << 20, ctypes.addressof(buffer))
    streams = CheckedStreams()
    try:
        [result] = streams.run([job], is_get=is_get, deadline=time.monotonic() + 5)
    finally:
        streams.close()
        server.join(5)
    assert result.outcome is outcome, result
