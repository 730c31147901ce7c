"""Error messages say each thing once, and quote a long key by its start and end.

A second put of a key names the key once (not "already exists (object 'k' exists)"). A key
of a thousand characters, valid or not, is cut in the message, with its length: the message
stays readable, and the exception still carries the whole key.
"""

from __future__ import annotations

import uuid

import pytest
from helpers import kvpool_cli

from kvpool import Client
from kvpool.errors import InvalidKey, ObjectExists, ObjectNotFound
from kvpool.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(1, "16MiB", run_dir=tmp_path_factory.mktemp("messages")) as cluster:
        yield cluster


def test_a_second_put_of_a_key_says_it_exists_once(cluster):
    key = f"mykey-{uuid.uuid4().hex[:8]}"
    assert kvpool_cli("put", key, "--value", "first", master=cluster.master_address).returncode == 0
    again = kvpool_cli("put", key, "--value", "second", master=cluster.master_address)
    assert again.returncode == 1
    assert again.stderr.count(key) == 1, again.stderr
    assert again.stderr.count("exists") == 1, again.stderr
    assert "immutable" in again.stderr
    with Client(cluster.master_address) as client, pytest.raises(ObjectExists) as caught:
        client.put(key, b"third")
    assert str(caught.value).count(key) == 1


def test_an_over_long_key_is_cut_in_the_message_with_its_length(cluster):
    key = "k" * 1025
    got = kvpool_cli("get", key, master=cluster.master_address)
    assert got.returncode == 2, "a bad argument"
    assert "1025 characters" in got.stderr and "the limit is 1024" in got.stderr
    assert len(got.stderr) < 300, got.stderr
    assert "Traceback" not in got.stderr
    with Client(cluster.master_address) as client, pytest.raises(InvalidKey) as caught:
        client.put(key, b"x")
    assert len(str(caught.value)) < 300 and caught.value.key == key


def test_a_long_valid_key_is_cut_too_keeping_its_end(cluster):
    key = "layer/" + "x" * 1000 + "/chunk-0042"
    with Client(cluster.master_address) as client, pytest.raises(ObjectNotFound) as caught:
        client.get(key)
    message = str(caught.value)
    assert len(message) < 300 and "chunk-0042" in message and f"({len(key)} characters)" in message
    missing = kvpool_cli("get", key, master=cluster.master_address)
    assert missing.returncode == 1 and len(missing.stderr) < 300, missing.stderr
