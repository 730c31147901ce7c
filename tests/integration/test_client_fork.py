"""A Client belongs to the process that made it. A fork child that calls its parent's client
gets ClientForked at once (it would otherwise send on the parent's lane connection, with the
parent's call ids, and either process could read the other's answer: another key's bytes),
the parent's connections are left alone, and a new Client made in the child works."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable

import pytest
from helpers import in_fork_child, metric

from kvpool import Client
from kvpool.aio import AsyncClient
from kvpool.errors import ClientClosed, ClientForked
from kvpool.security.identity import Role
from kvpool.security.tokens import new_token
from kvpool.transport.shared_memory import MAPPINGS


def refused(call: Callable[[], object]) -> str:
    """'ClientForked: message' when ``call`` raised it, else what happened instead."""
    try:
        result = call()
    except ClientForked as error:
        assert isinstance(error, ClientClosed), "a ClientClosed too (make a new one)"
        return f"ClientForked: {error}"
    except BaseException as error:
        return f"{type(error).__name__}: {error}"
    return f"no error: {result!r}"[:200]


@pytest.mark.parametrize("same_host_mapping", [True, False], ids=["mapped", "ucx"])
def test_a_fork_child_cannot_use_its_parents_client_and_the_parent_keeps_working(
    shared_cluster, same_host_mapping
):
    prefix = f"fork-{uuid.uuid4().hex[:8]}"
    mine, theirs = os.urandom(4096), os.urandom(4096)
    with Client(
        shared_cluster.master_address, timeout=10, same_host_mapping=same_host_mapping
    ) as client:
        client.put(f"{prefix}/parent", mine)
        client.put(f"{prefix}/child", theirs)
        assert client.get(f"{prefix}/parent") == mine  # (a lane connection waits in its pool)
        reservation = client.reserve(f"{prefix}/reserved", 4)

        def child() -> str:
            calls = {
                "get": lambda: client.get(f"{prefix}/child"),
                "get_many": lambda: client.get_many([f"{prefix}/child"]),
                "get_into": lambda: client.get_into(f"{prefix}/child", bytearray(4096)),
                "put": lambda: client.put(f"{prefix}/new", b"x"),
                "exists": lambda: client.exists(f"{prefix}/child"),
                "list_keys": lambda: client.list_keys(prefix),
                "stat": lambda: client.stat(f"{prefix}/child"),
                "remove": lambda: client.remove(f"{prefix}/child"),
                "reserve": lambda: client.reserve(f"{prefix}/other", 4),
                "reservation.write": lambda: reservation.write(b"abcd"),
                "reservation.commit": reservation.commit,
                "register_buffer": lambda: client.register_buffer(bytearray(4096)),
                "mapped_segments": lambda: client.mapped_segments,
            }
            lines = [f"{name} -> {refused(call)}" for name, call in calls.items()]
            client.close()  # (leaves the parent's connections alone; raises nothing)
            lines.append(f"after close -> {refused(lambda: client.get(f'{prefix}/child'))}")
            return "\n".join(lines)

        answers = in_fork_child(child).splitlines()
        assert len(answers) == 14, answers
        parent = os.getpid()
        for answer in answers:
            assert "-> ClientForked: " in answer, answer
            assert f"made in process {parent} before fork()" in answer, answer
            assert "make a new Client in the child" in answer, answer

        # the parent's client, its pooled lane connection and its reservation work on
        for _ in range(20):
            assert client.get(f"{prefix}/parent") == mine
            assert client.get(f"{prefix}/child") == theirs
        reservation.write(b"abcd")
        assert reservation.commit() >= 1
        assert client.get(f"{prefix}/reserved") == b"abcd"
        assert client.exists(f"{prefix}/child") and not client.exists(f"{prefix}/new")
        client.remove_prefix(prefix, force=True)


def test_reads_right_after_fork_never_cross_between_parent_and_child(shared_cluster):
    """The audit's race: parent and child read at the same moment right after each fork. The
    child is refused every time; the parent always gets its own key's bytes."""
    prefix = f"fork-race-{uuid.uuid4().hex[:8]}"
    a, b = b"A" * 4096, b"B" * 4096
    with Client(shared_cluster.master_address, timeout=5) as client:
        client.put(f"{prefix}/a", a)
        client.put(f"{prefix}/b", b)
        for _ in range(15):
            assert client.get(f"{prefix}/a") == a  # (a pooled connection, as before each fork)
            start = time.time() + 0.05
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:
                answer = "?"
                try:
                    while time.time() < start:
                        pass
                    answer = refused(lambda: client.get(f"{prefix}/b"))
                finally:
                    os.write(write_end, answer[:200].encode())
                    os._exit(0)
            os.close(write_end)
            while time.time() < start:
                pass
            assert client.get(f"{prefix}/a") == a
            with os.fdopen(read_end, "rb") as answers:
                answer = answers.read().decode()
            os.waitpid(pid, 0)
            assert answer.startswith("ClientForked: "), answer
        client.remove_prefix(prefix, force=True)


def test_a_new_client_made_in_the_fork_child_works(shared_cluster):
    prefix = f"fork-new-{uuid.uuid4().hex[:8]}"
    value = os.urandom(100_000)
    with Client(shared_cluster.master_address, timeout=10) as client:
        client.put(f"{prefix}/from-parent", value)
        assert client.get(f"{prefix}/from-parent") == value

        def child() -> str:
            with Client(shared_cluster.master_address, timeout=10) as fresh:
                if fresh.get(f"{prefix}/from-parent") != value:
                    return "wrong bytes"
                fresh.put(f"{prefix}/from-child", value[::-1])
                return "ok"

        assert in_fork_child(child) == "ok"
        assert client.get(f"{prefix}/from-child") == value[::-1]
        assert client.get(f"{prefix}/from-parent") == value
        client.remove_prefix(prefix, force=True)


def test_a_new_client_in_a_fork_child_works_while_a_parent_thread_held_the_mappings(
    shared_cluster,
):
    """Another thread of the parent held the process's shared mappings (its lock) when the
    process forked: the child's new client maps afresh rather than waiting for ever."""
    prefix = f"fork-held-{uuid.uuid4().hex[:8]}"
    value = os.urandom(100_000)
    with Client(shared_cluster.master_address, timeout=10) as client:
        client.put(f"{prefix}/from-parent", value)
        held, release = threading.Event(), threading.Event()

        def holder() -> None:
            with MAPPINGS._lock:  # (as a client's acquire or release does for a moment)
                held.set()
                release.wait(30)

        thread = threading.Thread(target=holder)
        thread.start()
        assert held.wait(5)
        try:

            def child() -> str:
                with Client(shared_cluster.master_address, timeout=10) as fresh:
                    return "ok" if fresh.get(f"{prefix}/from-parent") == value else "wrong bytes"

            assert in_fork_child(child) == "ok"
        finally:
            release.set()
            thread.join()
        assert client.get(f"{prefix}/from-parent") == value
        client.remove_prefix(prefix, force=True)


def test_a_fork_child_writes_an_nvme_file_itself_after_its_parent_did(cluster_factory, tmp_path):
    """A same-host client writes large objects into an NVMe segment's file on threads the
    process shares: the parent's did not survive the fork, and the child gets its own."""
    mapper = new_token("mapper", Role.CLIENT, tenant="a")
    cluster = cluster_factory(
        0, same_host=False, tokens=(mapper[1],), master_args=["--same-host-clients", "mapper"]
    )
    node = cluster.add_node(
        "64MiB", extra=["--tenant", "a", "--nvme", str(tmp_path / "nvme"), "--nvme-size", "1GiB"]
    )
    received = lambda: metric(node.ready["http_port"], "kvpool_node_direct_write_bytes_total")  # noqa: E731
    value = os.urandom(24 << 20)  # (several pieces: written side by side)

    def client() -> Client:
        return Client(cluster.master_address, token=mapper[0], tls_ca=str(cluster.pki.ca))

    with client() as parent:
        parent.put("from-parent", value, tier="nvme")
        assert received() == 0, "the parent wrote the file itself"

        def child() -> str:
            with client() as fresh:
                fresh.put("from-child", value[::-1], tier="nvme")
                return "ok" if fresh.get("from-child") == value[::-1] else "wrong bytes"

        assert in_fork_child(child) == "ok"
        assert parent.get("from-child") == value[::-1]
        assert received() == 0, "so did the child"


def test_an_async_client_in_a_fork_child_raises_rather_than_waiting_for_ever(shared_cluster):
    """Its threads are the parent's: a call handed to them in the child would never run."""
    key = f"fork-aio-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with AsyncClient(shared_cluster.master_address, timeout=10) as client:
            await client.put(key, b"v")
            assert await client.get(key) == b"v"

            def child() -> str:
                async def use() -> str:
                    answer = ""
                    try:
                        await client.get(key)
                    except ClientForked as error:
                        answer = f"ClientForked: {error}"
                    await client.close()  # (returns at once: nothing of the parent's touched)
                    return answer

                return asyncio.run(use())

            answer = in_fork_child(child)
            assert answer.startswith("ClientForked: "), answer
            assert await client.get(key) == b"v"
            await client.remove(key, force=True)

    asyncio.run(main())
