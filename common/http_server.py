"""The small HTTP side door every kvpool process opens: /healthz, /readyz and /metrics.

A standard-library threading server: probes and Prometheus scrapes must keep answering
when the process's event loop is busy, and they need nothing faster.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.registry import CollectorRegistry

#: Returns (ready, reason). Called from the HTTP thread: must only read simple state.
ReadinessCheck = Callable[[], tuple[bool, str]]


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        readiness: ReadinessCheck,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        handler = _make_handler(readiness, registry)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _make_handler(
    readiness: ReadinessCheck, registry: CollectorRegistry
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._reply(200, b"ok\n", "text/plain")
            elif path == "/readyz":
                ready, reason = readiness()
                body = (reason or ("ready" if ready else "not ready")).encode() + b"\n"
                self._reply(200 if ready else 503, body, "text/plain")
            elif path == "/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._reply(404, b"not found: try /healthz, /readyz or /metrics\n", "text/plain")

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the real logs

    return Handler
