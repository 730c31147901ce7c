"""A writer is told where to write only once the node forgot what lay there (forget_barrier.py).

``pending`` names the unanswered Forgets whose byte ranges overlap a buffer about to be handed
out; an answer or the node's death releases them.
"""

from __future__ import annotations

import random

from kvpool.master.forget_barrier import ForgetBarrier
from kvpool.master.records import ForgetCommand, StoredObject


def forget(command_id: int, offset: int, size: int, node: str = "n1") -> ForgetCommand:
    stored = StoredObject("old", offset, size, generation=1)
    return ForgetCommand(command_id, node, f"{node}/dram0", (stored,))


def test_only_buffers_overlapping_an_unanswered_forget_wait_and_an_answer_releases_them():
    barrier = ForgetBarrier()
    barrier.sent(forget(7, offset=1000, size=500))  # bytes 1000..1499

    assert barrier.pending("n1/dram0", 0, 1000) == [], "ends where the old object starts"
    assert barrier.pending("n1/dram0", 1500, 100) == [], "starts where it ended"
    assert barrier.pending("n2/dram0", 1000, 500) == [], "another segment"
    assert barrier.pending("n1/dram0", 1400, 200) == [7]

    assert barrier.answered(7)

    assert barrier.pending("n1/dram0", 1400, 200) == []
    assert len(barrier) == 0
    assert not barrier.answered(7), "a second answer holds nothing back"


def test_a_dead_node_releases_its_forgets_only():
    barrier = ForgetBarrier()
    barrier.sent(forget(1, 0, 64, node="n1"))
    barrier.sent(forget(2, 0, 64, node="n2"))

    assert barrier.node_gone("n1") == [1]
    assert barrier.pending("n1/dram0", 0, 64) == []
    assert barrier.pending("n2/dram0", 0, 64) == [2]


def test_a_forget_naming_many_objects_holds_back_exactly_the_buffers_that_overlap_one():
    """A large removal sends one Forget naming thousands of objects, in any order, some even
    sharing bytes (a range forgotten twice); a buffer waits exactly when it overlaps one."""
    rng = random.Random(5)
    objects = [StoredObject(f"k{i}", rng.randrange(0, 1 << 24), rng.randrange(0, 4096), 1)
               for i in range(2000)]  # fmt: skip
    objects.append(StoredObject("long", 10, 500_000, 1))  # reaches over many others
    barrier = ForgetBarrier()
    barrier.sent(ForgetCommand(1, "n1", "n1/dram0", tuple(objects)))
    outcomes = set()
    for _ in range(3000):
        offset, size = rng.randrange(0, 1 << 24), rng.randrange(0, 8192)
        end = offset + max(size, 1)
        expected = any(o.offset < end and offset < o.offset + max(o.size, 1) for o in objects)
        assert bool(barrier.pending("n1/dram0", offset, size)) == expected, (offset, size)
        outcomes.add(expected)
    assert outcomes == {True, False}, "the queries try both"
