"""Every mistake a user can make gets a typed exception that says what to do."""

from __future__ import annotations

import socket
import time
import uuid

import pytest
from helpers import cluster_status

from kvpool import Client
from kvpool.errors import (
    BufferTooSmall,
    InvalidArgument,
    InvalidKey,
    MasterUnavailable,
    NoSpace,
    ObjectExists,
    ObjectNotFound,
)


@pytest.fixture(scope="module")
def client(shared_cluster):
    with Client(shared_cluster.master_address) as client:
        yield client


def test_putting_an_existing_key_raises_object_exists(client):
    key = f"dup-{uuid.uuid4().hex}"
    client.put(key, b"first")
    with pytest.raises(ObjectExists, match="immutable"):
        client.put(key, b"second")
    assert client.get(key) == b"first"


def test_getting_a_missing_key_raises_object_not_found(client):
    with pytest.raises(ObjectNotFound, match="never put"):
        client.get("no-such-key")
    with pytest.raises(ObjectNotFound):
        client.get_into("no-such-key", bytearray(10))


def test_removing_a_missing_key_raises_object_not_found(client):
    with pytest.raises(ObjectNotFound):
        client.remove("no-such-key")


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "empty"),
        ("k" * 1025, "1025 bytes"),
        ("\u00e9" * 513, "1026 bytes"),  # 513 characters, 1026 bytes of UTF-8
        ("bad-\ud800-surrogate", "UTF-8"),
        (b"bytes-key", "str"),
    ],
    ids=["empty", "too-long", "too-long-utf8", "not-utf8", "not-str"],
)
def test_bad_keys_raise_invalid_key(client, key, why):
    for call in (
        lambda: client.put(key, b"x"),
        lambda: client.get(key),
        lambda: client.exists(key),
        lambda: client.remove(key),
    ):
        with pytest.raises(InvalidKey, match=why):
            call()


def test_a_key_of_exactly_1024_bytes_is_fine(client):
    key = "k" * 1000 + uuid.uuid4().hex[:24]
    client.put(key, b"ok")
    assert client.get(key) == b"ok"


def test_an_object_larger_than_any_segment_raises_no_space_with_sizes(client):
    with pytest.raises(NoSpace) as caught:
        client.put(f"huge-{uuid.uuid4().hex}", bytes(700 << 20))
    message = str(caught.value)
    assert "700.0 MiB" in message and "largest free extent" in message


def test_data_that_is_not_a_buffer_raises_invalid_argument(client):
    with pytest.raises(InvalidArgument, match="contiguous buffer"):
        client.put("not-a-buffer", 12345)


def test_get_into_a_too_small_buffer_raises_buffer_too_small(client):
    key = f"small-{uuid.uuid4().hex}"
    client.put(key, b"0123456789")
    with pytest.raises(BufferTooSmall, match="10 bytes"):
        client.get_into(key, bytearray(4))


def test_get_into_a_read_only_buffer_raises_invalid_argument(client):
    key = f"ro-{uuid.uuid4().hex}"
    client.put(key, b"0123456789")
    with pytest.raises(InvalidArgument, match="writable"):
        client.get_into(key, b"immutable!")


def test_a_missing_master_address_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("KVPOOL_MASTER", raising=False)
    with pytest.raises(InvalidArgument, match="KVPOOL_MASTER"):
        Client()


def test_a_malformed_master_address_is_rejected():
    with pytest.raises(InvalidArgument, match="HOST:PORT"):
        Client("localhost")


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_copy_threads_must_be_a_positive_integer(threads):
    with pytest.raises(InvalidArgument, match="copy_threads must be an integer >= 1"):
        Client("127.0.0.1:1", copy_threads=threads)


def test_the_master_address_can_come_from_the_environment(shared_cluster, monkeypatch):
    monkeypatch.setenv("KVPOOL_MASTER", shared_cluster.master_address)
    with Client() as client:
        assert client.master == shared_cluster.master_address
        assert cluster_status(client.master).nodes == 2


def test_an_unreachable_master_raises_master_unavailable_within_the_deadline():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"127.0.0.1:{port}", timeout=1.0) as client:
        start = time.monotonic()
        with pytest.raises(MasterUnavailable, match=f"127.0.0.1:{port}"):
            client.put("k", b"v")
        assert time.monotonic() - start < 2.0
        with pytest.raises(MasterUnavailable):
            client.get("k")
