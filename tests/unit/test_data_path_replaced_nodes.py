"""A client lets go of its UCX connections to a node process that was replaced
(client/data_path.py, ``_forget_replaced``).

Each restart of a node brings a new worker address (and new DRAM segment ids): the client's
endpoints to the old process would otherwise stay open for the client's life, one per lane,
with every restart of every node it ever used. A "node" here is a UCX worker of this process
with a registered buffer, as a storage node's segment is.
"""

from __future__ import annotations

import time

import pytest

from kvpool.proto import master_pb2 as pb
from kvpool.transport import ucp


@pytest.fixture
def node_processes():
    """Two processes of node n1, one after the other: (worker, memory region) each."""
    context = ucp.Context({"TLS": "tcp"})
    processes = []
    for _ in range(2):
        worker = context.create_worker()
        memory = bytearray(1 << 16)
        processes.append((worker, context.register(memory), memory))
    yield processes
    for worker, region, _ in processes:
        region.close()
        worker.close()
    context.close()


def descriptor(segment_id: str, worker: ucp.Worker, region: ucp.MemoryRegion) -> pb.Segment:
    return pb.Segment(
        segment_id=segment_id,
        node_id="n1",
        host="127.0.0.1",
        worker_address=worker.address,
        base_address=region.address,
        size=region.length,
        rkey=region.rkey,
    )


@pytest.mark.parametrize(
    ("old_id", "new_id"),
    [("n1/dram-old", "n1/dram-new"), ("n1/nvme-0", "n1/nvme-0")],
    ids=["a new segment id (DRAM)", "the same id (NVMe, --dram-shm)"],
)
def test_endpoints_to_a_replaced_node_process_are_closed(node_processes, data_path, old_id, new_id):
    """(A persistent segment keeps its id across restarts: its new descriptor took the old
    one's place before the old process was looked for, which was then never found.)"""
    (old_worker, old_region, _), (new_worker, new_region, _) = node_processes
    data_path.learn([descriptor(old_id, old_worker, old_region)])
    lane = data_path._take_lane(time.monotonic() + 5)
    data_path._route(lane, old_id)
    data_path._give_lane_back(lane)
    assert old_worker.address in lane.endpoints

    data_path.learn([descriptor(new_id, new_worker, new_region)])  # n1 restarted
    lane = data_path._take_lane(time.monotonic() + 5)
    assert old_worker.address not in lane.endpoints, "closed before the lane's next use"
    assert old_id not in lane.routes
    data_path._route(lane, new_id)  # (the new process is reached as before)
    assert new_worker.address in lane.endpoints
    data_path._give_lane_back(lane)


def test_a_buffer_registered_after_close_is_refused(data_path):
    from kvpool.errors import ClientClosed

    data_path.close()
    with pytest.raises(ClientClosed):
        data_path.register(bytearray(4096))
