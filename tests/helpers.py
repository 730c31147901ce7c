"""Small waiting and scraping helpers shared by tests that drive real processes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def holders(client: Any, key: str) -> set[str]:
    """The nodes that hold a replica of ``key`` as the master says; none while it turns
    clients away (a restarted master or a new leader rebuilding its index)."""
    from kvpool.errors import KVPoolError

    try:
        return {replica.node_id for replica in client.stat(key).replicas}
    except KVPoolError:
        return set()


def get_in_background(client: Any, key: str) -> tuple[threading.Thread, list[Any]]:
    """A thread (not started) that gets ``key`` with ``client``, and the list where it puts
    what the get returned or raised."""
    got: list[Any] = []

    def read() -> None:
        try:
            got.append(client.get(key))
        except BaseException as error:  # (the caller's assertion shows it)
            got.append(error)

    return threading.Thread(target=read), got


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Polls ``predicate`` until it holds or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def metric(port: int, name: str) -> float:
    """The value of an unlabelled Prometheus sample served on 127.0.0.1:``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def kvpool_cli(*args: str, master: str) -> subprocess.CompletedProcess[str]:
    """Runs ``kvpool ARGS`` as a shell user would, against ``master`` ($KVPOOL_MASTER)."""
    return subprocess.run(
        [sys.executable, "-m", "kvpool.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "KVPOOL_MASTER": master},
        timeout=60,
    )


_ADMIN_LINKS: dict[str, Any] = {}


def cluster_status(master: str) -> Any:
    """``ClusterStatus`` of ``master`` as the session's admin asks it (a client of a tenant
    may not: the cluster's topology is not a tenant's to see). One link per master."""
    from kvpool.client.master_link import MasterLink
    from kvpool.proto import master_pb2 as pb
    from kvpool.security.caller import CallerCredentials

    link = _ADMIN_LINKS.get(master)
    if link is None:
        admin = CallerCredentials.resolve(token=os.environ["KVPOOL_TEST_ADMIN_TOKEN"])
        link = _ADMIN_LINKS[master] = MasterLink(master, use_lane=False, credentials=admin)
    return link.call("ClusterStatus", pb.ClusterStatusRequest(), time.monotonic() + 10)


@contextlib.contextmanager
def being_written(master: str, key: str, size: int) -> Iterator[None]:
    """``key`` reserved by a writer (of the session's client tenant) that writes nothing
    while the block runs, as another engine whose put is under way; revoked after it. The
    writer heartbeats meanwhile, so that the master does not revoke it as a dead client."""
    from kvpool.client.master_link import MasterLink
    from kvpool.proto import master_pb2 as pb
    from kvpool.security.caller import CallerCredentials

    writer = f"being-written-{os.getpid()}-{time.monotonic_ns()}"
    link = MasterLink(master, use_lane=False, credentials=CallerCredentials.resolve())
    try:
        request = pb.PutStartRequest(client_id=writer, keys=[key], sizes=[size])
        (slot,) = link.call("PutStart", request, time.monotonic() + 10).slots
        assert slot.status == pb.OK, slot.message
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(1.0):
                beat = pb.ClientHeartbeatRequest(client_id=writer)
                link.call("ClientHeartbeat", beat, time.monotonic() + 5)

        beating = threading.Thread(target=heartbeat, daemon=True)
        beating.start()
        try:
            yield
        finally:
            done.set()
            beating.join(10)
            revoke = pb.PutRevokeRequest(client_id=writer, keys=[key], put_ids=[slot.put_id])
            link.call("PutRevoke", revoke, time.monotonic() + 10)
    finally:
        link.close()


def master_channel(master: str) -> Any:
    """A gRPC channel to ``master`` as the session's clients reach it (TLS with the session's
    CA); calls on it carry no token unless given ``metadata=bearer(...)``."""
    from kvpool.security.caller import CallerCredentials

    return CallerCredentials.resolve().channel(master, [])


def bearer(token: str | None = None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata with ``token`` (default: the session's client token of tenant default;
    any string given, even an empty or malformed one, is sent as it is)."""
    if token is None:
        token = os.environ["KVPOOL_TOKEN"]
    return (("authorization", f"Bearer {token}"),)


def closed_within(sock: Any, seconds: float) -> bool:
    """Whether the peer closes ``sock`` within ``seconds`` (what it sends is read and
    dropped; a reset counts as closed)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(1 << 16):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def lane_socket(port: int, timeout: float = 5.0) -> Any:
    """A TLS connection to the master's lane on 127.0.0.1:``port`` (no AUTH frame sent)."""
    import socket

    from kvpool.security.caller import CallerCredentials

    context = CallerCredentials.resolve().lane_context()
    assert context is not None
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return context.wrap_socket(sock, server_hostname="127.0.0.1")


def sourced(path: Any) -> dict[str, str]:
    """The variables a shell's ``source PATH`` of an env file of `kvpool up` exports."""
    import shlex

    exported = {}
    for line in path.read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        exported[name] = shlex.split(value)[0]
    return exported


class FrameRecorder(asyncio.Transport):
    """A transport that keeps, frame by frame, what the master's lane writes to it."""

    def __init__(self) -> None:
        from kvpool.common import lane_protocol as lp

        super().__init__()
        self.decoder = lp.FrameDecoder()
        self.frames: list[lp.Frame] = []

    def write(self, data: Any) -> None:
        self.frames.extend(self.decoder.feed(data))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def close(self) -> None:
        pass


_live_workers: list[Any] = []


def ucx_worker_address() -> bytes:
    """The address of a real UCX worker in this test process, never progressed: what a fake
    node mounts with, since the master takes only addresses shaped like UCX's. A peer that
    connects to it reaches this process and times out; it sends nothing anywhere else."""
    if not _live_workers:
        from kvpool.transport import ucp

        context = ucp.Context({"TLS": "tcp,cma"})
        _live_workers.extend([context, ucp.Worker(context)])
    return _live_workers[1].address


def survives_a_stopped_master(
    cluster: Any, script: Any, env: dict[str, str], cwd: Any = None
) -> None:
    """Runs ``script`` (given the master's address) in a process of its own while the master
    is stopped (every call of the script then fails as a whole), and asserts the process
    lived: exit 0, ``survived`` printed, no ``BufferError`` (the collector's, before a
    segfault). A crash ends that process only, and fails the calling test."""
    import signal

    cluster.master.signal(signal.SIGSTOP)
    try:
        child = subprocess.run(
            [sys.executable, "-X", "faulthandler", str(script), cluster.master_address],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=cwd,
            env=env,
        )
    finally:
        cluster.master.signal(signal.SIGCONT)
    output = child.stdout + child.stderr[-6000:]
    assert child.returncode == 0, f"{script.name} ended with {child.returncode}:\n{output}"
    assert "survived" in child.stdout, output
    assert "BufferError" not in child.stderr, output


#: How long a fork child of ``in_fork_child`` may take.
CHILD_TIMEOUT = 60.0


def in_fork_child(work: Callable[[], str]) -> str:
    """Runs ``work`` in a fork child and returns what it returned (or how it failed)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        status = 0
        try:
            os.close(read_end)
            try:
                answer = work()
            except BaseException as error:
                answer = f"child raised {type(error).__name__}: {error}"
            os.write(write_end, answer.encode())
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    answer = b""
    deadline = time.monotonic() + CHILD_TIMEOUT
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read_end], [], [], max(left, 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the fork child did not finish in {CHILD_TIMEOUT}s (it hangs)")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            answer += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return answer.decode()


def rebuilt_terms(master: Any) -> list[dict[str, Any]]:
    """The "rebuilding the index" lines a master's JSON log holds, one per term it began."""
    return [
        json.loads(line)
        for line in master.log_path.read_text().splitlines()
        if "rebuilding the index" in line
    ]


def fill_disk(path: str | os.PathLike[str]) -> None:
    """Writes ``path`` until its file system has no block left (another process filling the
    disk under a node)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096, 512):
            try:
                while True:
                    os.write(fd, bytes(chunk))
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
        os.fsync(fd)
    finally:
        os.close(fd)
