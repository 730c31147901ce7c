"""The LMCache adapter's health probe says unhealthy while the master turns clients away.

The master answers ClusterStatus while it rebuilds its index or hears from no node (so that
operators see why); nodes may already be mounted then, and every put and get is still
refused. The probe reads the answer's ``clients_refused``, not only its nodes.
"""

from kvpool.lmcache.health import HealthProbe
from kvpool.proto import master_pb2 as pb


class Answers:
    """A control plane that answers ClusterStatus with a given response (the probe's only
    call: what a master says is input here; the real round trip is tested end to end in
    tests/lmcache)."""

    def __init__(self, response: pb.ClusterStatusResponse) -> None:
        self.response = response

    def cluster_status(self, timeout: float) -> pb.ClusterStatusResponse:
        return self.response


def status(**fields: object) -> pb.ClusterStatusResponse:
    response = pb.ClusterStatusResponse(nodes=1, **fields)
    response.segments.add(segment_id="n1/dram-0", node_id="n1", capacity=1 << 20)
    return response


def test_a_master_serving_clients_with_a_node_is_healthy():
    health = HealthProbe(Answers(status()), timeout=1.0).check()  # type: ignore[arg-type]
    assert health.reachable and health.healthy and health.reason == ""


def test_a_master_rebuilding_its_index_is_unhealthy_though_nodes_are_mounted():
    refused = status(clients_refused="the master is rebuilding its index: retry shortly")
    health = HealthProbe(Answers(refused), timeout=1.0).check()  # type: ignore[arg-type]
    assert health.reachable and not health.healthy
    assert "rebuilding its index" in health.reason


def test_a_master_without_nodes_is_unhealthy():
    empty = pb.ClusterStatusResponse(nodes=0)
    health = HealthProbe(Answers(empty), timeout=1.0).check()  # type: ignore[arg-type]
    assert not health.healthy and "no storage node" in health.reason
