"""While no master leads (etcd down): a standby names no leader once etcd has stopped
answering it for longer than the election's lease TTL (master/election.py ``leader``): the
one it read has stepped down, and nodes and clients sent there would only bounce between
the masters. A storage node meanwhile says it looks for the leading master at a bounded rate
(storage_node/node.py ``LeaderSearch``), a standby that names no leader not taken for one
that refused it. Real masters, node and etcd (tests/ha/conftest.py); the rules themselves:
tests/unit/test_leaderless_hints.py."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from helpers import wait_until

from kvpool.master.election import Election

TTL = 2  # seconds: the masters' default etcd lease
#: How long a standby names the leader it read after etcd last answered it.
WINDOW = Election(["127.0.0.1:1"], "x", "", TTL).contact_window
NONE_YET = (503, "standby; the leader is (none yet)")


def readyz(master) -> tuple[int, str]:
    url = f"http://127.0.0.1:{master.ready['http_port']}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode().strip()
    except OSError as error:
        return 0, str(error)


def test_a_standby_cut_off_from_etcd_names_no_leader_past_the_lease_ttl(ha_cluster, etcd):
    cluster = ha_cluster(masters=2, nodes=0)
    leader = cluster.wait_for_leader(timeout=30)
    (standby,) = [m for m in cluster.masters if m is not leader]
    following = (503, f"standby; the leader is 127.0.0.1:{leader.ready['grpc_port']}")
    assert wait_until(lambda: readyz(standby) == following, timeout=10), readyz(standby)

    etcd.stop()
    stopped = time.monotonic()
    assert wait_until(lambda: readyz(standby) == NONE_YET, timeout=WINDOW + 3), readyz(standby)
    assert time.monotonic() - stopped < WINDOW + 3
    assert wait_until(lambda: readyz(leader) == NONE_YET, timeout=WINDOW + 3), readyz(leader)
    # and so it stays while etcd is down (before: the stepped-down leader, for the outage)
    for _ in range(8):
        time.sleep(0.5)
        assert readyz(standby) == NONE_YET
        assert readyz(leader) == NONE_YET

    # etcd back: one of them leads, and the other names it
    etcd.start()
    leader = cluster.wait_for_leader(timeout=15)
    (standby,) = [m for m in cluster.masters if m is not leader]
    following = (503, f"standby; the leader is 127.0.0.1:{leader.ready['grpc_port']}")
    assert wait_until(lambda: readyz(standby) == following, timeout=10), readyz(standby)


LOOKING = "looking for the leading master"


def test_a_node_without_a_leader_says_so_a_few_times_not_twice_a_second(ha_cluster, etcd):
    cluster = ha_cluster(masters=2, nodes=1)
    cluster.wait_for_leader(timeout=30)
    (node,) = cluster.nodes
    before = len(node.log_path.read_text(errors="replace"))

    etcd.stop()
    time.sleep(12)  # (the node looks for a leader every heartbeat: before, ~25 lines)
    during = node.log_path.read_text(errors="replace")[before:]
    looking = during.count(LOOKING)
    assert 1 <= looking <= 3, f"{looking} lines in 12 s without a leader:\n{during}"
    assert "master refused" not in during, "a standby naming no leader refused nobody"
    assert "no leader elected yet" in during

    etcd.start()
    cluster.wait_for_leader(timeout=15)
    assert wait_until(
        lambda: "following the leading master" in node.log_path.read_text(errors="replace"),
        timeout=15,
    ), node.log_tail()
