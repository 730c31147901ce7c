"""A client's UCX worker given up after a transfer it could not stop is never used again
(client/data_path.py).

A request the worker gave up on may still complete, into memory its caller has reused since:
so the lane gets a fresh worker. When none can be made (out of file descriptors, say), the
lane itself goes, rather than going back to work with the tainted worker.
"""

from __future__ import annotations

import time

from kvpool.transport import ucp


def test_a_tainted_worker_is_replaced_by_a_fresh_one(data_path):
    lane = data_path._take_lane(time.monotonic() + 5)
    tainted = lane.worker
    tainted.tainted = True  # (as a transfer it could not stop leaves it)

    data_path._replace_worker(lane)
    data_path._give_lane_back(lane)

    assert lane.worker is not tainted and not lane.worker.tainted
    assert data_path._idle == [lane] and tainted in data_path._abandoned


def test_when_no_fresh_worker_can_be_made_the_lane_goes_with_its_tainted_worker(
    data_path, monkeypatch
):
    lane = data_path._take_lane(time.monotonic() + 5)
    tainted = lane.worker
    tainted.tainted = True

    def no_more_workers() -> ucp.Worker:
        raise ucp.UcxError("ucp_worker_create", -24)  # (-EMFILE)

    monkeypatch.setattr(data_path.context, "create_worker", no_more_workers)
    data_path._replace_worker(lane)
    data_path._give_lane_back(lane)

    assert lane not in data_path._lanes and lane not in data_path._idle, "never used again"
    assert tainted in data_path._abandoned
    monkeypatch.undo()
    assert data_path._take_lane(time.monotonic() + 5).worker is not tainted, "a new lane"
