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


NOT_DURATIONS = [float("nan"), float("inf"), -1.0, 5e6, "5", True]


@pytest.mark.parametrize("value", [*NOT_DURATIONS, 0], ids=repr)
def test_a_timeout_must_be_a_finite_positive_number_of_seconds(value):
    # (a NaN passed `timeout <= 0` and then never ran out: a call retried without end)
    with pytest.raises(InvalidArgument, match="timeout must be"):
        Client("127.0.0.1:1", timeout=value)


@pytest.mark.parametrize("value", NOT_DURATIONS, ids=repr)
def test_a_lease_ttl_must_be_a_finite_number_of_seconds_the_wire_holds(value):
    with pytest.raises(InvalidArgument, match="lease_ttl must be"):
        Client("127.0.0.1:1", lease_ttl=value)


@pytest.mark.parametrize("value", NOT_DURATIONS, ids=repr)
def test_a_pin_ttl_must_be_a_finite_number_of_seconds_the_wire_holds(client, value):
    with pytest.raises(InvalidArgument, match="pin_ttl must be"):
        client.put(f"pin-{uuid.uuid4().hex}", b"v", pin="soft", pin_ttl=value)


def test_numbers_past_their_wire_fields_are_refused_naming_the_argument(client):
    with pytest.raises(InvalidArgument, match="replicas must be"):
        client.put(f"r-{uuid.uuid4().hex}", b"v", replicas=2**32)
    for size in (-1, 2**70, 1.5):
        with pytest.raises(InvalidArgument, match="size must be"):
            client.reserve(f"s-{uuid.uuid4().hex}", size)
    with pytest.raises(InvalidArgument, match="limit must be"):
        client.list_keys(limit=-1)


def test_a_batch_larger_than_the_master_reads_says_to_split_it(client):
    # 80 MB of keys: beyond the largest request the master reads (lane_protocol's
    # REQUEST_LIMIT), which it would drop unread; no retry can help
    keys = [f"{i:08d}".ljust(1000, "k") for i in range(80_000)]
    start = time.monotonic()
    with pytest.raises(InvalidArgument, match="split the batch"):
        client.exists_many(keys)
    assert time.monotonic() - start < 2.0, "refused before sending, not after retries"


def test_bad_ucx_settings_raise_invalid_argument_naming_them():
    with pytest.raises(InvalidArgument, match="BOGUS_SETTING"):
        Client("127.0.0.1:1", ucx_config={"BOGUS_SETTING": "x"})


def test_a_ca_file_gone_before_a_connection_is_made_raises_invalid_argument(
    shared_cluster, tmp_path
):
    # (the TLS files are read again for each new connection, so that rotated ones are taken)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(shared_cluster.pki.ca.read_bytes())
    with Client(shared_cluster.master_address, tls_ca=str(ca), timeout=5) as client:
        ca.unlink()
        start = time.monotonic()
        with pytest.raises(InvalidArgument, match="does not exist"):
            client.exists("k")
        assert time.monotonic() - start < 1.0, "said at once, not retried to the deadline"


def test_a_ca_file_gone_before_the_lane_is_opened_raises_invalid_argument(shared_cluster, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(shared_cluster.pki.ca.read_bytes())
    with Client(shared_cluster.master_address, tls_ca=str(ca), timeout=5) as client:
        client.cluster_status()  # (over gRPC: the channel is open, the lane not yet)
        ca.unlink()
        start = time.monotonic()
        with pytest.raises(InvalidArgument, match="does not exist"):
            client.exists("k")  # (a lane method: its connection reads the CA)
        assert time.monotonic() - start < 1.0, "said at once, not retried to the deadline"


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
