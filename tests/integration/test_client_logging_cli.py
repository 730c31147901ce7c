"""``kvpool get KEY > file``: the file holds the object's bytes and nothing else, whatever the
client library logs on the way (its lines go to stderr, warnings and errors only).

The command closes its client after writing the object; a master that does not answer then
(stopped here) makes the client log that it could not give its leases back. Unconfigured,
structlog printed that line on stdout, after the object, and the command still exited 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

from kvpool import Client

SIZE = 1 << 20


def kvpool_get(master: str, key: str, *python: str) -> subprocess.Popen[bytes]:
    """``kvpool get KEY`` with its stdout and stderr on pipes (``python``: the interpreter's
    arguments that run the command, ``-m kvpool.cli.main`` unless given)."""
    return subprocess.Popen(
        [sys.executable, *(python or ("-m", "kvpool.cli.main")), "get", key, "--timeout", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "KVPOOL_MASTER": master},
    )


def stored(master: str) -> tuple[str, bytes]:
    key, data = f"cli-log-{uuid.uuid4().hex}", os.urandom(SIZE)
    with Client(master) as client:
        client.put(key, data)
    return key, data


def test_a_master_that_stops_answering_after_the_get_adds_nothing_to_its_output(
    cluster_factory,
):
    cluster = cluster_factory(1, "64MiB")
    key, data = stored(cluster.master_address)
    get = kvpool_get(cluster.master_address, key)
    assert get.stdout is not None
    first = get.stdout.read(65536)  # (the get is done: the object is being written)
    cluster.master.signal(signal.SIGSTOP)  # (so giving the leases back fails, and is logged)
    try:
        rest, errors = get.communicate(timeout=60)
    finally:
        cluster.master.signal(signal.SIGCONT)
    assert get.returncode == 0, errors
    assert first + rest == data, f"{len(first + rest) - SIZE} bytes more: {(first + rest)[SIZE:]!r}"


#: Runs ``kvpool get`` with its client logging a warning and a debug line as it closes.
LOGGING_CLOSE = """
import sys
from kvpool.client import client
from kvpool.cli.main import main

closing = client.Client.close
def close(self):
    client.log.debug("a debug line")
    client.log.warning("a warning line", key="k")
    closing(self)
client.Client.close = close
sys.exit(main(sys.argv[1:]))
"""


def test_a_warning_of_the_client_goes_to_stderr_as_a_json_line(shared_cluster):
    key, data = stored(shared_cluster.master_address)
    get = kvpool_get(shared_cluster.master_address, key, "-c", LOGGING_CLOSE)
    output, errors = get.communicate(timeout=60)
    assert get.returncode == 0, errors
    assert output == data
    events = [json.loads(line) for line in errors.decode().splitlines()]
    assert [(e["event"], e["level"]) for e in events] == [("a warning line", "warning")]
