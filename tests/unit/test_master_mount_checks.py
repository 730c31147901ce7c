"""What a node may mount (``MasterState.mount_problem``): the integrity of placement.

- A segment id belongs to the node that mounted it: another node may not take it over.
- Memory one mounted segment describes is not mounted again under another id: not the same
  worker's overlapping address range, not the same shared-memory mapping; a worker address
  belongs to one node.
- A node mounting its own segment again (a remount, a restart) is not refused.
- A node has at most ``MAX_NODE_SEGMENTS`` segments mounted at once.
"""

from __future__ import annotations

import dataclasses

from state_helpers import MiB, mount, new_state, segment_info

from kvpool.master.state import MAX_NODE_SEGMENTS


def test_a_segment_id_belongs_to_the_node_that_mounted_it():
    state, _ = new_state()
    mount(state, "n1", segment="shared-id")
    stolen = segment_info("evil", MiB, "shared-id", base=0x9000_0000)
    problem = state.mount_problem(stolen)
    assert problem is not None and "'n1'" in problem and "another one" in problem


def test_the_same_workers_memory_is_not_mounted_again_under_another_id():
    state, _ = new_state()
    real = mount(state, "n1", 4 * MiB)
    overlapping = dataclasses.replace(
        real, segment_id="n1/again", base_address=real.base_address + MiB
    )
    problem = state.mount_problem(overlapping)
    assert problem is not None and "already holds" in problem
    beside = dataclasses.replace(
        real, segment_id="n1/nvme", base_address=real.base_address + 4 * MiB
    )
    assert state.mount_problem(beside) is None, "the node's next segment, beside it"


def test_another_nodes_worker_address_is_refused():
    state, _ = new_state()
    real = mount(state, "n1", 4 * MiB)
    fake = dataclasses.replace(
        real, segment_id="evil/dram0", node_id="evil", base_address=0x7000_0000_0000
    )
    problem = state.mount_problem(fake)
    assert problem is not None and "UCX worker address of node 'n1'" in problem


def test_the_same_shared_memory_mapping_is_not_mounted_twice():
    state, _ = new_state()
    real = dataclasses.replace(segment_info("n1", MiB), shared_memory=b"pid=1 fd=3 inode=42")
    state.mount_segment(real)
    again = dataclasses.replace(
        segment_info("n2", MiB, "n2/dram0"), shared_memory=b"pid=1 fd=3 inode=42"
    )
    problem = state.mount_problem(again)
    assert problem is not None and "already holds" in problem


def test_a_node_mounting_its_own_segment_again_is_not_refused():
    state, _ = new_state()
    real = mount(state, "n1")
    assert state.mount_problem(real) is None
    restarted = dataclasses.replace(real, worker_address=b"a new worker of n1")
    assert state.mount_problem(restarted) is None


def test_a_node_has_a_bounded_number_of_segments():
    state, _ = new_state()
    for i in range(MAX_NODE_SEGMENTS):
        info = segment_info("n1", MiB, f"n1/s{i}", base=0x1000_0000 + i * 2 * MiB)
        assert state.mount_problem(info) is None
        state.mount_segment(info)
    one_more = segment_info("n1", MiB, "n1/one-more", base=0x9000_0000)
    problem = state.mount_problem(one_more)
    assert problem is not None and f"{MAX_NODE_SEGMENTS} segments" in problem
    assert state.mount_problem(segment_info("n1", MiB, "n1/s0", base=0x1000_0000)) is None
