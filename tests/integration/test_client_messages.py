"""Mistakes a client's user makes are refused at once, by name, with advice that works.

An ``AsyncClient``'s settings are its ``Client``'s (set, checked and followed as there, not
kept aside where they change nothing); a URL or an odd port given for the master is refused
before any call waits out its timeout; a gRPC server that is not a kvpool master is named as
such; a remove refused for a lease this client's own read took says how to end that lease; a
prefix longer than any key is refused as that, not as a batch to split; and ``put_tensors``
names itself for an option it does not take.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
import torch

from kvpool import Client
from kvpool.aio import AsyncClient
from kvpool.common.keys import STORED_KEY_BYTES
from kvpool.errors import InvalidArgument, MasterUnavailable, NotVerifiable, ObjectHasLease
from kvpool.local_cluster import LocalCluster

#: Bad values of each setting ``Client`` lets be set later (as tests/unit's list of them).
BAD = {
    "timeout": [float("nan"), -1.0, 0, "5", None],
    "replicas": [0, -1, 1.5, "2", True],
    "checksum": ["nope", 1, None],
    "prefer_local": ["yes", 0, None],
}
#: What makes a client of a secure cluster: a client of a plain gRPC server has none.
CREDENTIAL_ENV = (
    "KVPOOL_TOKEN",
    "KVPOOL_TOKEN_FILE",
    "KVPOOL_TLS_CA",
    "KVPOOL_TLS_CERT",
    "KVPOOL_TLS_KEY",
)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def client(shared_cluster: LocalCluster) -> Iterator[Client]:
    with Client(shared_cluster.master_address, timeout=30) as client:
        yield client


# ------------------------------------------------------------------ AsyncClient's settings


def test_an_async_clients_settings_set_later_are_followed_by_its_calls(
    shared_cluster: LocalCluster,
) -> None:
    async def main() -> None:
        plain, checked, copied = unique("plain"), unique("checked"), unique("copied")
        async with AsyncClient(shared_cluster.master_address, timeout=30) as client:
            client.timeout = 5
            assert client.timeout == 5.0 and client._client.timeout == 5.0
            client.prefer_local = True
            assert client.prefer_local is True
            client.prefer_local = False

            await client.put(plain, b"no checksum")
            with pytest.raises(NotVerifiable):
                await client.get(plain, verify=True)
            client.checksum = True
            assert client.checksum is True
            await client.put(checked, b"with checksum")
            assert await client.get(checked, verify=True) == b"with checksum"

            client.replicas = 2
            assert client.replicas == 2
            assert await client.put(copied, b"two copies") == 2
            await client.remove_many([plain, checked, copied], force=True)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("name", "value"), [(name, value) for name, values in BAD.items() for value in values]
)
def test_an_async_client_refuses_a_bad_setting_as_client_does_and_keeps_the_old_one(
    shared_cluster: LocalCluster, name: str, value: object
) -> None:
    async def main() -> None:
        async with AsyncClient(shared_cluster.master_address, timeout=30) as client:
            before = getattr(client, name)
            with pytest.raises(InvalidArgument, match=name):
                setattr(client, name, value)
            assert getattr(client, name) == before
            assert getattr(client._client, name) == before

    asyncio.run(main())


def test_an_async_client_refuses_an_attribute_it_does_not_have(
    shared_cluster: LocalCluster,
) -> None:
    """A misspelt setting would otherwise be kept aside, silently followed by nothing."""

    async def main() -> None:
        async with AsyncClient(shared_cluster.master_address, timeout=30) as client:
            with pytest.raises(AttributeError):
                client.replica = 2  # type: ignore[attr-defined]
            assert client.replicas is None

    asyncio.run(main())


# ------------------------------------------------------------------ the master's address


@pytest.mark.parametrize("scheme", ["http", "https", "grpc"])
def test_a_url_for_the_master_is_refused_at_once_saying_to_drop_its_scheme(
    shared_cluster: LocalCluster, scheme: str
) -> None:
    """gRPC would look ``http://HOST`` up as a host name: every call waited out its timeout."""
    started = time.monotonic()
    with pytest.raises(InvalidArgument, match=f"drop the {scheme}://"):
        Client(f"{scheme}://{shared_cluster.master_address}", timeout=5)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("port", ["٣٨٥٣٥", "²", "0", "65536"])
def test_a_port_of_the_master_other_than_1_to_65535_in_ascii_digits_is_refused(
    port: str,
) -> None:
    with pytest.raises(InvalidArgument, match="1 to 65535 in ASCII digits"):
        Client(f"127.0.0.1:{port}", timeout=5)


def test_a_grpc_server_that_is_not_a_kvpool_master_is_named_as_such(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It answers every call UNIMPLEMENTED ("Method not found!"), which said nothing of the
    address given; no retry makes it answer, so the call fails at once, not retryable."""
    for name in CREDENTIAL_ENV:  # (the server is plain gRPC: no TLS, no token)
        monkeypatch.delenv(name, raising=False)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        address = f"127.0.0.1:{port}"
        with Client(address, timeout=20) as client:
            started = time.monotonic()
            with pytest.raises(MasterUnavailable) as raised:
                client.get("some-key")
            assert time.monotonic() - started < 5
    finally:
        server.stop(None)
    message = str(raised.value)
    assert f"{address} answered but is not a kvpool master" in message
    assert "check --master" in message
    assert raised.value.retryable is False


def test_closing_a_client_no_master_ever_answered_does_not_wait_on_one_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A get at an address that takes connections and never answers waits out its timeout;
    close() then gave back the leases that get might have taken, waiting up to 2 s more on
    the same silence. No master ever answered: no lease to give back."""
    for name in CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        client = Client(address, timeout=1)
        with pytest.raises(MasterUnavailable):
            client.get("some-key")
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < 0.5


# ------------------------------------------------------------------ leases


def test_a_remove_refused_for_this_clients_own_read_lease_says_how_to_end_it(
    client: Client,
) -> None:
    key = unique("leased")
    client.put(key, b"read, then removed")
    assert client.get(key) == b"read, then removed"  # (leases it)
    with pytest.raises(ObjectHasLease) as raised:
        client.remove(key)
    message = str(raised.value)
    assert "this client included" in message
    assert "client.release_leases([key])" in message
    assert "lease runs out" in message
    # the advice works: its own lease ended, the object goes
    assert client.release_leases([key]) == 1
    client.remove(key)
    assert client.exists(key, lease=False) is False


# ------------------------------------------------------------------ prefixes


def test_a_prefix_longer_than_any_key_is_refused_by_name_not_as_a_batch(client: Client) -> None:
    prefix = "x" * 5_000_000
    with pytest.raises(InvalidArgument, match="longer than the longest key") as listed:
        client.list_keys(prefix)
    with pytest.raises(InvalidArgument, match="longer than the longest key") as removed:
        client.remove_prefix(prefix)
    for raised in (listed, removed):
        assert "split the batch" not in str(raised.value)
        assert f"{STORED_KEY_BYTES}" in str(raised.value)


def test_a_prefix_as_long_as_the_longest_key_an_admin_names_is_taken(client: Client) -> None:
    """An admin names keys behind their tenant's name: such a prefix may match a key."""
    prefix = "y" * STORED_KEY_BYTES
    assert client.list_keys(prefix).keys == []
    assert client.remove_prefix(prefix).removed == 0


# ------------------------------------------------------------------ tensors


def test_put_tensors_names_itself_for_an_option_it_does_not_take(
    client: Client, shared_cluster: LocalCluster
) -> None:
    key = unique("tensor")
    with pytest.raises(
        TypeError, match=r"^put_tensors\(\) got an unexpected keyword argument 'bogus'"
    ):
        client.put_tensors([(key, torch.zeros(4))], bogus=1)

    async def main() -> None:
        async with AsyncClient(shared_cluster.master_address, timeout=30) as aclient:
            with pytest.raises(TypeError, match=r"^put_tensors\(\)"):
                await aclient.put_tensors([(key, torch.zeros(4))], bogus=1)

    asyncio.run(main())
    assert client.exists(key, lease=False) is False  # (nothing was put)
