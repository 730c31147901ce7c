"""A segment mounted again by a new node process under the same id (NVMe, ``--dram-shm``)
takes no new object until the capabilities the master signed for it have run out
(master/state.py, ``capabilities_until``): the node's seals, which end a removed object's
capabilities early, lived in the old process. Without this, a reader that kept the read
capability of an object it removed could read whatever was put in that space next."""

from __future__ import annotations

import dataclasses

from state_helpers import mount, new_state, put

from kvpool.common.status import KeyStatus


def test_a_new_process_of_a_segment_with_capabilities_still_running_takes_nothing_new():
    state, clock = new_state()
    info = mount(state, "n1", segment="n1/nvme0")
    state.capabilities_until["n1/nvme0"] = clock.now + 30  # (a 30 s lease, signed just now)
    clock.advance(1)
    restarted = dataclasses.replace(info, worker_address=b"ucx-worker-of-the-new-process")
    state.mount_segment(restarted)  # a new process: not a remount
    assert put(state, "new-object").status == KeyStatus.FENCED

    for _ in range(31):  # the capability runs out (and the margin); the node lives on
        clock.advance(1)
        state.heartbeat("n1", ["n1/nvme0"])
        state.tick()
    assert "n1/nvme0" not in state.capabilities_until, "forgotten once past"
    assert put(state, "new-object").status == KeyStatus.OK


def test_a_segment_without_capabilities_running_is_used_at_once_after_a_restart():
    state, clock = new_state()
    info = mount(state, "n1", segment="n1/nvme0")
    state.capabilities_until["n1/nvme0"] = clock.now + 5
    clock.advance(6)
    restarted = dataclasses.replace(info, worker_address=b"ucx-worker-of-the-new-process")
    state.mount_segment(restarted)
    assert put(state, "new-object").status == KeyStatus.OK
