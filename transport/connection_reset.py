"""Resetting the TCP connections of a UCX worker that is given up, so that nothing it queued
is ever delivered.

Why: a put that missed its deadline may leave bytes in the kernel's send queue of the
worker's TCP connection to a node (a partition, a stalled node). Closing a socket, even
UCX's forced close, still sends what the queue holds once the peer answers again, which can
be long after the master gave the space to another object: those late bytes would land in
it. A connection closed with ``SO_LINGER`` set to zero is reset instead: the kernel drops its
queue and sends RST, and the peer never sees another byte from it.

UCX does not hand out its sockets, but the worker's event fd is an epoll set whose targets
(listed in ``/proc/self/fdinfo``) lead, through the transports' own epoll sets, to every
socket the worker polls. Each connected TCP socket found there is given ``SO_LINGER`` 0 and
replaced, under the same fd number, by an unconnected socket (``dup2``): the original is
closed, hence reset, and the fd number UCX holds stays valid and can name nothing else. The
worker must never be progressed again (it is abandoned, as a tainted worker already is).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct

_TARGET = re.compile(r"^tfd:\s+(\d+)", re.MULTILINE)
#: Nesting of epoll sets followed at most (worker -> transport -> sockets is two).
MAX_DEPTH = 4
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


def worker_sockets(event_fd: int) -> list[int]:
    """The fds of the sockets reachable from the epoll set ``event_fd`` (a worker's)."""
    found: list[int] = []
    seen: set[int] = set()

    def walk(fd: int, depth: int) -> None:
        if fd in seen or depth > MAX_DEPTH:
            return
        seen.add(fd)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if target.startswith("socket:"):
            found.append(fd)
        elif "eventpoll" in target:
            try:
                with open(f"/proc/self/fdinfo/{fd}") as info:
                    listed = info.read()
            except OSError:
                return
            for match in _TARGET.finditer(listed):
                walk(int(match.group(1)), depth + 1)

    walk(event_fd, 0)
    return found


def reset_connections(event_fd: int) -> int:
    """Resets every connected TCP socket of the worker whose event fd is ``event_fd``;
    returns how many. Only for a worker that is never progressed again."""
    reset = 0
    for fd in worker_sockets(event_fd):
        if _reset(fd):
            reset += 1
    return reset


def _reset(fd: int) -> bool:
    try:
        probe = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if probe.type != socket.SOCK_STREAM or probe.family not in (
            socket.AF_INET,
            socket.AF_INET6,
        ):
            return False
        try:
            probe.getpeername()
        except OSError:
            return False  # (a listening or unconnected socket: nothing queued to a peer)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        family = probe.family
    finally:
        probe.close()  # (the duplicate only: the socket lives on under ``fd``)
    placeholder = socket.socket(family, socket.SOCK_STREAM)
    with contextlib.closing(placeholder):
        os.dup2(placeholder.fileno(), fd)  # closes the connection under ``fd``: a reset
    return True
