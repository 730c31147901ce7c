"""Deadlines on the checked stream's blocking sockets at one system call per transfer.

Python's ``settimeout`` puts a socket in its timeout mode: every ``recv`` or ``send`` is then
a ``poll`` and the call itself, and every ``settimeout`` an ``ioctl``. On a stream of many
small transfers (32 x 4 KiB in about a millisecond) those calls were a large part of the
cost. Here the socket stays blocking and the kernel enforces the wait itself
(``SO_RCVTIMEO``/``SO_SNDTIMEO``): a call that waits longer fails with ``EAGAIN``. The
options are set again only when the wait wanted moves out of a small window around the one
set, so that a run of transfers costs one system call each.

A wait never ends later than asked by more than ``late`` (a socket option may be a little
longer than the time left); one that ends early (the option was a little shorter) is not a
timeout: the caller looks at the time left and waits again.
"""

from __future__ import annotations

import socket
import struct

_TIMEVAL = struct.Struct("@ll")
#: How much later than asked a wait may end (the window in which an option is kept).
LATE = 0.02
#: How much earlier than asked a wait may end (then it is waited for again).
EARLY = 0.5


class Waits:
    """The receive and send waits set on one blocking socket."""

    __slots__ = ("_receive", "_send", "_socket")

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(None)  # (blocking: no poll before each call)
        self._socket = sock
        self._receive = -1.0
        self._send = -1.0

    def receive(self, seconds: float, late: float = LATE) -> None:
        """Receives wait ``seconds`` at most (within ``late``)."""
        if not _near(self._receive, seconds, late):
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))
            self._receive = seconds

    def send(self, seconds: float) -> None:
        """Sends wait ``seconds`` at most (within ``LATE``)."""
        if not _near(self._send, seconds, LATE):
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(seconds))
            self._send = seconds


def _near(current: float, wanted: float, late: float) -> bool:
    """Whether a wait of ``current`` may stand for one of ``wanted``: at most ``late``
    longer, and not so much shorter that waits would wake again and again."""
    return max(wanted - EARLY, wanted / 2) <= current <= wanted + late


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    micros = max(1, int((seconds - whole) * 1e6)) if whole == 0 else int((seconds - whole) * 1e6)
    return _TIMEVAL.pack(whole, micros)  # (never 0, 0: that is "wait for ever")
