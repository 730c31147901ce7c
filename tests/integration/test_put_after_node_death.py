"""The seconds after a storage node dies, before the master declares it dead.

The master learns that a node died only once it has missed heartbeats for the node TTL
(``--node-ttl``); until then it still places replicas there and still lists what the node
held. A client learns sooner, from its first failed transfer, and:

- places again, on a live node, every put whose replicas it could not write there, within the
  caller's deadline, and has the master avoid that node in its next puts for a few seconds
  (``NoSpace`` when no other node has room);
- fails a get of an object whose only copy was there at once, naming the node and saying
  when the master will notice (``exists`` answers from the master: True until then);
- says nothing on the caller's terminal: UCX's own complaints (``mm_sysv.c:61 UCX ERROR
  shmat(...) failed``) go to kvpool's structured log, as warnings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import cluster_status

from kvpool import Client
from kvpool.errors import NoSpace

#: Long enough that the master never notices the death during a test.
NODE_TTL = "60"

#: A client process started right after the node died. It logs as kvpool's processes do
#: (JSON lines on stderr) and prints what it saw as one JSON line on stdout.
CLIENT = r"""
import json, os, sys, time
from kvpool import Client
from kvpool.common.logging import configure_logging
from kvpool.errors import KVPoolError

configure_logging("json")
master, lonely = sys.argv[1:]
values = {f"after-death-{i}": os.urandom(64 << 10) for i in range(40)}
keys = list(values)
seen = {}
with Client(master, replicas=1, timeout=5) as client:
    results = [client.put(key, values[key]) for key in keys[:20]]  # one by one
    results += client.put_many([(key, values[key]) for key in keys[20:]])  # and as a batch
    seen["puts"] = [r if isinstance(r, int) else repr(r) for r in results]
    seen["nodes"] = sorted({r.node_id for key in keys for r in client.stat(key).replicas})
    seen["misread"] = [key for key in keys if client.get(key) != values[key]]
    seen["lonely_exists"] = client.exists(lonely, lease=False)
    start = time.monotonic()
    try:
        client.get(lonely)
    except KVPoolError as error:
        seen["lonely_get"] = [type(error).__name__, str(error)]
    seen["lonely_get_seconds"] = time.monotonic() - start
    admin = Client(master, token=os.environ["KVPOOL_TEST_ADMIN_TOKEN"])  # (the topology)
    seen["nodes_the_master_knows"] = admin.cluster_status().nodes
    admin.close()
print(json.dumps(seen))
"""


def only_copy_on(client: Client, node_id: str) -> str:
    """Puts single-replica objects until one lands on ``node_id``; returns its key."""
    for i in range(200):
        key = f"on-{node_id}-{i}"
        client.put(key, os.urandom(4096), replicas=1)
        if [r.node_id for r in client.stat(key).replicas] == [node_id]:
            return key
    raise AssertionError(f"no object landed on {node_id}")


def test_right_after_a_node_dies_puts_land_on_the_live_node_and_the_terminal_stays_quiet(
    cluster_factory,
):
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", NODE_TTL])
    victim, survivor = (node.ready["node_id"] for node in cluster.nodes)
    with Client(cluster.master_address, timeout=5) as client:
        lonely = only_copy_on(client, victim)
    cluster.nodes[0].kill()

    done = subprocess.run(
        [sys.executable, "-c", CLIENT, cluster.master_address, lonely],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    *raw_stdout, last = done.stdout.splitlines()
    assert raw_stdout == [], "nothing but the client's own output on its stdout"
    seen = json.loads(last)

    assert seen["puts"] == [1] * 40, "every put succeeded, with its one replica"
    assert seen["nodes"] == [survivor], "all on the live node"
    assert seen["misread"] == [], "every object reads back exactly"

    assert seen["lonely_exists"] is True, "the master has not noticed yet"
    kind, message = seen["lonely_get"]
    assert kind == "TransferError"
    assert victim in message
    assert "--node-ttl" in message
    assert seen["lonely_get_seconds"] < 1.0, "it fails at once, not at the deadline"
    assert seen["nodes_the_master_knows"] == 2, "all of this happened within the node TTL"

    events = []
    for line in done.stderr.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a raw line on the client's stderr: {line!r}") from None
    from_ucx = [e for e in events if e["event"] == "ucx reported"]
    assert all(e["level"] == "warning" for e in from_ucx), from_ucx


def test_a_client_already_writing_to_a_node_when_it_dies_moves_on_to_the_live_node(
    cluster_factory,
):
    """This client had mapped both nodes' memory (same host) before one died: it sees the
    node's process exit instead of a UCX failure, and places the puts again all the same."""
    cluster = cluster_factory(2, "64MiB", master_args=["--node-ttl", NODE_TTL])
    victim, survivor = (node.ready["node_id"] for node in cluster.nodes)
    with Client(cluster.master_address, replicas=1, timeout=5) as client:
        only_copy_on(client, victim)
        only_copy_on(client, survivor)
        cluster.nodes[0].kill()
        values = {f"after-death-{i}": os.urandom(64 << 10) for i in range(30)}
        assert client.put_many(values) == [1] * len(values)
        for key, value in values.items():
            assert [r.node_id for r in client.stat(key).replicas] == [survivor]
            assert client.get(key) == value
        assert cluster_status(client.master).nodes == 2, "within the node TTL"


def test_when_no_live_node_has_room_the_put_fails_with_no_space_naming_the_node_left_out(
    cluster_factory,
):
    cluster = cluster_factory(1, "64MiB", master_args=["--node-ttl", NODE_TTL])
    cluster.add_node(dram="8MiB")
    victim = cluster.nodes[0].ready["node_id"]
    cluster.nodes[0].kill()
    with Client(cluster.master_address, replicas=1, timeout=5) as client:
        with pytest.raises(NoSpace) as caught:
            client.put("too-big-for-the-live-node", os.urandom(16 << 20))  # placed on the victim
        assert f"left out: node(s) {victim}" in str(caught.value)
        assert client.put("small", b"fits") == 1  # the live node still takes what fits
