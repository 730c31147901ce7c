"""TLS on gRPC and on the metadata lane: TLS 1.2 at least, client certificates when
required, and a rotated certificate served to the next connection without a restart."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from kvpool.security.certificates import identity_from_certificate
from kvpool.security.dev_pki import DevPki, make_dev_pki
from kvpool.security.identity import Identity, Role
from kvpool.security.tls import (
    ServerContexts,
    TlsConfigError,
    TlsFiles,
    client_ssl_context,
    grpc_channel_credentials,
    grpc_server_credentials,
    write_atomically,
)


@pytest.fixture
def pki(tmp_path: Path) -> DevPki:
    return make_dev_pki(tmp_path / "pki")


def serial_of(pem_or_der: bytes) -> int:
    if pem_or_der.startswith(b"-----"):
        return x509.load_pem_x509_certificate(pem_or_der).serial_number
    return x509.load_der_x509_certificate(pem_or_der).serial_number


def served_serial(pki: DevPki) -> int:
    return serial_of(pki.server_cert.read_bytes())


# --- the files ------------------------------------------------------------------------------


def test_files_that_cannot_be_used_are_refused_saying_which(pki, tmp_path):
    other = make_dev_pki(tmp_path / "other")
    with pytest.raises(TlsConfigError, match="does not exist: check the path"):
        TlsFiles(ca=tmp_path / "nowhere.crt").check()
    with pytest.raises(TlsConfigError, match="certificate was given without its key"):
        TlsFiles(cert=pki.server_cert, ca=pki.ca).check()
    with pytest.raises(TlsConfigError, match="key was given without its certificate"):
        TlsFiles(key=pki.server_key).check()
    with pytest.raises(TlsConfigError, match="is not the key of the certificate"):
        TlsFiles(cert=pki.server_cert, key=other.server_key).check()
    with pytest.raises(TlsConfigError, match="needs a certificate and its key"):
        TlsFiles(ca=pki.ca).check(server=True)
    (tmp_path / "empty.crt").write_text("")
    with pytest.raises(TlsConfigError, match="is empty"):
        TlsFiles(ca=tmp_path / "empty.crt").check()
    (tmp_path / "junk.crt").write_text("-----BEGIN CERTIFICATE-----\njunk\n")
    with pytest.raises(TlsConfigError, match="no usable PEM certificate"):
        TlsFiles(ca=tmp_path / "junk.crt").check()
    with pytest.raises(TlsConfigError, match="holds no PEM certificate"):
        TlsFiles(cert=pki.server_key, key=pki.server_key).check()
    with pytest.raises(TlsConfigError, match="no CA to check them against: give --tls-ca"):
        grpc_server_credentials(TlsFiles(pki.server_cert, pki.server_key), True)
    pki.server_files().check(server=True)  # and the good ones pass
    assert TlsFiles(cert=str(pki.server_cert)).cert == pki.server_cert  # type: ignore[arg-type]


def test_every_context_speaks_tls_1_2_at_least(pki):
    assert client_ssl_context(pki.client_files()).minimum_version == ssl.TLSVersion.TLSv1_2
    contexts = ServerContexts(pki.server_files(), require_client_cert=False)
    assert contexts.current().minimum_version == ssl.TLSVersion.TLSv1_2
    assert contexts.listening_context().minimum_version == ssl.TLSVersion.TLSv1_2


# --- gRPC -----------------------------------------------------------------------------------


async def echo_identity(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """Answers with the identity in the caller's certificate (as the master will read it)."""
    pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
    identity = identity_from_certificate(pem) if pem else None
    return repr(identity).encode()


async def with_grpc_server(
    credentials: grpc.ServerCredentials, body: Callable[[int], Awaitable[None]]
) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Echo", {"Identity": grpc.unary_unary_rpc_method_handler(echo_identity)}
            ),
        )
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        await body(port)
    finally:
        await server.stop(None)


async def call(port: int, files: TlsFiles, host: str = "localhost") -> str:
    channel = grpc.aio.secure_channel(f"{host}:{port}", grpc_channel_credentials(files))
    async with channel:
        answer = await channel.unary_unary("/test.Echo/Identity")(b"", timeout=5)
    return bytes(answer).decode()


async def handshake_serial(port: int, context: ssl.SSLContext) -> int:
    """The serial number of the certificate a new connection to ``port`` is served."""
    context.set_alpn_protocols(["h2"])
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost"
    )
    try:
        return serial_of(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
    finally:
        writer.close()


def test_a_grpc_call_over_tls_checks_the_server_against_the_ca(pki):
    async def body(port: int) -> None:
        assert await call(port, pki.client_files()) == "None"  # no client certificate needed
        assert await call(port, pki.client_files(), host="127.0.0.1") == "None"
        stranger = TlsFiles(ca=make_dev_pki(pki.directory / "stranger").ca)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(port, stranger)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE

    asyncio.run(with_grpc_server(grpc_server_credentials(pki.server_files(), False), body))


def test_grpc_with_client_certificates_required_knows_the_caller_and_refuses_the_rest(pki):
    cert, key = pki.client_certificate("kvpool://client/acme/alice", "alice")

    async def body(port: int) -> None:
        answer = await call(port, pki.client_files(cert, key))
        assert answer == repr(Identity(name="alice", role=Role.CLIENT, tenant="acme"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(port, pki.client_files())  # no certificate
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE

    asyncio.run(with_grpc_server(grpc_server_credentials(pki.server_files(), True), body))


def test_grpc_serves_a_rotated_certificate_to_the_next_connection_without_restart(pki):
    cert, key = pki.client_certificate("kvpool://node/node-0", "node-0")
    files = pki.client_files(cert, key)

    async def body(port: int) -> None:
        before = served_serial(pki)
        assert await handshake_serial(port, client_ssl_context(files)) == before
        pki.reissue_server()
        after = served_serial(pki)
        assert after != before
        assert await handshake_serial(port, client_ssl_context(files)) == after
        assert "node-0" in await call(port, files)  # and calls go on, on new channels

    asyncio.run(with_grpc_server(grpc_server_credentials(pki.server_files(), True), body))


# --- the lane: asyncio streams with an ssl context ------------------------------------------


async def with_lane_server(
    contexts: ServerContexts, body: Callable[[int, list[Identity | None]], Awaitable[None]]
) -> None:
    callers: list[Identity | None] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        certificate = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        callers.append(identity_from_certificate(certificate) if certificate else None)
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=contexts.listening_context())
    try:
        await body(server.sockets[0].getsockname()[1], callers)
    finally:
        server.close()
        await server.wait_closed()


async def refused(port: int, context: ssl.SSLContext) -> bool:
    """True when the server does not answer a connection made with ``context``. (In TLS 1.3
    the client's handshake ends before the server checks the client's certificate: a refusal
    may come as an alert, or as a connection closed without an answer.)"""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    except (ssl.SSLError, ConnectionError):
        return True
    try:
        return await reader.read() != b"ok"
    except (ssl.SSLError, ConnectionError):
        return True
    finally:
        writer.close()


async def lane_call(port: int, context: ssl.SSLContext, host: str = "127.0.0.1") -> int:
    """Connects, reads the answer; the serial number of the server's certificate."""
    reader, writer = await asyncio.open_connection(host, port, ssl=context)
    try:
        assert await reader.read() == b"ok"
        return serial_of(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
    finally:
        writer.close()


def test_the_lane_serves_a_rotated_certificate_to_the_next_connection_without_restart(pki):
    contexts = ServerContexts(pki.server_files(), require_client_cert=False, check_interval=0)

    async def body(port: int, callers: list[Identity | None]) -> None:
        client = client_ssl_context(pki.client_files())
        before = served_serial(pki)
        assert await lane_call(port, client) == before
        assert await lane_call(port, client, host="localhost") == before  # with SNI, too
        pki.reissue_server()
        after = served_serial(pki)
        assert await lane_call(port, client) == after != before
        assert await lane_call(port, client, host="localhost") == after
        assert callers == [None] * 4  # no client certificate asked of them

    asyncio.run(with_lane_server(contexts, body))


def test_the_lane_keeps_serving_the_old_pair_while_a_rotation_is_half_done(pki, tmp_path):
    contexts = ServerContexts(pki.server_files(), require_client_cert=False, check_interval=0)
    before = served_serial(pki)
    old_key = pki.server_key.read_bytes()
    pki.reissue_server()
    new_key = pki.server_key.read_bytes()
    pki.server_key.write_bytes(old_key)  # the new certificate beside the old key

    async def body(port: int, callers: list[Identity | None]) -> None:
        client = client_ssl_context(pki.client_files())
        assert await lane_call(port, client) == before
        write_atomically(pki.server_key, new_key)  # the rotation completes
        assert await lane_call(port, client) == served_serial(pki) != before

    asyncio.run(with_lane_server(contexts, body))


def test_the_lane_with_client_certificates_required_knows_the_caller_and_refuses_the_rest(pki):
    contexts = ServerContexts(pki.server_files(), require_client_cert=True, check_interval=0)
    cert, key = pki.client_certificate("kvpool://node/node-0", "node-0")
    stranger = make_dev_pki(pki.directory / "stranger")
    foreign_cert, foreign_key = stranger.client_certificate("kvpool://admin/mallory", "mallory")

    async def body(port: int, callers: list[Identity | None]) -> None:
        await lane_call(port, client_ssl_context(pki.client_files(cert, key)))
        assert callers == [Identity(name="node-0", role=Role.NODE, node_id="node-0")]
        assert await refused(port, client_ssl_context(pki.client_files()))
        assert await refused(port, client_ssl_context(pki.client_files(foreign_cert, foreign_key)))
        assert len(callers) == 1

    asyncio.run(with_lane_server(contexts, body))


def test_a_client_checks_the_servers_name_unless_told_not_to(tmp_path):
    named = make_dev_pki(tmp_path / "named", hosts=["kvpool-master.example"])
    contexts = ServerContexts(named.server_files(), require_client_cert=False)

    async def body(port: int, callers: list[Identity | None]) -> None:
        with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
            await lane_call(port, client_ssl_context(named.client_files()))
        unchecked = client_ssl_context(named.client_files(), server_hostname_check=False)
        assert await lane_call(port, unchecked) == served_serial(named)

    asyncio.run(with_lane_server(contexts, body))
