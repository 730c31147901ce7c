"""A master's readiness as the Helm chart probes several masters (``/readyz?role=any``): the
leader is ready, and a standby while etcd answers it (it can campaign, and take over); a
standby cut off from etcd, which could never take over, is not, within the election's
contact window. ``/readyz`` stays the leader's alone and ``/healthz`` (liveness) answers
throughout. Real masters and a real etcd (tests/ha/conftest.py), etcd stopped, then hung."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request

from helpers import wait_until

from kvpool.master.election import Election

TTL = 2  # seconds: the masters' default etcd lease
#: What the election allows between etcd's answers before a standby is out of touch.
WINDOW = Election(["127.0.0.1:1"], "x", "", TTL).contact_window
ANY = "/readyz?role=any"


def probe(master, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{master.ready['http_port']}{path}"
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def code(master, path: str) -> int:
    return probe(master, path)[0]


def test_a_standby_is_ready_while_etcd_answers_it_and_not_once_it_cannot_campaign(ha_cluster, etcd):
    cluster = ha_cluster(masters=2, nodes=0)
    leader = cluster.wait_for_leader(timeout=30)
    (standby,) = [m for m in cluster.masters if m is not leader]
    leader_name = f"127.0.0.1:{leader.ready['grpc_port']}"

    assert probe(leader, ANY) == (200, "leading\n")
    assert probe(leader, "/readyz?role=leader") == (200, "leading\n")
    # ready once etcd answers it; it names the leader once its watch has read the leader key
    following = (200, f"standby; the leader is {leader_name}\n")
    assert wait_until(lambda: probe(standby, ANY) == following, timeout=10), probe(standby, ANY)
    assert probe(standby, "/readyz")[0] == 503, "/readyz is the leader's alone"
    assert probe(standby, "/readyz?role=nobody")[0] == 400

    # etcd gone: the standby can no longer campaign (nor the leader keep its lease)
    etcd.stop()
    stopped = time.monotonic()
    assert wait_until(lambda: code(standby, ANY) == 503, timeout=WINDOW + 3), probe(standby, ANY)
    assert time.monotonic() - stopped < WINDOW + 3
    reason = probe(standby, ANY)[1]
    assert reason.startswith("standby; etcd unreachable since "), reason
    assert wait_until(lambda: code(leader, ANY) == 503, timeout=WINDOW + 3), probe(leader, ANY)
    for master in (leader, standby):
        assert probe(master, "/healthz") == (200, "ok\n"), "liveness is unaffected"

    # etcd back: both ready again, one of them leading
    etcd.start()
    cluster.wait_for_leader(timeout=15)
    for master in cluster.masters:
        assert wait_until(lambda m=master: code(m, ANY) == 200, timeout=10), probe(master, ANY)

    # etcd hung rather than gone (calls time out rather than fail at once): the same
    assert etcd.process is not None
    leader = cluster.wait_for_leader(timeout=15)
    (standby,) = [m for m in cluster.masters if m is not leader]
    etcd.process.send_signal(signal.SIGSTOP)
    try:
        hung = time.monotonic()
        assert wait_until(lambda: code(standby, ANY) == 503, timeout=WINDOW + 3)
        assert time.monotonic() - hung < WINDOW + 3
        assert probe(standby, ANY)[1].startswith("standby; etcd unreachable since ")
        assert probe(standby, "/healthz") == (200, "ok\n")
    finally:
        etcd.process.send_signal(signal.SIGCONT)
    assert wait_until(lambda: code(standby, ANY) == 200, timeout=15), probe(standby, ANY)
