"""A metadata lane connection that carries nothing for a while (a node's command stream
between commands) is probed, so that one cut silently ends in about half a minute rather
than the kernel's two hours (common/tcp_keepalive.py)."""

from __future__ import annotations

import socket

from kvpool.common import tcp_keepalive


def test_keep_alive_sets_probes_that_end_a_dead_connection_within_a_minute():
    with socket.socket() as sock:
        tcp_keepalive.keep_alive(sock)
        option = sock.getsockopt
        assert option(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        idle = option(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        interval = option(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
        count = option(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        assert idle + interval * count <= 60
        assert option(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) <= 60_000
