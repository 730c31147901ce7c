"""Forgets for one segment in a row reach the node as one command (command_batching.py)."""

from __future__ import annotations

from kvpool.master.command_batching import MAX_OBJECTS, merge_forgets
from kvpool.master.records import ForgetCommand, PersistCommand, StoredObject


def obj(key: str, offset: int = 0) -> StoredObject:
    return StoredObject(key, offset, 64, generation=1)


def forget(command_id: int, key: str, node: str = "n1", segment: str = "n1/dram0") -> ForgetCommand:
    return ForgetCommand(command_id, node, segment, (obj(key),))


def persist(command_id: int, node: str = "n1") -> PersistCommand:
    return PersistCommand(command_id, node, f"{node}/dram0", (obj("p"),))


def test_a_run_of_forgets_for_one_segment_becomes_one_command_with_the_first_id():
    merged = merge_forgets([forget(1, "a"), forget(2, "b"), forget(3, "c")])
    assert merged == [ForgetCommand(1, "n1", "n1/dram0", (obj("a"), obj("b"), obj("c")))]


def test_commands_for_other_nodes_in_between_do_not_stop_a_run():
    merged = merge_forgets([forget(1, "a"), persist(2, node="n2"), forget(3, "b")])
    assert merged == [
        ForgetCommand(1, "n1", "n1/dram0", (obj("a"), obj("b"))),
        persist(2, node="n2"),
    ]


def test_nothing_moves_past_another_command_for_the_same_node():
    commands = [
        forget(1, "a"),
        persist(2),  # the node must run it between the two Forgets
        forget(3, "b"),
        forget(4, "c", segment="n1/nvme0"),  # another segment of the same node
        forget(5, "d"),
    ]
    assert merge_forgets(commands) == commands


def test_a_merged_forget_holds_at_most_max_objects():
    commands = [forget(i, f"k{i}") for i in range(MAX_OBJECTS + 10)]
    merged = merge_forgets(commands)
    assert [len(c.objects) for c in merged] == [MAX_OBJECTS, 10]
    assert [c.command_id for c in merged] == [0, MAX_OBJECTS]
    assert [o.key for c in merged for o in c.objects] == [f"k{i}" for i in range(MAX_OBJECTS + 10)]
