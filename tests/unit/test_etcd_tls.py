"""etcd over TLS: a real etcd that asks for client certificates, reached by aetcd on a TLS
channel; endpoints say whether they are TLS, and are never quietly connected without it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aetcd
import pytest

from kvpool.etcd_process import EtcdProcess
from kvpool.security.dev_pki import DevPki, make_dev_pki
from kvpool.security.etcd_tls import (
    EtcdEndpointError,
    TlsEtcdClient,
    etcd_client,
    parse_etcd_endpoint,
)
from kvpool.security.tls import TlsConfigError, TlsFiles

#: Errors of aetcd for a connection refused in the handshake.
REFUSED = (aetcd.ClientError, ConnectionError, asyncio.TimeoutError)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return make_dev_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def etcd(pki: DevPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    process = EtcdProcess(tmp_path_factory.mktemp("etcd"), tls=pki).start()
    try:
        yield process
    finally:
        process.close()


def test_a_tls_etcd_is_reached_at_an_https_url(etcd, tmp_path):
    assert etcd.url == f"https://{etcd.endpoint}"
    assert etcd.endpoint.startswith("127.0.0.1:")
    assert EtcdProcess(tmp_path / "plain").url.startswith("http://127.0.0.1:")  # as before


def test_a_client_with_a_certificate_of_the_ca_puts_and_gets(etcd, pki):
    cert, key = pki.client_certificate("kvpool://admin/master-0", "master-0")

    async def run() -> bytes:
        async with etcd_client(etcd.url, pki.client_files(cert, key), timeout=5) as client:
            await client.put(b"kvpool/test", b"over tls")
            got = await client.get(b"kvpool/test")
            return bytes(got.value)

    assert asyncio.run(run()) == b"over tls"


@pytest.mark.parametrize("who", ["no certificate", "a certificate of another CA"])
def test_a_client_without_a_certificate_of_the_ca_is_refused(etcd, pki, who, tmp_path):
    if who == "no certificate":
        files = pki.client_files()
    else:
        stranger = make_dev_pki(tmp_path / "stranger")
        cert, key = stranger.client_certificate("kvpool://admin/mallory", "mallory")
        files = TlsFiles(cert=cert, key=key, ca=pki.ca)

    async def run() -> None:
        client = TlsEtcdClient("127.0.0.1", etcd.client_port, tls=files, timeout=3)
        try:
            await client.put(b"kvpool/test", b"should not land")
        finally:
            await client.close()

    with pytest.raises(REFUSED):
        asyncio.run(run())


def test_a_plain_text_client_of_a_tls_etcd_gets_nothing(etcd):
    async def run() -> None:
        async with aetcd.Client("127.0.0.1", etcd.client_port, timeout=3) as client:
            await client.get(b"kvpool/test")

    with pytest.raises(REFUSED):
        asyncio.run(run())


def test_wrong_tls_files_are_refused_before_any_connection(tmp_path):
    with pytest.raises(TlsConfigError, match="does not exist"):
        TlsEtcdClient("127.0.0.1", 2379, tls=TlsFiles(ca=tmp_path / "missing.crt"))


# --- endpoints ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "with_tls", "parsed"),
    [
        ("127.0.0.1:2379", False, ("http", "127.0.0.1", 2379)),
        ("127.0.0.1:2379", True, ("https", "127.0.0.1", 2379)),
        ("http://etcd-0.etcd:2379", False, ("http", "etcd-0.etcd", 2379)),
        ("https://etcd-0.etcd:2379/", True, ("https", "etcd-0.etcd", 2379)),
        ("HTTPS://[::1]:2379", True, ("https", "::1", 2379)),
        ("[::1]:2379", False, ("http", "::1", 2379)),
    ],
)
def test_an_endpoint_says_whether_it_is_tls(text, with_tls, parsed):
    tls = TlsFiles(ca=Path("ca.crt")) if with_tls else None
    assert parse_etcd_endpoint(text, tls) == parsed


def test_https_without_a_ca_is_refused_not_downgraded():
    with pytest.raises(EtcdEndpointError, match=r"is https:// but no --etcd-ca given"):
        parse_etcd_endpoint("https://etcd:2379", None)
    with pytest.raises(EtcdEndpointError, match=r"is https:// but no --etcd-ca given"):
        parse_etcd_endpoint("https://etcd:2379", TlsFiles(cert=Path("c"), key=Path("k")))


def test_http_with_tls_files_is_refused_not_connected_in_plain_text():
    with pytest.raises(EtcdEndpointError, match=r"is http:// \(plain text\) but TLS files"):
        parse_etcd_endpoint("http://etcd:2379", TlsFiles(ca=Path("ca.crt")))


def test_without_tls_files_named_an_endpoint_is_parsed_only():
    assert parse_etcd_endpoint("https://etcd:2379") == ("https", "etcd", 2379)
    assert parse_etcd_endpoint("etcd:2379") == ("http", "etcd", 2379)


def test_a_client_of_an_endpoint_is_tls_when_the_endpoint_is(pki):
    assert etcd_client("127.0.0.1:2379", pki.client_files()).tls == pki.client_files()
    assert etcd_client("http://127.0.0.1:2379", None).tls is None
    with pytest.raises(EtcdEndpointError, match="no --etcd-ca given"):
        etcd_client("https://127.0.0.1:2379")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("etcd", "has no port"),
        ("etcd:", "has no port"),
        ("etcd:99999", "has no port"),
        ("grpc://etcd:2379", "has scheme 'grpc'"),
        ("::1:2379", "IPv6 address in brackets"),
        ("[nonsense]:2379", "no IPv6 address"),
    ],
)
def test_an_endpoint_that_does_not_parse_says_what_to_write(text, says):
    with pytest.raises(EtcdEndpointError, match=says):
        parse_etcd_endpoint(text)


def test_a_campaign_outlives_tls_files_it_cannot_read_and_is_elected_once_they_are_right(
    etcd, pki, tmp_path
):
    """(The etcd client was made outside the round's error handling: a key file unreadable
    at that moment, say halfway through a certificate's renewal, ended the campaign for
    good, and the master sat a standby with nothing more logged.)"""
    from kvpool.master.election import Election

    cert, key = pki.client_certificate("kvpool://admin/master-0", "master-0")
    renewing = tmp_path / "master.key"  # (missing for now)
    elected: list[int] = []

    async def scenario() -> tuple[bool, str]:
        files = TlsFiles(cert=cert, key=renewing, ca=pki.ca)
        election = Election([etcd.endpoint], "renewal", "127.0.0.1:1", 2, tls=files)
        stop = asyncio.Event()

        async def on_elected(epoch: int) -> None:
            elected.append(epoch)
            stop.set()

        async def on_lost() -> None:
            pass

        campaign = asyncio.create_task(election.run(stop, on_elected, on_lost))
        await asyncio.sleep(1.5)  # (a few rounds, each failing on the key file)
        failing = (not campaign.done(), election.in_touch()[1])
        renewing.write_bytes(key.read_bytes())
        await asyncio.wait_for(campaign, 30)
        return failing

    still_campaigning, why = asyncio.run(scenario())
    assert still_campaigning, "the campaign ended"
    assert "master.key" in why, why
    assert len(elected) == 1
