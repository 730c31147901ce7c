"""``Client.timeout``, ``replicas``, ``checksum`` and ``prefer_local`` may be set after the
client is made (the vLLM and LMCache adapters set a timeout per job). Each is checked as the
constructor checks it: a NaN or infinite timeout would take every deadline away (calls that
hang), a str would fail untyped deep inside a call. And a new value applies to the whole of
every call after, reservations and a put's settling included (they read the session's)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from kvpool import Client
from kvpool.errors import InvalidArgument, NotVerifiable
from kvpool.local_cluster import LocalCluster

BAD = {
    "timeout": [float("nan"), float("inf"), -1.0, 0, "5", None, True],
    "replicas": [0, -1, 1.5, "2", True],
    "checksum": ["no", 1, None],
    "prefer_local": ["yes", 0, None],
}


@pytest.fixture(scope="module")
def client(shared_cluster: LocalCluster) -> Iterator[Client]:
    with Client(shared_cluster.master_address, timeout=30) as client:
        yield client


@pytest.mark.parametrize(
    ("name", "value"), [(name, value) for name, values in BAD.items() for value in values]
)
def test_a_bad_value_is_refused_and_the_old_one_kept(
    client: Client, name: str, value: object
) -> None:
    before = getattr(client, name)
    with pytest.raises(InvalidArgument, match=name):
        setattr(client, name, value)
    assert getattr(client, name) == before


def test_a_new_timeout_is_the_whole_clients() -> None:
    """The session's (which reservations and a put's settling read) follows the client's."""
    with Client("127.0.0.1:1", timeout=30) as client:
        client.timeout = 2
        assert client.timeout == 2.0
        assert isinstance(client.timeout, float)
        assert client._session.timeout == 2.0


def test_a_new_replicas_applies_to_later_puts(client: Client) -> None:
    key = f"replicas-{uuid.uuid4().hex[:8]}"
    client.replicas = 2
    try:
        assert client.put(key, b"two copies") == 2
    finally:
        client.replicas = None
    assert client.replicas is None
    client.remove(key, force=True)


def test_a_new_checksum_applies_to_later_puts(client: Client) -> None:
    """Put without one, a DRAM object cannot be verified; with one set later, it can."""
    plain, checked = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("plain", "checked"))
    client.put(plain, b"no checksum")
    with pytest.raises(NotVerifiable):
        client.get(plain, verify=True)
    client.checksum = True
    try:
        client.put(checked, b"with checksum")
    finally:
        client.checksum = False
    assert client.get(checked, verify=True) == b"with checksum"
    client.remove_many([plain, checked], force=True)


def test_prefer_local_may_be_turned_on_and_off(client: Client) -> None:
    key = f"local-{uuid.uuid4().hex[:8]}"
    client.prefer_local = True
    try:
        assert client.put(key, b"here") >= 1
    finally:
        client.prefer_local = False
    assert client.prefer_local is False
    client.remove(key, force=True)
