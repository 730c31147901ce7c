"""The small HTTP side door every kvpool process opens: /healthz, /readyz and /metrics.

``/readyz`` answers the process's readiness check. ``/readyz?role=any`` answers the
``any_role`` check where the process has one (a master with leader election: ready as leader,
or as a standby that can campaign), else the same as ``/readyz``; ``role=leader`` is
``/readyz`` itself, and another role is a 400. Any other query field is ignored.

A thread of its own runs an event loop that serves every connection: probes and Prometheus
scrapes keep answering when the process's main event loop is busy, and a peer that opens
connections and sends nothing costs a socket, never a thread. What peers can hold is bounded:
``max_connections`` open at once (more are closed as they come), ``timeout`` seconds from
connecting to the end of the answer (then the connection is closed, whatever it was doing), a
request head of ``HEAD_LIMIT`` bytes. One request per connection: every answer says
``Connection: close``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.registry import CollectorRegistry

from kvpool.common.listen_address import listening_socket
from kvpool.common.logging import get_logger

log = get_logger("kvpool.http")

#: Returns (ready, reason). Called from the HTTP thread: must only read simple state.
ReadinessCheck = Callable[[], tuple[bool, str]]

#: Seconds a connection has, from connecting, to send its request and read the answer.
REQUEST_TIMEOUT = 5.0
#: Connections open at once, at most.
MAX_CONNECTIONS = 512
#: Bytes a request line and its headers may take.
HEAD_LIMIT = 8192
#: Fields a query string may name (more: a 400).
QUERY_FIELDS = 16
#: Seconds ``stop`` waits for the HTTP thread to end.
STOP_TIMEOUT = 5.0

TEXT = "text/plain; charset=utf-8"


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        readiness: ReadinessCheck,
        registry: CollectorRegistry = REGISTRY,
        *,
        any_role: ReadinessCheck | None = None,
        timeout: float = REQUEST_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        """``any_role``: what ``/readyz?role=any`` answers (None: the same as ``/readyz``)."""
        if not timeout > 0 or max_connections < 1:
            raise ValueError(
                f"the HTTP server needs a positive timeout and at least one connection, got "
                f"{timeout} and {max_connections}"
            )
        self._readiness = readiness
        self._any_role = any_role or readiness
        self._registry = registry
        self._timeout = timeout
        self._max_connections = max_connections
        self._open = 0
        #: Bound here, so that a port in use raises OSError to the caller.
        self._socket = listening_socket(host, port)
        self._loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    @property
    def open_connections(self) -> int:
        return self._open

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(STOP_TIMEOUT)
        else:
            self._socket.close()
            self._loop.close()

    # ---- the HTTP thread

    def _serve(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._listen())
        finally:
            tasks = asyncio.all_tasks(loop)  # the connections still open
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _listen(self) -> None:
        server = await asyncio.start_server(self._connection, sock=self._socket, limit=HEAD_LIMIT)
        async with server:
            await self._stopping.wait()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self._max_connections:
            writer.transport.abort()
            return
        self._open += 1
        try:
            # (the close too: with the answer unread, a close never ends, and the socket
            # would stay open uncounted)
            async with asyncio.timeout(self._timeout):
                await self._exchange(reader, writer)
                writer.close()
                await writer.wait_closed()
        except (TimeoutError, ConnectionError):
            writer.transport.abort()  # too slow, or gone: nothing more to say
        finally:
            self._open -= 1

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            code, body, content_type = 431, b"request head too large\n", TEXT
            method = "GET"
        except asyncio.IncompleteReadError:
            return  # closed before a whole request came
        else:
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            method = parts[0] if parts else ""
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                code, body, content_type = 400, b"not an HTTP request\n", TEXT
            elif method not in ("GET", "HEAD"):
                code, body, content_type = 405, b"only GET and HEAD\n", TEXT
            else:
                code, body, content_type = self._answer(parts[1])
        status = HTTPStatus(code)
        writer.write(
            f"HTTP/1.1 {code} {status.phrase}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
        )
        if method != "HEAD":
            writer.write(body)
        await writer.drain()

    def _answer(self, target: str) -> tuple[int, bytes, str]:
        path, _, query = target.partition("?")
        try:
            if path == "/healthz":
                return 200, b"ok\n", TEXT
            if path == "/readyz":
                role = _role(query)
                if role is None:
                    return 400, b"role: leader (the default) or any\n", TEXT
                ready, reason = (self._any_role if role == "any" else self._readiness)()
                body = (reason or ("ready" if ready else "not ready")).encode() + b"\n"
                return (200 if ready else 503), body, TEXT
            if path == "/metrics":
                return 200, generate_latest(self._registry), CONTENT_TYPE_LATEST
        except Exception as error:  # a check or a collector that failed: say so, once
            log.error("an HTTP answer failed", path=path, error=f"{type(error).__name__}: {error}")
            return 500, f"{type(error).__name__}: {error}\n".encode(), TEXT
        return 404, b"not found: try /healthz, /readyz or /metrics\n", TEXT


def _role(query: str) -> str | None:
    """The role ``/readyz`` is asked about: "leader" (none named) or "any"; None for another
    role, several, or a query of more than QUERY_FIELDS fields."""
    try:
        roles = parse_qs(query, keep_blank_values=True, max_num_fields=QUERY_FIELDS).get(
            "role", ["leader"]
        )
    except ValueError:
        return None
    return roles[0] if len(roles) == 1 and roles[0] in ("leader", "any") else None
