"""Every mistake a user can make gets a typed exception that says what to do."""

from __future__ import annotations

import contextlib
import socket
import time
import uuid

import pytest
from helpers import cluster_status

from kvpool import Client
from kvpool.common import lane_protocol as lp
from kvpool.errors import (
    BufferTooSmall,
    InvalidArgument,
    InvalidKey,
    MasterUnavailable,
    NoSpace,
    ObjectBeingWritten,
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


def test_the_longest_timeout_a_client_takes_works_as_any_other(shared_cluster):
    """``select.poll`` takes at most 2**31-1 ms (about 24.8 days): a longer timeout, which
    the client accepts (up to MAX_SECONDS), raised OverflowError from deep inside."""
    from kvpool.common.limits import MAX_SECONDS

    with Client(shared_cluster.master_address, timeout=MAX_SECONDS) as patient:
        with pytest.raises(ObjectNotFound):
            patient.get("never-put")
        patient.put("patiently", b"p")
        assert patient.get("patiently") == b"p"
        patient.remove("patiently", force=True)  # (its own read leased it)


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


def test_a_batch_of_more_keys_than_one_call_takes_is_split_and_answered_per_key(client):
    # 20 MB of keys: more than one call may carry (lane_protocol's MAX_BATCH_KEYS, and its
    # REQUEST_LIMIT in bytes); the client sends them in parts and answers each key
    keys = [f"{i:08d}".ljust(1000, "k") for i in range(20_000)]
    assert len(keys) > 4 * lp.MAX_BATCH_KEYS
    assert client.exists_many(keys) == [False] * len(keys)


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


# ---------------------------------------------------------------- arguments of the wrong shape


@pytest.mark.parametrize("call", ["remove_many", "exists_many", "get_many"])
def test_one_str_where_a_list_of_keys_belongs_is_refused_not_split_into_characters(client, call):
    for character in "xy":
        with contextlib.suppress(ObjectExists):
            client.put(character, b"an object under a one-character key")
    with pytest.raises(InvalidArgument, match="a list of keys, not one str: for one key"):
        getattr(client, call)("xy")
    assert client.exists_many(["x", "y"], lease=False) == [True, True]  # neither was removed


def test_keys_may_come_from_any_iterable(client):
    key = f"iterable-{uuid.uuid4().hex}"
    client.put(key, b"found")
    assert client.get_many(k for k in [key]) == [b"found"]
    assert client.exists_many(iter([key]), lease=False) == [True]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (None, "takes a dict of key -> data or a list of"),
        ("kk", "takes a dict of key -> data or a list of"),
        ([("k", b"x", 1)], r"\(key, data\) pairs: entry 0 is"),
        ([("k",)], r"\(key, data\) pairs: entry 0 is"),
    ],
)
def test_a_put_batch_that_is_not_key_data_pairs_is_refused(client, items, message):
    with pytest.raises(InvalidArgument, match=message):
        client.put_many(items)


def test_numpy_arrays_of_python_objects_are_refused_both_ways(client):
    np = pytest.importorskip("numpy")
    key = f"objects-{uuid.uuid4().hex}"
    with pytest.raises(InvalidArgument, match="Python object references"):
        client.put(key, np.array([object(), object()]))
    client.put(key, bytes(16))
    target = np.empty(2, dtype=object)
    with pytest.raises(InvalidArgument, match="Python object references"):
        client.get_into(key, target)
    assert target[0] is None  # (no pointer was overwritten)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"checksum": "no"}, "checksum must be True or False"),
        ({"preferred_hosts": "host1"}, "preferred_hosts must be a list of str, not one str"),
        ({"preferred_hosts": [1]}, "each of preferred_hosts must be a str"),
        ({"pin": []}, "pin must be None, 'soft' or 'hard'"),
        ({"tier": {}}, "tier must be None, 'any', 'dram' or 'nvme'"),
    ],
)
def test_put_options_of_the_wrong_type_are_refused_naming_them(client, options, message):
    with pytest.raises(InvalidArgument, match=message):
        client.put(f"options-{uuid.uuid4().hex}", b"x", **options)


def test_a_misspelt_put_option_names_the_call_it_was_given_to(client):
    with pytest.raises(TypeError, match=r"put\(\) got an unexpected keyword argument 'replica'"):
        client.put(f"misspelt-{uuid.uuid4().hex}", b"x", replica=2)


def test_flags_of_removals_and_reads_are_true_or_false(client):
    with pytest.raises(InvalidArgument, match="force must be True or False"):
        client.remove("some-key", force="no")
    with pytest.raises(InvalidArgument, match="verify must be True or False"):
        client.get("some-key", verify="yes")


@pytest.mark.parametrize("text", ["\ud800", 5])
def test_prefixes_that_cannot_go_on_the_wire_are_refused(client, text):
    with pytest.raises(InvalidArgument, match="prefix"):
        client.list_keys(text)
    with pytest.raises(InvalidArgument, match="prefix"):
        client.remove_prefix(text)
    with pytest.raises(InvalidArgument, match="start_after"):
        client.list_keys("", start_after=text)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"master": 123}, "the master address must be a str"),
        ({"token": 123}, "the kvpool token must be a str"),
        ({"tls_ca": 123}, "tls_ca must be the path of a PEM file"),
        ({"ucx_config": {"TLS": 1}}, "ucx_config must map str to str"),
        ({"ucx_config": "TLS=tcp"}, "ucx_config must map str to str"),
        ({"checksum": "no"}, "checksum must be True or False"),
        ({"metadata_lane": 1}, "metadata_lane must be True or False"),
    ],
)
def test_client_arguments_of_the_wrong_type_are_refused_naming_them(arguments, message):
    arguments = {"master": "127.0.0.1:1", **arguments}
    with pytest.raises(InvalidArgument, match=message):
        Client(arguments.pop("master"), **arguments)


@pytest.mark.parametrize("key", [["a"], {}, b"bytes", None])
def test_exists_of_a_key_that_is_not_a_str_is_invalid_key_and_leases_nothing(client, key):
    with pytest.raises(InvalidKey, match="keys are str"):
        client.exists(key)
    valid = f"exists-{uuid.uuid4().hex}"
    client.put(valid, b"x")
    found = client.exists_many([valid, key, "never-put-" + valid])
    assert found[0] is True and isinstance(found[1], InvalidKey) and found[2] is False
    assert valid in client._leased and "never-put-" + valid not in client._leased


def test_tensor_reads_check_their_keys_and_flags(client):
    pytest.importorskip("torch")
    with pytest.raises(InvalidArgument, match="a list of keys, not one str: for one key"):
        client.get_tensors("tg")
    with pytest.raises(InvalidArgument, match="verify must be True or False"):
        client.get_tensors([f"t-{uuid.uuid4().hex}"], verify="yes")
    with pytest.raises(InvalidArgument, match="verify must be True or False"):
        client.get_tensor(f"t-{uuid.uuid4().hex}", verify=1)
    with pytest.raises(InvalidArgument, match="takes a list of keys"):
        client.get_tensors(5)
    import torch

    keys = [f"t-{uuid.uuid4().hex}" for _ in range(2)]
    client.put_tensors([(k, torch.arange(4) + i) for i, k in enumerate(keys)])
    got = client.get_tensors(k for k in keys)  # (any iterable of keys, as get_many)
    assert [t.tolist() for t in got] == [[0, 1, 2, 3], [1, 2, 3, 4]]


# ---------------------------------------------------------------- reservations step by step


def test_a_committed_reservation_can_be_neither_revoked_nor_written(client):
    key = f"res-{uuid.uuid4().hex}"
    reservation = client.reserve(key, 4)
    reservation.write(b"abcd")
    replicas = reservation.commit()
    assert replicas >= 1 and reservation.commit() == replicas  # (again: the same answer)
    with pytest.raises(InvalidArgument, match="was committed, and the object is published"):
        reservation.revoke()
    with pytest.raises(InvalidArgument, match="was committed"):
        reservation.write(b"wxyz")
    assert client.get(key) == b"abcd"


def test_a_revoked_reservation_can_be_neither_written_nor_committed(client):
    key = f"res-{uuid.uuid4().hex}"
    reservation = client.reserve(key, 4)
    reservation.revoke()
    reservation.revoke()  # (again: nothing more to give up)
    with pytest.raises(InvalidArgument, match="was revoked"):
        reservation.write(b"abcd")
    with pytest.raises(InvalidArgument, match="was revoked"):
        reservation.commit()
    with pytest.raises(ObjectNotFound):
        client.get(key)
    again = client.reserve(key, 4)  # (the key is free)
    again.write(b"abcd")
    again.commit()
    assert client.get(key) == b"abcd"


def test_an_empty_reservation_commits_without_a_write(client):
    key = f"res-{uuid.uuid4().hex}"
    assert client.reserve(key, 0).commit() >= 1
    assert client.get(key) == b""
    assert client.stat(key).state == "published"
    with pytest.raises(InvalidArgument, match=r"write 'res-.*' before committing it"):
        client.reserve(f"res-{uuid.uuid4().hex}", 4).commit()


def test_a_client_without_the_ca_of_a_tls_master_is_told_to_give_it(shared_cluster, monkeypatch):
    monkeypatch.delenv("KVPOOL_TLS_CA", raising=False)
    assert shared_cluster.secure, "the tests' clusters serve TLS"
    token = shared_cluster.client_credentials()["token"]
    client = Client(shared_cluster.master_address, token=token, timeout=2)
    with client, pytest.raises(MasterUnavailable, match=r"without TLS \(no CA given\)") as error:
        client.exists("k")
    assert "KVPOOL_TLS_CA" in str(error.value) and "client certificate" not in str(error.value)


def test_a_put_of_a_key_this_client_holds_reserved_says_it_is_its_own(client):
    """As when a put's answer was lost (its call timed out while the master stalled) and
    the put is made again: the key is not another writer's, and frees itself."""
    key = f"own-{uuid.uuid4().hex}"
    reservation = client.reserve(key, 5)
    try:
        with pytest.raises(ObjectBeingWritten) as error:
            client.put(key, b"again")
        message = str(error.value)
        assert "this client's own earlier put" in message and "ends by itself" in message
        assert "another put" not in message and "force=True" not in message, message
    finally:
        reservation.revoke()
    client.put(key, b"again")
    assert client.get(key) == b"again"
