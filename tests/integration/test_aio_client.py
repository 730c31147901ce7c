"""``kvpool.aio.AsyncClient``: every call of ``Client`` as a coroutine, against real processes;
many calls in flight on one client; and what cancelling a call leaves behind: nothing
written into the caller's buffers after ``CancelledError``, no reservation held, no object
half-visible."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import torch

from kvpool import ClusterStatus, KeyPage, ObjectInfo, PrefixRemoval, RegisteredRegion
from kvpool.aio import AsyncClient
from kvpool.errors import (
    BufferTooSmall,
    InvalidArgument,
    InvalidKey,
    KVPoolError,
    ObjectExists,
    ObjectNotFound,
)

CANARY = 0xA5


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(coroutine: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coroutine())


@pytest.fixture(params=["asyncio", "uvloop"])
def run_on(request):
    """Runs a test's coroutine on asyncio's own event loop, and on uvloop's (a test
    dependency: vLLM's servers run on it)."""
    factory = None
    if request.param == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop

    def run(coroutine: Callable[[], Awaitable[Any]]) -> Any:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coroutine())

    return run


def canaried(size: int) -> np.ndarray:
    return np.full(size, CANARY, dtype=np.uint8)


async def cancelled_after(task: asyncio.Task[Any], delay: float) -> None:
    """Cancels ``task`` after ``delay`` seconds and waits for it: CancelledError unless it
    finished first. A negative ``delay`` cancels before the task first runs (the earliest
    point: after even one yield a loaded machine's worker thread may have the call under way)."""
    if delay >= 0:
        await asyncio.sleep(delay)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        assert task.cancelled()


# ------------------------------------------------------------------ every call


def test_every_call_answers_as_the_blocking_client_does(shared_cluster, run_on):
    async def main() -> None:
        p = unique("aio")
        async with AsyncClient(shared_cluster.master_address, timeout=30) as client:
            data = os.urandom(100_000)
            assert await client.put(f"{p}/a", data) == 1
            assert await client.get(f"{p}/a") == data
            buffer = bytearray(len(data))
            assert await client.get_into(f"{p}/a", buffer) == len(data)
            assert buffer == data
            assert await client.get_range(f"{p}/a", 10, 5) == data[10:15]
            tail = bytearray(7)
            assert await client.get_range_into(f"{p}/a", tail, len(data) - 7) == 7
            assert tail == data[-7:]
            assert await client.exists(f"{p}/a") is True
            assert await client.exists(f"{p}/nothing", lease=False) is False

            assert await client.put_parts(f"{p}/parts", [b"head:", b"body"]) == 1
            head, body = bytearray(5), bytearray(4)
            assert await client.get_into_parts(f"{p}/parts", [head, body]) == 9
            assert (head, body) == (b"head:", b"body")

            keys = [f"{p}/many{i}" for i in range(5)]
            values = [os.urandom(1000 + i) for i in range(5)]
            assert await client.put_many(dict(zip(keys, values, strict=True))) == [1] * 5
            got = await client.get_many([*keys, f"{p}/missing"])
            assert got[:5] == values and isinstance(got[5], ObjectNotFound)
            buffers = [bytearray(len(v)) for v in values]
            assert await client.get_into_many(keys, buffers) == [len(v) for v in values]
            assert buffers == values
            assert await client.exists_many([keys[0], f"{p}/missing"]) == [True, False]
            assert await client.put_parts_many([(f"{p}/x", [b"a", b"b"]), (f"{p}/y", [b"c"])]) == [
                1,
                1,
            ]
            x, y = bytearray(2), bytearray(1)
            assert await client.get_into_parts_many([(f"{p}/x", [x]), (f"{p}/y", [y])]) == [2, 1]
            assert (x, y) == (b"ab", b"c")

            info = await client.stat(f"{p}/a")
            assert isinstance(info, ObjectInfo) and info.size == len(data)
            page = await client.list_keys(f"{p}/many")
            assert isinstance(page, KeyPage) and page.keys == keys
            status = await client.cluster_status()
            assert isinstance(status, ClusterStatus) and status.nodes == 2
            assert [e.event for e in await client.story(f"{p}/a")][:3] == [
                "reserved",
                "committed",
                "published",
            ]

            pool = np.zeros(1 << 16, dtype=np.uint8)
            region = await client.register_buffer(pool)
            assert isinstance(region, RegisteredRegion)
            pool[:4096] = np.frombuffer(os.urandom(4096), dtype=np.uint8)
            await client.put(f"{p}/pooled", pool[:4096])
            assert await client.get_into(f"{p}/pooled", pool[4096:8192]) == 4096
            assert np.array_equal(pool[:4096], pool[4096:8192])
            await client.unregister_buffer(region)

            tensor = torch.randn(4, 8, dtype=torch.bfloat16)
            assert await client.put_tensor(f"{p}/t", tensor) == 1
            assert torch.equal(await client.get_tensor(f"{p}/t"), tensor)
            [again] = await client.get_tensors([f"{p}/t"])
            assert torch.equal(again, tensor)
            target = torch.empty(4, 8, dtype=torch.bfloat16)
            assert (await client.get_tensor_into(f"{p}/t", target)) is target
            assert torch.equal(target, tensor)
            assert await client.put_tensors({f"{p}/t2": tensor}) == [1]

            reservation = await client.reserve(f"{p}/stepwise", size=3)
            await reservation.write(b"abc")
            assert await reservation.commit() == 1
            assert await client.get(f"{p}/stepwise") == b"abc"
            dropped = await client.reserve(f"{p}/dropped", size=3)
            await dropped.revoke()
            with pytest.raises(ObjectNotFound):
                await client.stat(f"{p}/dropped")

            await client.remove(f"{p}/a", force=True)
            assert await client.remove_many([keys[0]], force=True) == [None]
            removal = await client.remove_prefix(f"{p}/", force=True)
            assert isinstance(removal, PrefixRemoval) and removal.removed > 0
            assert (await client.list_keys(f"{p}/")).keys == []
            assert client.retries == 0 and client.client_id and client.host

    run_on(main)


def test_errors_are_the_blocking_clients_typed_errors(shared_cluster):
    async def main() -> None:
        async with AsyncClient(shared_cluster.master_address) as client:
            key = unique("aio-errors")
            await client.put(key, b"12345")
            with pytest.raises(ObjectNotFound):
                await client.get(unique("aio-missing"))
            with pytest.raises(InvalidKey):
                await client.put("", b"x")
            with pytest.raises(BufferTooSmall):
                await client.get_into(key, bytearray(2))
            with pytest.raises(InvalidArgument, match="outside"):
                await client.get_range(key, 3, 10)
            with pytest.raises(ObjectExists):
                await client.put(key, b"again")
            [error] = await client.remove_many([unique("aio-missing")])
            assert isinstance(error, ObjectNotFound)
            with pytest.raises(InvalidArgument, match="takes a dict of key -> data"):
                await client.put_many(None)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument, match="a list of keys, not one str"):
                await client.remove_many(key)
            assert await client.get(key) == b"12345"
        with pytest.raises(RuntimeError, match="closed"):
            await client.get(key)
        with pytest.raises(InvalidArgument, match="threads"):
            AsyncClient(shared_cluster.master_address, threads=0)

    run(main)


def test_many_calls_in_flight_on_one_client_each_get_their_own_bytes(shared_cluster, run_on):
    """64 batches of 32 objects at once on 8 threads: puts, then reads into buffers, each
    batch verified byte for byte."""

    async def main() -> None:
        p = unique("aio-flight")
        batches = [[(f"{p}/{b}/{i}", os.urandom(4096)) for i in range(32)] for b in range(64)]
        async with AsyncClient(shared_cluster.master_address, threads=8, timeout=60) as client:
            stored = await asyncio.gather(*(client.put_many(batch) for batch in batches))
            assert stored == [[1] * 32] * 64
            targets = [[bytearray(4096) for _ in batch] for batch in batches]
            sizes = await asyncio.gather(
                *(
                    client.get_into_many([k for k, _ in batch], bufs)
                    for batch, bufs in zip(batches, targets, strict=True)
                )
            )
            assert sizes == [[4096] * 32] * 64
            for batch, bufs in zip(batches, targets, strict=True):
                assert bufs == [v for _, v in batch]
            got = await asyncio.gather(*(client.get_many([k for k, _ in b]) for b in batches))
            assert got == [[v for _, v in batch] for batch in batches]
            await client.remove_prefix(f"{p}/", force=True)

    run_on(main)


def test_one_client_serves_several_event_loops(shared_cluster):
    """The client is bound to no loop: a second ``asyncio.run`` uses it too."""
    client = AsyncClient(shared_cluster.master_address)
    key = unique("aio-loops")

    async def first() -> None:
        await client.put(key, b"from the first loop")

    async def second() -> None:
        assert await client.get(key) == b"from the first loop"
        await client.close()

    asyncio.run(first())
    asyncio.run(second())


# ------------------------------------------------------------------ cancellation


async def space_used(client: AsyncClient) -> int:
    """Bytes the cluster's segments hold, reservations included."""
    return sum(segment.used for segment in (await client.cluster_status()).segments)


def test_a_get_cancelled_while_the_master_answers_never_touches_the_buffer(cluster_factory, run_on):
    """The master is stopped while the read asks it where the object is; the read is
    cancelled meanwhile (twice). CancelledError comes only once the call has stopped (after
    the master answers), and the transfer it would have made is never made."""
    cluster = cluster_factory(1, "64MiB")

    async def main() -> None:
        async with AsyncClient(cluster.master_address, timeout=20) as client:
            data = os.urandom(1 << 20)
            await client.put("object", data)
            buffer = canaried(len(data))
            cluster.master.signal(signal.SIGSTOP)
            try:
                task = asyncio.create_task(client.get_into("object", buffer))
                await asyncio.sleep(0.3)  # (the call waits for the stopped master)
                task.cancel()
                await asyncio.sleep(0.3)
                assert not task.done(), "CancelledError before the call stopped"
                task.cancel()  # (again, while it waits for the call to stop: it still waits)
                await asyncio.sleep(0.1)
                assert not task.done()
            finally:
                cluster.master.signal(signal.SIGCONT)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (buffer == CANARY).all(), "a cancelled read wrote into the caller's buffer"
            assert await client.get_into("object", buffer) == len(data)  # (client still fine)
            assert buffer.tobytes() == data

    run_on(main)


def test_a_put_cancelled_while_reserving_gives_its_reservations_back(cluster_factory):
    """Cancelled while PutStart waits for a stopped master: once the master answers, the
    call revokes what it reserved before CancelledError comes. No reservation is left, the
    keys are free (a put of them works) and their story says revoked, not reclaimed."""
    cluster = cluster_factory(1, "64MiB")

    async def main() -> None:
        async with AsyncClient(cluster.master_address, timeout=20) as client:
            items = [(f"k{i}", os.urandom(4096)) for i in range(32)]
            baseline = await space_used(client)
            cluster.master.signal(signal.SIGSTOP)
            try:
                task = asyncio.create_task(client.put_many(items))
                await asyncio.sleep(0.3)
                task.cancel()
                await asyncio.sleep(0.3)
                assert not task.done()
            finally:
                cluster.master.signal(signal.SIGCONT)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await space_used(client) == baseline
            for key, _ in items:
                with pytest.raises(ObjectNotFound):
                    await client.stat(key)
            events = [e.event for e in await client.story("k0")]
            assert events == ["reserved", "revoked"]
            assert await client.put_many(items) == [1] * 32
            assert await client.get_many([k for k, _ in items]) == [v for _, v in items]

    run(main)


def test_a_put_cancelled_after_its_commit_was_sent_is_published_whole(cluster_factory):
    """The node is stopped, so PutEnd waits for it to record the object: the commit is on
    its way when the put is cancelled. CancelledError waits for the commit's answer, and the
    object is then published whole."""
    cluster = cluster_factory(1, "64MiB")
    [node] = cluster.nodes

    async def main() -> None:
        async with AsyncClient(cluster.master_address, timeout=20) as client:
            await client.put("warm", b"x")  # (maps the segment: the write needs no node)
            data = os.urandom(1 << 20)
            node.signal(signal.SIGSTOP)
            try:
                task = asyncio.create_task(client.put("late", data))
                await asyncio.sleep(0.5)
                task.cancel()
                await asyncio.sleep(0.3)
                assert not task.done()
            finally:
                node.signal(signal.SIGCONT)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await client.get("late") == data
            assert [e.event for e in await client.story("late")][:3] == [
                "reserved",
                "committed",
                "published",
            ]

    run(main)


def test_a_call_cancelled_before_it_got_a_thread_never_runs(shared_cluster):
    """One thread, busy with a large read: a second read queued behind it and cancelled
    raises at once, and never writes into its buffer, not even once the thread is free."""

    async def main() -> None:
        async with AsyncClient(shared_cluster.master_address, threads=1, timeout=60) as client:
            big, small = unique("aio-big"), unique("aio-small")
            await client.put(big, np.ones(128 << 20, dtype=np.uint8))
            await client.put(small, os.urandom(4096))
            blocker = asyncio.create_task(client.get(big))
            await asyncio.sleep(0)
            buffer = canaried(4096)
            queued = asyncio.create_task(client.get_into(small, buffer))
            await asyncio.sleep(0)
            started = time.monotonic()
            await cancelled_after(queued, 0)
            assert queued.cancelled() and not blocker.done()
            assert time.monotonic() - started < 1.0
            assert len(await blocker) == 128 << 20
            assert await client.exists(small)  # (runs after anything queued before it)
            assert (buffer == CANARY).all()
            await client.remove_many([big, small], force=True)

    run(main)


@pytest.mark.parametrize("same_host_mapping", [True, False], ids=["mapped", "ucx"])
def test_cancelling_at_every_point_of_a_read_leaves_the_buffer_alone_afterwards(
    shared_cluster, same_host_mapping, run_on
):
    """Reads cancelled after 0 .. 15 ms (before, during and after each step): whatever the
    buffer holds when CancelledError comes, it still holds later; a read that completed
    holds the object."""

    async def main() -> None:
        async with AsyncClient(
            shared_cluster.master_address, timeout=30, same_host_mapping=same_host_mapping
        ) as client:
            key = unique("aio-cancel-read")
            data = os.urandom(8 << 20)
            await client.put(key, data)
            outcomes = set()
            for step in range(32):
                buffer = canaried(len(data))
                task = asyncio.create_task(client.get_into(key, buffer))
                await cancelled_after(task, step * 0.0005 if step else -1)
                seen = buffer.copy()
                await client.exists(key)  # (a full call later)
                await asyncio.sleep(0.01)
                assert np.array_equal(buffer, seen), f"written after CancelledError ({step})"
                if not task.cancelled():
                    assert buffer.tobytes() == data
                    outcomes.add("completed")
                else:
                    untouched = bool((buffer == CANARY).all())
                    outcomes.add("untouched" if untouched else "partly or wholly read")
            assert "untouched" in outcomes  # (the sweep reached the steps before the transfer)
            await client.remove(key, force=True)

    run_on(main)


def test_cancelling_at_every_point_of_a_put_leaves_each_key_whole_or_free(cluster_factory, run_on):
    """Batch puts cancelled after 0 .. 15 ms: each key is then published with its bytes, or
    not there at all (never being written), the cluster holds the space of the published
    ones and no more (no reservation left), and a put of the free ones succeeds. (A cluster
    of its own: on a shared one, space that other tests' removals left waiting for read
    leases comes free at any time, and the space check would count it.)"""
    cluster = cluster_factory(1, "256MiB")

    async def main() -> None:
        async with AsyncClient(cluster.master_address, timeout=30) as client:
            p = unique("aio-cancel-put")
            outcomes = set()
            for step in range(32):
                items = [(f"{p}/{step}/{i}", os.urandom(64 << 10)) for i in range(32)]
                before = await space_used(client)
                task = asyncio.create_task(client.put_many(items))
                await cancelled_after(task, step * 0.0005 if step else -1)
                got = await client.get_many([k for k, _ in items])
                free = []
                for (key, value), result in zip(items, got, strict=True):
                    if isinstance(result, KVPoolError):
                        assert type(result) is ObjectNotFound, result  # (not ObjectNotReady)
                        free.append((key, value))
                    else:
                        assert result == value
                outcomes.add("free" if free else "published")
                published = len(items) - len(free)
                # the published objects hold space, nothing else does: no reservation is left
                assert await space_used(client) == before + published * (64 << 10)
                if free:
                    assert await client.put_many(free) == [1] * len(free)
            assert "free" in outcomes
            await client.remove_prefix(f"{p}/", force=True)

    run_on(main)


def test_a_cancelled_reserve_or_registration_is_undone(shared_cluster):
    """Cancelled once it got through, a reserve is revoked and a registration ended."""

    async def main() -> None:
        async with AsyncClient(shared_cluster.master_address, threads=1) as client:
            key = unique("aio-reserve")
            baseline = await space_used(client)
            for delay in (0, 0.0005, 0.001, 0.002, 0.005):
                task = asyncio.create_task(client.reserve(key, 4096))
                await cancelled_after(task, delay)
                if task.cancelled():
                    assert await space_used(client) == baseline
                    continue
                await task.result().revoke()
            pool = np.zeros(1 << 20, dtype=np.uint8)
            registrations = client._client._session.data._regions
            before = len(registrations)
            task = asyncio.create_task(client.register_buffer(pool))
            await cancelled_after(task, 0)
            if not task.cancelled():
                await client.unregister_buffer(task.result())
            assert len(registrations) == before
            reservation = await client.reserve(key, 4)
            write = asyncio.create_task(reservation.write(b"abcd"))
            await cancelled_after(write, 0)
            if write.cancelled():  # the write revoked it: the key is free
                assert await space_used(client) == baseline
                assert await client.put(key, b"wxyz") == 1
            else:
                await reservation.commit()
            await client.remove(key, force=True)

    run(main)


def test_asyncio_timeout_cancels_a_call_like_any_other(shared_cluster):
    """``asyncio.timeout`` around a call: TimeoutError, and the call has stopped by then."""

    async def main() -> None:
        async with AsyncClient(shared_cluster.master_address, threads=1) as client:
            big = unique("aio-timeout")
            await client.put(big, np.ones(64 << 20, dtype=np.uint8))
            buffer = canaried(64 << 20)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.0001):
                    await client.get_into(big, buffer)
            seen = buffer.copy()
            await asyncio.sleep(0.05)
            assert np.array_equal(buffer, seen)
            await client.remove(big, force=True)

    run(main)
