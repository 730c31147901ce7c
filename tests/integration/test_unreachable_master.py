"""Nothing listening at the master's address is known at once, and said at once.

A connection refused where no master has answered yet means a wrong address or a master not
started: waiting out the deadline (10 s by default) would only delay the same message. Once
a master has answered, a refusal means one restarting, and calls wait for it within their
deadline.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from kvpool import Client
from kvpool.errors import KVPoolError, MasterUnavailable

#: Far below the default 10 s deadline, far above a refused connect.
AT_ONCE = 3.0


def free_port() -> int:
    with socket.socket() as s:  # closed again: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("masters", [1, 2], ids=["one-master", "a-list-of-two"])
def test_kvpool_commands_fail_at_once_where_nothing_listens(masters):
    address = ",".join(f"127.0.0.1:{free_port()}" for _ in range(masters))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "kvpool.cli.main", "get", "mykey", "--master", address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < AT_ONCE, "without waiting out its 10 s deadline"
    assert done.returncode == 1
    assert f"master {address} did not answer" in done.stderr
    assert "connection refused" in done.stderr and "Traceback" not in done.stderr


def test_a_client_fails_at_once_where_nothing_listens():
    address = f"127.0.0.1:{free_port()}"
    with Client(address) as client:
        started = time.monotonic()
        with pytest.raises(MasterUnavailable, match="connection refused"):
            client.put("k", b"v")
        assert time.monotonic() - started < AT_ONCE


def test_a_client_that_reached_a_master_waits_while_it_restarts(cluster_factory):
    cluster = cluster_factory(1, "16MiB")
    with Client(cluster.master_address, timeout=30) as client:
        client.put("before", b"kept by the node")
        cluster.master.kill()
        outcome: list[object] = []

        def read() -> None:
            try:
                outcome.append(client.get("before"))
            except KVPoolError as error:
                outcome.append(error)

        reader = threading.Thread(target=read)
        reader.start()  # refused while the master is down
        time.sleep(1.5)
        assert reader.is_alive(), f"it did not give up: {outcome}"
        cluster.start_master()  # same port, empty memory (from this thread: see local_cluster)
        reader.join(timeout=30)
        assert outcome == [b"kept by the node"]
