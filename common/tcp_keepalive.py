"""TCP keepalive tuned to notice a dead peer in about half a minute, not two hours.

Why: a metadata lane command stream carries nothing while the master has no command for its
node, and the node only answers. A connection cut where neither end hears of it (a NAT or
conntrack entry expired, a host lost) would otherwise sit open until the kernel's default
keepalive gives up after about two hours: the master's commands to that node fail meanwhile.
With these, probes start after ``IDLE`` quiet seconds and the connection ends after
``COUNT`` unanswered ones, ``INTERVAL`` apart; unacknowledged data ends it after
``USER_TIMEOUT`` seconds.
"""

from __future__ import annotations

import contextlib
import socket

IDLE = 10
INTERVAL = 5
COUNT = 3
USER_TIMEOUT = 30


def keep_alive(sock: socket.socket) -> None:
    """Turns on keepalive with the probes above (best effort where an option is missing)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, IDLE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, INTERVAL)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, COUNT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT * 1000)
