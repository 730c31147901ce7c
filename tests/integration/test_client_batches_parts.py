"""Put batches larger than one master call takes (4096 keys) go in parts: once a part is
stored it stays stored, so a later part that runs out of time or fails answers for its own
keys rather than the call raising and the stored parts' results being lost. And a key given
twice in one put batch is put once: the later entry is refused before it reaches the master,
whose answer (ObjectBeingWritten, "remove it with force=True") would undo the first."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvpool import Client
from kvpool.client import put_path
from kvpool.common import lane_protocol as lp
from kvpool.errors import InvalidArgument, KVPoolError, MasterUnavailable, TransferError
from kvpool.local_cluster import LocalCluster
from kvpool.proto import master_pb2 as pb

PART = lp.MAX_BATCH_KEYS
#: Long enough for one part of small objects on a loaded test machine (about 0.3 s alone).
TIMEOUT = 4.0


@pytest.fixture(scope="module")
def client(shared_cluster: LocalCluster) -> Iterator[Client]:
    with Client(shared_cluster.master_address, timeout=30) as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}/"


def published(client: Client, prefix: str) -> int:
    """How many objects under ``prefix`` the master lists as published."""
    count, start = 0, ""
    while True:
        page = client.list_keys(prefix, start_after=start)
        count += len(page.keys)
        start = page.next_start_after
        if not start:
            return count


def put_call(client: Client, how: str) -> Callable[[list[tuple[str, bytes]]], list[Any]]:
    """``put_many``, or ``put_parts_many`` of the same bytes in two parts each."""
    if how == "put_many":
        return client.put_many
    return lambda items: client.put_parts_many([(k, [d[:2], d[2:]]) for k, d in items])


def items_of(prefix: str, count: int) -> list[tuple[str, bytes]]:
    return [(f"{prefix}{i:06d}", b"kv%06d" % i) for i in range(count)]


@pytest.mark.parametrize("how", ["put_many", "put_parts_many"])
def test_parts_whose_turn_comes_after_the_timeout_are_answered_per_key(
    client: Client, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The first part is stored, then its commit takes the rest of the timeout: the call
    returns (it raised MasterUnavailable, blaming the master), the stored keys' results say
    so, and each key not sent gets a TransferError saying the timeout ran out, which it may
    simply be put again after (no reservation of it was left behind)."""
    real = put_path.write_and_commit
    calls = 0

    def slow_first(session: Any, puts: Any, options: Any, deadline: float) -> list[int]:
        nonlocal calls
        calls += 1
        statuses = real(session, puts, options, deadline)
        if calls == 1:
            time.sleep(max(0.0, deadline - time.monotonic()))
        return statuses

    monkeypatch.setattr(put_path, "write_and_commit", slow_first)
    prefix = unique("late")
    items = items_of(prefix, 3 * PART)
    with Client(client.master, timeout=TIMEOUT) as short:
        results = put_call(short, how)(items)
    assert results[:PART] == [1] * PART
    for result in results[PART:]:
        assert isinstance(result, TransferError), result
        assert f"after {PART} of its {3 * PART} keys had been sent" in str(result)
    assert results[-1].key == items[-1][0]
    assert published(client, prefix) == PART
    monkeypatch.setattr(put_path, "write_and_commit", real)
    assert client.put_many(items[PART:]) == [1] * (2 * PART)
    client.remove_prefix(prefix, force=True)


def failing_reserve(monkeypatch: pytest.MonkeyPatch, which: int) -> None:
    """Makes the ``which``-th PutStart (from 1) of the test fail as a whole."""
    real = put_path.reserve
    calls = 0

    def reserve(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == which:
            raise MasterUnavailable("the master did not answer (made up by the test)")
        return real(*args)

    monkeypatch.setattr(put_path, "reserve", reserve)


def test_a_later_part_that_fails_gives_its_error_to_its_keys(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts before and after it are stored and say so; its keys each get its error,
    of its type, naming the key and the entries of the part."""
    failing_reserve(monkeypatch, 2)
    prefix = unique("middle")
    items = items_of(prefix, 3 * PART)
    results = client.put_many(items)
    assert results[:PART] == [1] * PART
    assert results[2 * PART :] == [1] * PART
    for (key, _), result in zip(items[PART : 2 * PART], results[PART : 2 * PART], strict=True):
        assert isinstance(result, MasterUnavailable), result
        assert result.key == key
    assert f"(entries {PART} to {2 * PART - 1}) failed" in str(results[PART])
    assert "made up by the test" in str(results[PART])
    assert published(client, prefix) == 2 * PART
    client.remove_prefix(prefix, force=True)


def test_a_first_part_that_fails_raises(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is stored yet then: the call fails as a whole, as any call's."""
    failing_reserve(monkeypatch, 1)
    prefix = unique("first")
    with pytest.raises(MasterUnavailable, match="made up by the test"):
        client.put_many(items_of(prefix, 2 * PART))
    assert published(client, prefix) == 0


def test_a_call_whose_deadline_passed_before_it_was_sent_says_so(client: Client) -> None:
    """Not that the master may not run: it was never asked (the time went on earlier
    steps, the parts of a large batch before, say)."""
    link = client._session.link
    with pytest.raises(MasterUnavailable) as raised:
        link.call("Stat", pb.StatRequest(key="k"), time.monotonic() - 0.001)
    assert "the call's deadline had passed before it was sent" in str(raised.value)
    assert "runs there" not in str(raised.value)


def test_a_key_twice_in_put_many_is_put_once(client: Client) -> None:
    """The first entry is stored; each later one is refused without being sent, so that
    nothing tells the caller to remove what the first stored."""
    key, other = unique("twice"), unique("once")
    results = client.put_many([(key, b"first"), (other, b"other"), (key, b"second"), (key, b"3")])
    assert results[:2] == [1, 1]
    for entry, result in ((2, results[2]), (3, results[3])):
        assert isinstance(result, InvalidArgument), result
        assert result.key == key
        assert "appears more than once in this batch (entry 0" in str(result)
        assert f"again entry {entry})" in str(result)
    assert client.get(key) == b"first"
    client.remove_many([key, other], force=True)


def test_a_key_twice_in_put_parts_many_is_put_once(client: Client) -> None:
    key = unique("parts-twice")
    results = client.put_parts_many([(key, [b"fi", b"rst"]), (key, [b"second"])])
    assert results[0] == 1
    assert isinstance(results[1], InvalidArgument), results[1]
    assert client.get(key) == b"first"
    client.remove(key, force=True)


def test_an_entry_refused_before_its_repeat_leaves_the_repeat_to_be_put(client: Client) -> None:
    """Only entries that would be sent count: when the first entry of a key is refused
    (its data is no buffer), the next one puts it."""
    key = unique("first-refused")
    results = client.put_many([(key, 12345), (key, b"second")])
    assert isinstance(results[0], InvalidArgument), results[0]
    assert "appears more than once" not in str(results[0])
    assert results[1] == 1
    assert client.get(key) == b"second"
    client.remove(key, force=True)


def test_a_key_twice_in_put_tensors_is_put_once(client: Client) -> None:
    """Entries are numbered as the caller gave them, even where one before could not be
    encoded (a tensor on no CPU, a list)."""
    torch = pytest.importorskip("torch")
    key = unique("tensor-twice")
    first = torch.arange(4, dtype=torch.int32)
    results = client.put_tensors([(unique("bad"), [1, 2]), (key, first), (key, first * 2)])
    assert isinstance(results[0], KVPoolError)
    assert results[1] == 1
    assert isinstance(results[2], InvalidArgument), results[2]
    assert "(entry 1, and again entry 2)" in str(results[2])
    assert torch.equal(client.get_tensor(key), first)
    client.remove(key, force=True)


def test_a_tensor_refused_before_its_repeat_leaves_the_repeat_to_be_put(client: Client) -> None:
    torch = pytest.importorskip("torch")
    key = unique("tensor-first-refused")
    second = torch.arange(4, dtype=torch.int32)
    results = client.put_tensors([(key, torch.arange(8).reshape(2, 4).t()), (key, second)])
    assert isinstance(results[0], InvalidArgument), results[0]  # (not contiguous)
    assert results[1] == 1, results[1]
    assert torch.equal(client.get_tensor(key), second)
    client.remove(key, force=True)
