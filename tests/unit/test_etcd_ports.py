"""The throwaway etcd's ports stay its own across a stop and a start.

The HA tests stop etcd and start it again on the same ports; a port of the kernel's
ephemeral range may meanwhile be taken by any outgoing connection (it once was: etcd's
restart failed with "bind: address already in use"). So its ports come from below that range.
"""

import socket

import pytest

from kvpool.etcd_process import _LOWEST_PORT, _ephemeral_range, free_ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range():
    low, _ = _ephemeral_range()
    if low - _LOWEST_PORT < 1000:
        pytest.skip(f"this host's ephemeral range starts at {low}: no room below it")
    for _ in range(20):
        ports = free_ports(2)
        assert len(set(ports)) == 2
        for port in ports:
            assert port < low
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # (free: nothing holds it after the pick)


def test_outgoing_connections_take_ports_only_from_the_ephemeral_range():
    """(what the pick relies on: connections made while etcd is down miss its ports)"""
    low, high = _ephemeral_range()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        outgoing = [socket.create_connection(listener.getsockname()) for _ in range(50)]
        try:
            assert all(low <= c.getsockname()[1] <= high for c in outgoing)
        finally:
            for c in outgoing:
                c.close()
