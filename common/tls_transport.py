"""TLS on an asyncio connection without asyncio's TLS layer: a non-blocking ``ssl.SSLSocket``
driven by the event loop's reader and writer callbacks.

Why: ``loop.create_server(ssl=...)`` runs every TLS record through ``asyncio.sslproto``, a
state machine in Python over an ``SSLObject`` and memory buffers. On the metadata lane, where
a call is a few hundred bytes each way, that layer cost the master about as much CPU as the
handler it carried (docs/benchmarks.md, "Secure against insecure"). Here OpenSSL reads and
writes the socket itself (``SSLSocket.recv``/``send`` in C) and Python only sees plaintext:
one call per record, as the plain selector transport makes one per ``recv``.

The protocol it drives sees an ordinary ``asyncio.Transport``: ``connection_made`` once the
handshake is done (a handshake not done within its deadline, or failing, closes the socket
and the protocol never hears of it), ``data_received``, ``pause_writing``/``resume_writing``
past the write buffer's limits, ``connection_lost``. A write OpenSSL could not finish is
retried with the same bytes, as OpenSSL requires.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from typing import Any

#: Bytes read per ``recv``: a TLS record holds at most 16 KiB of plaintext, and OpenSSL returns
#: one record per read (a larger size would only allocate, and free, more each time).
READ_SIZE = 16 * 1024
#: Bytes handed to OpenSSL per ``send`` from the write buffer.
WRITE_CHUNK = 256 * 1024
WRITE_HIGH = 64 * 1024
#: Records read in one reader callback before yielding to other connections.
READS_PER_TURN = 16


class TlsTransport(asyncio.Transport):
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: ssl.SSLSocket,
        protocol: asyncio.Protocol,
        *,
        handshake_timeout: float,
        on_done: Callable[[TlsTransport], None] | None = None,
    ) -> None:
        """``sock``: connected, non-blocking, wrapped with ``do_handshake_on_connect=False``.
        ``on_done`` is called once when the transport ends, handshake done or not."""
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._on_done = on_done
        self._buffer = bytearray()
        #: Bytes OpenSSL was given and could not finish writing: retried as they are.
        self._pending: bytes | None = None
        self._handshaken = False
        self._closing = False
        self._closed = False
        self._reading = True
        self._writing = False
        self._protocol_paused = False
        self._high = WRITE_HIGH
        self._low = WRITE_HIGH // 4
        #: What ended the connection, if it was an error.
        self.error: BaseException | None = None
        self._extra: dict[str, Any] = {"socket": sock}
        with contextlib.suppress(OSError):
            self._extra["peername"] = sock.getpeername()
            self._extra["sockname"] = sock.getsockname()
        self._timer: asyncio.TimerHandle | None = loop.call_later(
            handshake_timeout, self._handshake_timed_out
        )
        loop.add_reader(self._fd, self._on_readable)
        self._handshake()

    # ---- asyncio.Transport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._closed

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._closed or not data:
            return
        if not self._buffer and self._pending is None and self._handshaken:
            try:
                sent = self._sock.send(data)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                self._pending = bytes(data)  # (OpenSSL wants these very bytes again)
                self._want_write()
                self._maybe_pause_protocol()
                return
            except (ssl.SSLError, OSError) as error:
                self._finish(error)
                return
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
        self._buffer += data
        self._want_write()
        self._maybe_pause_protocol()

    def close(self) -> None:
        if self._closing or self._closed:
            return
        self._closing = True
        self._stop_reading()
        if not self._buffer and self._pending is None:
            self._finish(None)

    def abort(self) -> None:
        self._buffer.clear()
        self._pending = None
        self._finish(None)

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._stop_reading()

    def resume_reading(self) -> None:
        if self._reading or self._closing or self._closed:
            return
        self._reading = True
        self._loop.add_reader(self._fd, self._on_readable)
        if self._handshaken and self._sock.pending():  # (decrypted already: no event comes)
            self._loop.call_soon(self._on_readable)

    def is_reading(self) -> bool:
        return self._reading and not self._closed

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = WRITE_HIGH if high is None else high
        self._low = self._high // 4 if low is None else low
        self._maybe_pause_protocol()

    def get_write_buffer_size(self) -> int:
        return len(self._buffer) + (len(self._pending) if self._pending is not None else 0)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    # ---- the loop's callbacks

    def _handshake(self) -> None:
        try:
            self._sock.do_handshake()
        except ssl.SSLWantReadError:
            return  # (the reader is registered)
        except ssl.SSLWantWriteError:
            self._want_write()
            return
        except (ssl.SSLError, OSError) as error:
            self._finish(error)
            return
        self._handshaken = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._extra["ssl_object"] = self._sock
        self._extra["peercert"] = self._sock.getpeercert()
        if not self._buffer and self._pending is None and self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)
        self._protocol.connection_made(self)
        if self._reading and not self._closed and self._sock.pending():
            self._loop.call_soon(self._on_readable)

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if not self._handshaken:
            self._finish(TimeoutError("the TLS handshake did not finish in time"))

    def _on_readable(self) -> None:
        if self._closed:
            return
        if not self._handshaken:
            self._handshake()
            return
        sock = self._sock
        for _ in range(READS_PER_TURN):
            if not self._reading or self._closed:
                return
            try:
                data = sock.recv(READ_SIZE)
            except (ssl.SSLWantReadError, BlockingIOError):
                return
            except ssl.SSLWantWriteError:
                self._want_write()
                return
            except (ssl.SSLError, OSError) as error:
                self._finish(error)
                return
            if not data:
                self._finish(None)  # the peer closed
                return
            self._protocol.data_received(data)
            if not sock.pending():
                return  # (more in the kernel's buffer wakes the reader again)

    def _on_writable(self) -> None:
        if self._closed:
            return
        if not self._handshaken:
            self._handshake()
            return
        try:
            pending = self._pending
            if pending is not None:  # (a write OpenSSL wants retried with the same bytes)
                sent = self._sock.send(pending)
                self._pending = None
                if sent < len(pending):
                    self._buffer[:0] = pending[sent:]
            while self._buffer:
                chunk = bytes(self._buffer[:WRITE_CHUNK])
                del self._buffer[: len(chunk)]
                self._pending = chunk
                sent = self._sock.send(chunk)
                self._pending = None
                if sent < len(chunk):
                    self._buffer[:0] = chunk[sent:]
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            return
        except (ssl.SSLError, OSError) as error:
            self._finish(error)
            return
        self._writing = False
        self._loop.remove_writer(self._fd)
        if self._protocol_paused and self.get_write_buffer_size() <= self._low:
            self._protocol_paused = False
            self._protocol.resume_writing()
        if self._closing and not self._buffer and self._pending is None:
            self._finish(None)

    # ---- helpers

    def _want_write(self) -> None:
        if not self._writing and not self._closed:
            self._writing = True
            self._loop.add_writer(self._fd, self._on_writable)

    def _stop_reading(self) -> None:
        if not self._closed:
            self._loop.remove_reader(self._fd)

    def _maybe_pause_protocol(self) -> None:
        if not self._protocol_paused and self.get_write_buffer_size() > self._high:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def _finish(self, error: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._closing = True
        self.error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._handshaken:
            self._loop.call_soon(self._lost, error)
        elif self._on_done is not None:
            self._on_done(self)

    def _lost(self, error: BaseException | None) -> None:
        try:
            self._protocol.connection_lost(error if isinstance(error, Exception) else None)
        finally:
            if self._on_done is not None:
                self._on_done(self)


async def open_tls_connection(
    protocol: asyncio.Protocol,
    host: str,
    port: int,
    context: ssl.SSLContext,
    timeout: float,
) -> TlsTransport:
    """Looks ``host`` up, connects to it and completes a TLS handshake, all within
    ``timeout`` seconds, then hands the connection to ``protocol``; OSError (TimeoutError
    among them) or ssl.SSLError when it cannot."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout  # (the name's lookup, the connect and the handshake)
    infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
    family, kind, proto, _, address = infos[0]
    raw = socket.socket(family, kind, proto)
    try:
        raw.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(raw, address), max(deadline - loop.time(), 0))
        sock = context.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False)
    except BaseException:
        raw.close()
        raise
    made: asyncio.Future[None] = loop.create_future()
    relay = _Relay(protocol, made)
    transport = TlsTransport(
        loop,
        sock,
        relay,
        handshake_timeout=max(deadline - loop.time(), 0.001),
        on_done=lambda t: relay.failed(t.error),
    )
    try:
        await made
    except BaseException:  # (cancelled mid-handshake, say: no connection lives on unowned)
        transport.abort()
        raise
    return transport


class _Relay(asyncio.Protocol):
    """Passes every event on to the real protocol; tells the opener when the handshake is
    done (or that the connection ended before)."""

    def __init__(self, protocol: asyncio.Protocol, made: asyncio.Future[None]) -> None:
        self._protocol = protocol
        self._made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._protocol.connection_made(transport)
        if not self._made.done():
            self._made.set_result(None)

    def failed(self, error: BaseException | None) -> None:
        if not self._made.done():
            if isinstance(error, ssl.SSLError | OSError):
                self._made.set_exception(error)
            else:
                self._made.set_exception(ConnectionError(f"the TLS handshake failed: {error}"))

    def data_received(self, data: bytes) -> None:
        self._protocol.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self._protocol.pause_writing()

    def resume_writing(self) -> None:
        self._protocol.resume_writing()
