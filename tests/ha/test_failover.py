"""High availability with a real etcd and real processes: one leader, failover without
losing objects, no split brain, and no late writer of an old term corrupting anything."""

from __future__ import annotations

import os
import threading
import time
import urllib.request

import grpc
import pytest
from helpers import bearer, master_channel, wait_until

from kvpool import Client
from kvpool.client import get_path
from kvpool.client.lane_client import LaneClient, LaneError
from kvpool.errors import KVPoolError, MasterUnavailable, PutAborted
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security.caller import CallerCredentials
from kvpool.transport import ucp

TTL = 2  # seconds: the masters' default etcd lease


def readyz(master) -> int:
    try:
        url = f"http://127.0.0.1:{master.ready['http_port']}/readyz"
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def test_one_master_leads_and_standbys_point_callers_to_it(ha_cluster):
    cluster = ha_cluster(masters=3, nodes=1)
    leader = cluster.leader()
    standbys = [m for m in cluster.masters if m is not leader]
    assert [readyz(m) for m in standbys] == [503, 503]
    leader_address = f"127.0.0.1:{leader.ready['grpc_port']}"
    standby = f"127.0.0.1:{standbys[0].ready['grpc_port']}"
    with master_channel(standby) as channel, pytest.raises(grpc.RpcError) as refused:
        stub = master_pb2_grpc.MasterStub(channel)
        stub.Exists(pb.ExistsRequest(keys=["k"]), timeout=5, metadata=bearer())
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ("kvpool-leader", leader_address) in refused.value.trailing_metadata()
    # its metadata lane refuses the same way (a client that knew it as the leader moves on)
    lane = LaneClient("127.0.0.1", standbys[0].ready["lane_port"], CallerCredentials.resolve())
    with pytest.raises(LaneError) as refused_on_lane:
        lane.call("Exists", pb.ExistsRequest(keys=["k"]), pb.ExistsResponse, timeout=5)
    lane.close()
    assert refused_on_lane.value.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert refused_on_lane.value.leader == leader_address
    # a client given only the standbys follows the hint to the leader
    standby_list = ",".join(f"127.0.0.1:{m.ready['grpc_port']}" for m in standbys)
    with Client(standby_list) as client:
        client.put("via-standby", b"found the leader")
        assert client.get("via-standby") == b"found the leader"


def test_killing_the_leader_during_a_load_loses_nothing_and_returns_no_wrong_byte(ha_cluster):
    cluster = ha_cluster(masters=3, nodes=2)
    published: dict[str, bytes] = {}
    wrong, errors, served_after_kill = [], [], []
    stop = threading.Event()
    killed_at = [0.0]

    def load() -> None:
        with Client(cluster.master_address, timeout=20) as client:
            i = 0
            while not stop.is_set():
                key = f"load-{i}"
                value = os.urandom(1000 + i % 5000)
                started = time.monotonic()
                try:
                    client.put(key, value, replicas=2)
                    published[key] = value
                    for probe in list(published)[-3:]:
                        if client.get(probe) != published[probe]:
                            wrong.append(probe)
                    if killed_at[0] and started > killed_at[0]:  # begun after the kill
                        served_after_kill.append(time.monotonic() - killed_at[0])
                except KVPoolError as error:
                    errors.append(error)
                i += 1

    worker = threading.Thread(target=load)
    worker.start()
    try:
        assert wait_until(lambda: len(published) >= 50, timeout=20)
        before_kill = dict(published)
        killed_at[0] = time.monotonic()
        cluster.leader().kill()
        new_leader = cluster.wait_for_leader(timeout=4 * TTL)
        elected_after = time.monotonic() - killed_at[0]
        assert wait_until(lambda: len(served_after_kill) >= 5, timeout=20), errors[-3:]
    finally:
        stop.set()
        worker.join(timeout=30)
    print(
        f"\nfailover: new leader {new_leader.name} after {elected_after:.2f}s; load served "
        f"again after {served_after_kill[0]:.2f}s; {len(errors)} errors during the failover"
    )
    assert elected_after < 2 * TTL + 1.0
    assert wrong == []
    with Client(cluster.master_address, timeout=20) as client:
        results = client.get_many(list(before_kill))
        lost = [k for k, r in zip(before_kill, results, strict=True) if isinstance(r, Exception)]
        assert lost == [], f"{len(lost)} objects lost: {results[:3]}"
        assert results == list(before_kill.values())


def test_without_etcd_the_leader_stops_serving_mutations_and_resumes_when_etcd_returns(
    ha_cluster, etcd
):
    cluster = ha_cluster(masters=2, nodes=1)
    with Client(cluster.master_address, timeout=3) as client:
        client.put("kept", b"k" * 100_000)
        # a reader holds a lease and has located the object when etcd goes away
        results: list = [None]
        located, lease_end = get_path.locate(
            client._session, ["kept"], [0], results, time.monotonic() + 5
        )
        target = bytearray(100_000)
        etcd.stop()
        stopped = time.monotonic()
        assert wait_until(lambda: cluster.leader() is None, timeout=TTL + 1)
        assert time.monotonic() - stopped < TTL, "it stops before its lease could expire"
        with pytest.raises(MasterUnavailable):
            client.put("refused", b"x")
        # the read begun under the lease still finishes, straight from the storage node
        results = [100_000]
        target_address = ucp.address_of(target, writable=True)[0]
        get_path.read(
            client._session,
            ["kept"],
            located,
            {0: (target_address, 100_000)},
            results,
            time.monotonic() + 5,
            lease_end,
        )
        assert results == [100_000] and bytes(target) == b"k" * 100_000
    etcd.start()
    cluster.wait_for_leader(timeout=10)
    with Client(cluster.master_address, timeout=15) as client:
        assert client.get("kept") == b"k" * 100_000
        client.put("after-etcd-returned", b"ok")
        assert client.get("after-etcd-returned") == b"ok"


def test_a_late_writer_of_the_old_term_cannot_overwrite_what_the_new_leader_publishes(
    ha_cluster,
):
    # (a write window of 6 s, not 3: a put right after a failover, on a loaded machine, could
    # get its PutStart answered too late to write in 3 s: seen once in CI)
    cluster = ha_cluster(masters=2, nodes=1, dram="16MiB", master_args=("--write-timeout", "6"))
    size = 1 << 20
    with Client(cluster.master_address, timeout=30) as late:
        reservation = late.reserve("late", size)  # the old leader reserves...
        # ...and the writer stalls (a GC pause, a stopped VM) across the failover
        cluster.leader().kill()
        cluster.wait_for_leader(timeout=4 * TTL)
        with Client(cluster.master_address, timeout=30) as other:
            fresh = os.urandom(size)
            other.put("fresh", fresh)  # waits out the fence, then may reuse that space
            time.sleep(0.2)
            with pytest.raises(PutAborted, match="write window"):
                reservation.write(b"\xee" * size)  # too late: the client refuses to write
            with pytest.raises(PutAborted):
                reservation.commit()  # and the new term never heard of this put
            assert other.get("fresh") == fresh
