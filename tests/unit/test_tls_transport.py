"""TlsTransport (common/tls_transport.py): TLS by OpenSSL on a non-blocking socket, driven
by the event loop, behaving as an asyncio transport.

- Bytes arrive whole and in order both ways, also when they outgrow the socket's buffers
  (writes OpenSSL could not finish are retried; the protocol is paused past the limit).
- A peer that connects and never says hello is closed at the handshake deadline, and the
  protocol never hears of it.
- A server whose certificate the client's CA did not sign is refused at the handshake.
- Opening a connection (the name's lookup, the connect, the handshake) ends by its timeout.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest

from kvpool.common.tls_transport import TlsTransport, open_tls_connection
from kvpool.security.dev_pki import make_dev_pki
from kvpool.security.tls import TlsFiles, client_ssl_context

MiB = 1 << 20


class Echo(asyncio.Protocol):
    """Sends back what it receives; notes pauses and its end."""

    def __init__(self) -> None:
        self.made = False
        self.paused = 0
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True
        self.transport = transport
        assert isinstance(transport, asyncio.Transport)
        transport.set_write_buffer_limits(high=64 * 1024)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self.paused += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


class Collect(asyncio.Protocol):
    def __init__(self, expected: int) -> None:
        self.data = bytearray()
        self.expected = expected
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        if len(self.data) >= self.expected and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"lost: {exc}"))


async def tls_server(pki, protocols: list[Echo], handshake_timeout: float = 5.0):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    transports: list[TlsTransport] = []

    def accept() -> None:
        conn, _ = listener.accept()
        conn.setblocking(False)
        sock = context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        protocol = Echo()
        protocols.append(protocol)
        transports.append(TlsTransport(loop, sock, protocol, handshake_timeout=handshake_timeout))

    loop.add_reader(listener.fileno(), accept)
    return listener, transports


@pytest.fixture
def pki(tmp_path: Path):
    return make_dev_pki(tmp_path / "pki")


def test_megabytes_go_both_ways_whole_and_in_order(pki):
    async def scenario() -> None:
        protocols: list[Echo] = []
        listener, _ = await tls_server(pki, protocols)
        payload = bytes(range(256)) * (16 * MiB // 256)
        client = Collect(len(payload))
        port = listener.getsockname()[1]
        context = client_ssl_context(TlsFiles(ca=pki.ca))
        transport = await open_tls_connection(client, "127.0.0.1", port, context, 5.0)
        transport.pause_reading()  # the echo's answers pile up on its side meanwhile
        for start in range(0, len(payload), MiB):
            transport.write(payload[start : start + MiB])
        for _ in range(200):
            if protocols and protocols[0].paused:
                break
            await asyncio.sleep(0.02)
        assert protocols[0].paused >= 1, "the echo outgrew its write buffer's limit"
        transport.resume_reading()
        await asyncio.wait_for(client.done, 30)
        assert bytes(client.data) == payload
        transport.close()
        await asyncio.wait_for(protocols[0].lost, 5)
        asyncio.get_running_loop().remove_reader(listener.fileno())
        listener.close()

    asyncio.run(scenario())


def test_a_peer_that_never_says_hello_is_closed_at_the_handshake_deadline(pki):
    async def scenario() -> None:
        protocols: list[Echo] = []
        listener, transports = await tls_server(pki, protocols, handshake_timeout=0.3)
        silent = socket.create_connection(listener.getsockname(), timeout=5)
        await asyncio.sleep(0.1)
        assert len(transports) == 1 and not transports[0].is_closing()
        await asyncio.sleep(0.5)
        assert transports[0].is_closing()
        assert isinstance(transports[0].error, TimeoutError)
        assert not protocols[0].made, "the protocol never saw the connection"
        silent.settimeout(2)
        assert silent.recv(1) == b"", "closed"
        silent.close()
        asyncio.get_running_loop().remove_reader(listener.fileno())
        listener.close()

    asyncio.run(scenario())


def test_a_server_the_clients_ca_did_not_sign_is_refused(pki, tmp_path):
    async def scenario() -> None:
        listener, _ = await tls_server(pki, [])
        stranger = make_dev_pki(tmp_path / "another-ca")
        context = client_ssl_context(TlsFiles(ca=stranger.ca))
        with pytest.raises(ssl.SSLError):
            await open_tls_connection(
                Collect(1), "127.0.0.1", listener.getsockname()[1], context, 5.0
            )
        asyncio.get_running_loop().remove_reader(listener.fileno())
        listener.close()

    asyncio.run(scenario())


def test_opening_ends_by_its_timeout_when_the_server_never_answers_the_handshake(pki):
    async def scenario() -> float:
        listener = socket.create_server(("127.0.0.1", 0))  # (accepts in its backlog, no TLS)
        context = client_ssl_context(TlsFiles(ca=pki.ca))
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(OSError):  # (TimeoutError)
            await open_tls_connection(
                Collect(1), "localhost", listener.getsockname()[1], context, 0.5
            )
        listener.close()
        return loop.time() - started

    assert asyncio.run(scenario()) < 1.5, "the lookup, connect and handshake share the timeout"


def test_an_opening_cancelled_mid_handshake_leaves_no_connection_behind(pki):
    """As a node's lane session is, when the leader changes: the connection must not live
    on, finish its handshake and talk to the master with no one owning it."""

    async def scenario() -> bytes:
        listener = socket.create_server(("127.0.0.1", 0))  # (accepts, says nothing)
        context = client_ssl_context(TlsFiles(ca=pki.ca))
        opening = asyncio.ensure_future(
            open_tls_connection(Collect(1), "localhost", listener.getsockname()[1], context, 30)
        )
        await asyncio.sleep(0.3)  # (connected; its ClientHello sent, no answer)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        peer, _ = listener.accept()
        peer.settimeout(5)
        try:
            received = b""
            while chunk := peer.recv(65536):  # (until the client's side closes)
                received += chunk
        finally:
            peer.close()
            listener.close()
        return received

    hello = asyncio.run(scenario())
    assert hello[:1] == b"\x16", "a TLS handshake record came, then the connection closed"
