"""A mapping that a client lets go of while a copy still runs through it is released when
that copy ends, as many times as it was let go (client/data_path.py, ``_let_go`` and
``_unpin``).

The process's ``MAPPINGS`` count their users: a client that acquired the same mapping twice
(its node's descriptor changed, the segment was mapped again, the descriptor changed again,
all during one long copy) must release it twice, or the node's memory stays mapped in this
process until it exits. The mapping here is a stand-in for the kernel mapping (its
bookkeeping is what is under test); the counting is ``MAPPINGS``'s own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False)
class CountedMapping:
    origin: tuple[int, ...]
    users: int = 0
    pidfd: int = -1
    closed: bool = False

    def close(self) -> None:
        self.closed = True


def test_a_mapping_let_go_twice_during_a_copy_is_released_twice(data_path):
    mapped = CountedMapping(origin=(0, 1, 2), users=2)  # acquired twice by this client
    data_path._pins[mapped] = 1  # a copy runs through it
    data_path._let_go(mapped)  # a new descriptor came
    data_path._let_go(mapped)  # mapped again, and another descriptor came
    assert not mapped.closed, "a copy still runs through it"

    data_path._unpin(mapped)  # the copy ended

    assert mapped.users == 0
    assert mapped.closed, "the node's memory stays mapped after its last user let go"
    assert not data_path._release_later


def test_a_mapping_let_go_once_during_two_copies_waits_for_both(data_path):
    mapped = CountedMapping(origin=(0, 1, 3), users=1)
    data_path._pins[mapped] = 2
    data_path._let_go(mapped)

    data_path._unpin(mapped)
    assert not mapped.closed, "the second copy still runs through it"
    data_path._unpin(mapped)
    assert mapped.closed and mapped.users == 0
