"""Ranged reads and objects of several buffers, byte for byte, over both data paths: the
same-host mapping (the default here) and UCX (``same_host_mapping=False``)."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from kvpool import Client
from kvpool.errors import BufferTooSmall, InvalidArgument, InvalidKey, ObjectNotFound

SIZE = (1 << 20) + 13  # not a multiple of anything


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module", params=["mapped", "ucx"])
def client(request, shared_cluster):
    mapped = request.param == "mapped"
    with Client(shared_cluster.master_address, timeout=30, same_host_mapping=mapped) as client:
        yield client
        assert bool(client.mapped_segments) == mapped, "the path the test meant to take"


@pytest.fixture(scope="module")
def stored(client):
    """A key holding SIZE random bytes, and those bytes."""
    key, data = unique("ranged"), os.urandom(SIZE)
    assert client.put(key, data) == 1
    return key, data


# ------------------------------------------------------------------ ranged reads

RANGES = [
    (0, 1),  # first byte
    (0, 4096),
    (SIZE - 1, 1),  # last byte
    (SIZE - 4096, 4096),  # up to the very end
    (12345, 1),
    (4095, 2),  # across a page boundary
    (1000, 500_000),
    (0, SIZE),  # the whole object
    (SIZE, 0),  # nothing, at the end
    (0, 0),
]


@pytest.mark.parametrize(("offset", "length"), RANGES)
def test_get_range_returns_exactly_those_bytes(client, stored, offset, length):
    key, data = stored
    got = client.get_range(key, offset, length)
    assert type(got) is bytes
    assert got == data[offset : offset + length]


@pytest.mark.parametrize(("offset", "length"), RANGES)
def test_get_range_into_fills_only_the_start_of_the_buffer(client, stored, offset, length):
    key, data = stored
    buffer = np.full(length + 16, 0xEE, dtype=np.uint8)
    assert client.get_range_into(key, buffer, offset, length) == length
    assert bytes(buffer[:length]) == data[offset : offset + length]
    assert (buffer[length:] == 0xEE).all(), "not a byte past the range"


def test_get_range_into_reads_as_many_bytes_as_the_buffer_holds(client, stored):
    key, data = stored
    buffer = bytearray(777)
    assert client.get_range_into(key, buffer, 100) == 777
    assert bytes(buffer) == data[100:877]
    assert client.get_range_into(key, buffer) == 777  # from the start
    assert bytes(buffer) == data[:777]


@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, SIZE + 1), (SIZE, 1), (SIZE + 1, 0), (SIZE - 1, 2), (1 << 40, 1)],
)
def test_a_range_outside_the_object_is_refused_with_its_size(client, stored, offset, length):
    key, _ = stored
    with pytest.raises(InvalidArgument, match=f"which is {SIZE} bytes") as raised:
        client.get_range(key, offset, length)
    assert raised.value.key == key
    with pytest.raises(InvalidArgument, match=f"which is {SIZE} bytes"):
        client.get_range_into(key, bytearray(length), offset, length)


@pytest.mark.parametrize(("offset", "length"), [(-1, 1), (0, -1), (1.5, 1), (True, 1)])
def test_a_malformed_range_is_refused_before_asking(client, stored, offset, length):
    with pytest.raises(InvalidArgument, match="whole number of bytes"):
        client.get_range(stored[0], offset, length)


def test_a_ranged_read_cannot_be_verified(client, stored):
    key, _ = stored
    with pytest.raises(InvalidArgument, match="checksum covers the whole object"):
        client.get_range(key, 0, 10, verify=True)
    with pytest.raises(InvalidArgument, match="checksum covers the whole object"):
        client.get_range_into(key, bytearray(10), verify=True)


def test_ranged_reads_of_a_missing_key_or_into_a_small_buffer_fail_plainly(client, stored):
    with pytest.raises(ObjectNotFound):
        client.get_range(unique("missing"), 0, 1)
    with pytest.raises(InvalidKey):
        client.get_range("", 0, 1)
    with pytest.raises(BufferTooSmall):
        client.get_range_into(stored[0], bytearray(4), 0, 5)
    with pytest.raises(InvalidArgument, match="writable"):
        client.get_range_into(stored[0], b"read-only", 0, 1)


# ------------------------------------------------------------------ objects of several buffers

PARTS = [b"", b"a", os.urandom(4095), os.urandom(1 << 20), b"", os.urandom(3)]


def test_put_parts_stores_the_concatenation(client):
    key = unique("gathered")
    parts = [PARTS[0], bytearray(PARTS[1]), np.frombuffer(PARTS[2], np.uint8), *PARTS[3:]]
    assert client.put_parts(key, parts) == 1
    assert client.get(key) == b"".join(PARTS)
    assert client.stat(key).size == sum(map(len, PARTS))
    client.remove(key, force=True)


def test_put_parts_of_adjacent_slices_of_one_buffer(client):
    key, pool = unique("adjacent"), np.random.default_rng(3).integers(0, 256, 8192, np.uint8)
    assert client.put_parts(key, [pool[:100], pool[100:4096], pool[4096:]]) == 1
    assert client.get(key) == pool.tobytes()


def test_put_parts_with_replicas_and_a_checksum(client):
    key = unique("gathered-twice")
    assert client.put_parts(key, PARTS, replicas=2, checksum=True) == 2
    info = client.stat(key)
    assert len(info.replicas) == 2 and info.crc32c is not None
    assert client.get(key, verify=True) == b"".join(PARTS)  # the CRC is of the whole
    buffers = [bytearray(len(p)) for p in PARTS]
    assert client.get_into_parts(key, buffers, verify=True) == sum(map(len, PARTS))
    assert [bytes(b) for b in buffers] == PARTS


def test_put_parts_of_nothing_stores_an_empty_object(client):
    key = unique("no-parts")
    assert client.put_parts(key, []) == 1
    assert client.get(key) == b""
    assert client.get_into_parts(key, []) == 0
    assert client.get_into_parts(key, [bytearray(0)]) == 0


def test_get_into_parts_scatters_a_whole_put(client, stored):
    key, data = stored
    sizes = [1, 4096, 0, 100_000, SIZE - 104_097]
    buffers = [np.zeros(n, np.uint8) for n in sizes]
    assert client.get_into_parts(key, buffers) == SIZE
    assert b"".join(b.tobytes() for b in buffers) == data


def test_get_into_parts_into_adjacent_slices_of_one_buffer(client, stored):
    key, data = stored
    target = bytearray(SIZE)
    view = memoryview(target)
    assert client.get_into_parts(key, [view[:10], view[10:SIZE]]) == SIZE
    assert bytes(target) == data


@pytest.mark.parametrize("delta", [-1, 1])
def test_buffers_that_do_not_add_up_to_the_object_are_refused(client, stored, delta):
    key, _ = stored
    with pytest.raises(InvalidArgument, match=f"is {SIZE} bytes but its 2 buffer") as raised:
        client.get_into_parts(key, [bytearray(10), bytearray(SIZE - 10 + delta)])
    assert raised.value.key == key


def test_malformed_parts_are_refused(client, stored):
    with pytest.raises(InvalidArgument, match="list of buffers"):
        client.put_parts(unique("one-buffer"), b"not a list")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="list of buffers"):
        client.get_into_parts(stored[0], bytearray(SIZE))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="contiguous buffer"):
        client.put_parts(unique("bad-part"), [b"x", 42])
    with pytest.raises(InvalidArgument, match="writable"):
        client.get_into_parts(stored[0], [b"x" * SIZE])
    with pytest.raises(InvalidKey):
        client.put_parts("", [b"x"])


def test_batches_of_parts_answer_per_key_in_order(client):
    keys = [unique("parts-batch") for _ in range(4)]
    objects = [[os.urandom(n) for n in sizes] for sizes in ([1, 2], [4096] * 3, [0], [70_000])]
    items = [*zip(keys, objects, strict=True), ("", [b"x"]), (unique("bad"), [42])]
    results = client.put_parts_many(items)
    assert results[:4] == [1] * 4
    assert isinstance(results[4], InvalidKey)
    assert isinstance(results[5], InvalidArgument) and results[5].key == items[5][0]

    for key, parts in zip(keys, objects, strict=True):
        assert client.get(key) == b"".join(parts)
    targets = [[bytearray(len(p)) for p in parts] for parts in objects]
    missing = unique("missing")
    asked = [*zip(keys, targets, strict=True), (missing, [bytearray(1)]), (keys[0], [bytes(3)])]
    got = client.get_into_parts_many(asked)
    assert got[:4] == [sum(map(len, parts)) for parts in objects]
    assert isinstance(got[4], ObjectNotFound) and got[4].key == missing
    assert isinstance(got[5], InvalidArgument)
    for buffers, parts in zip(targets, objects, strict=True):
        assert [bytes(b) for b in buffers] == parts
    # a size mismatch spoils only its own entry
    mismatched = client.get_into_parts_many({keys[0]: [bytearray(1)], keys[1]: targets[1]})
    assert isinstance(mismatched[0], InvalidArgument) and mismatched[1] == 3 * 4096
    client.remove_many(keys, force=True)


def test_a_batch_of_parts_costs_one_round_trip_each_way(client, monkeypatch):
    calls: list[str] = []
    link = client._session.link
    real_call = link.call

    def counting(method, request, deadline):
        calls.append(method)
        return real_call(method, request, deadline)

    monkeypatch.setattr(link, "call", counting)
    keys = [unique("trips") for _ in range(8)]
    assert client.put_parts_many([(k, [b"ab", b"cd"]) for k in keys]) == [1] * 8
    assert client.get_into_parts_many([(k, [bytearray(3), bytearray(1)]) for k in keys]) == [4] * 8
    assert [c for c in calls if c != "ClientHeartbeat"] == ["PutStart", "PutEnd", "GetReplicas"]
    monkeypatch.undo()
    client.remove_many(keys, force=True)


def test_mapped_and_ucx_clients_read_each_others_parts(shared_cluster):
    with (
        Client(shared_cluster.master_address) as mapped,
        Client(shared_cluster.master_address, same_host_mapping=False) as remote,
    ):
        key_m, key_u = unique("by-mapped"), unique("by-ucx")
        mapped.put_parts(key_m, PARTS)
        remote.put_parts(key_u, PARTS)
        whole = b"".join(PARTS)
        assert remote.get(key_m) == whole and mapped.get(key_u) == whole
        assert remote.get_range(key_m, 5, 4000) == whole[5:4005]
        assert mapped.get_range(key_u, 5, 4000) == whole[5:4005]
