"""A TCP proxy for tests that put something between a node and its masters: a slow link
(``delay`` seconds each way), or a Kubernetes Service in front of several masters (each new
connection to the next target, round robin)."""

from __future__ import annotations

import itertools
import queue
import socket
import threading
import time


class TcpProxy:
    """Listens on ``address``; each connection goes to the next of ``targets`` (HOST:PORT),
    the first to ``targets[0]``, every byte held ``delay`` seconds each way (0 at first), in
    order. A context manager: closing it closes every connection it made."""

    def __init__(self, *targets: str) -> None:
        self._targets = itertools.cycle(targets)
        self.delay = 0.0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return
            host, _, port = next(self._targets).rpartition(":")
            try:
                outbound = socket.create_connection((host, int(port)), timeout=5)
                outbound.settimeout(None)
            except OSError:
                inbound.close()
                continue
            self._sockets += [inbound, outbound]
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                held: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(source, held), daemon=True).start()
                threading.Thread(target=self._write, args=(held, sink), daemon=True).start()

    def _read(self, source: socket.socket, held: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            held.put((time.monotonic() + self.delay, data))
            if not data:
                return

    def _write(self, held: queue.Queue[tuple[float, bytes]], sink: socket.socket) -> None:
        while True:
            due, data = held.get()
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return
