"""Node commands reach their node even when its stream breaks, and repeating one is harmless.

The core's delivery (master/delivery.py, sans-IO) remembers every command written to a node's
stream until the node answers it; a new stream of that node gets the unanswered ones first (but
not a Persist or Copy the master gave up on, as the core's ``still_wanted`` says, nor one
written to an earlier process of the node: its bytes died with it). An answer counts only from
the node the command was sent to. A node's index forgets exactly the object a
Forget names (its key, offset and generation), so a Forget that arrives twice, or late, never
removes a newer put of the same key.
"""

from __future__ import annotations

from pathlib import Path

from state_helpers import FakeClock, segment_info

from kvpool.common.status import KeyStatus
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.delivery import CommandDelivery
from kvpool.master.records import (
    Commit,
    CopyCommand,
    ForgetCommand,
    NodeCommand,
    PersistCommand,
    PutOptions,
    StoredObject,
)
from kvpool.master.state import MasterState
from kvpool.storage_node.object_index import DurableIndex, Entry, MemoryIndex, live_entries

OLD = StoredObject("k", 0, 0, 1)


def forget(command_id: int, node: str = "n1") -> ForgetCommand:
    return ForgetCommand(command_id, node, f"{node}/dram0", (OLD,))


def persist(command_id: int) -> PersistCommand:
    return PersistCommand(command_id, "n1", "n1/dram0", (OLD,))


def ids(commands: list[NodeCommand]) -> list[int]:
    return [command.command_id for command in commands]


def wanted(command: NodeCommand) -> bool:
    return True


def test_commands_for_a_node_without_a_stream_wait_and_go_out_when_it_opens_one():
    delivery = CommandDelivery()
    assert not delivery.send(forget(1)), "no stream yet: it waits"
    assert delivery.unsent("n1") == [1]

    assert ids(delivery.connected("n1", "stream 1", "process 1", wanted)) == [1]
    assert delivery.send(forget(2)), "an open stream: written at once"
    assert delivery.unanswered("n1") == [1, 2]


def test_commands_written_to_a_stream_that_broke_go_first_on_the_next_one():
    delivery = CommandDelivery()
    delivery.connected("n1", "stream 1", "process 1", wanted)
    for command_id in (1, 2, 3):
        assert delivery.send(forget(command_id))
    assert delivery.answered("n1", 2) is not None  # 1 and 3 may have been lost with the stream
    delivery.disconnected("n1", "stream 1")
    assert not delivery.send(forget(4))  # queued while the node was away

    resent = delivery.connected("n1", "stream 2", "process 1", wanted)

    assert ids(resent) == [1, 3, 4]
    assert delivery.unanswered("n1") == [1, 3, 4] and delivery.unsent("n1") == []


def test_commands_the_master_no_longer_wants_are_not_sent_again():
    delivery = CommandDelivery()
    delivery.connected("n1", "stream 1", "process 1", wanted)
    for command in (persist(1), persist(2), forget(3)):  # the master gave up on 1
        delivery.send(command)

    resent = delivery.connected("n1", "stream 2", "process 1", lambda c: c.command_id != 1)

    assert ids(resent) == [2, 3]


def test_a_restarted_node_gets_the_lost_forgets_but_no_persist_or_copy():
    delivery = CommandDelivery()
    delivery.connected("n1", "stream 1", "process 1", wanted)
    copy = CopyCommand(3, "n1", "n1/dram0", OLD, "n1/nvme0", OLD)
    for command in (persist(1), forget(2), copy):
        delivery.send(command)

    resent = delivery.connected("n1", "stream 2", "process 2", wanted)  # the process restarted

    assert ids(resent) == [2]


def test_a_node_declared_dead_takes_its_unanswered_commands_with_it():
    delivery = CommandDelivery()
    delivery.connected("n1", "stream 1", "process 1", wanted)
    delivery.send(forget(1))

    delivery.discard("n1")

    assert ids(delivery.connected("n1", "stream 2", "process 1", wanted)) == []


def test_an_answer_counts_only_from_the_node_the_command_went_to_and_only_once():
    delivery = CommandDelivery()
    delivery.connected("n1", "stream 1", "p", wanted)
    delivery.connected("n2", "stream 2", "p", wanted)
    delivery.send(forget(1, node="n1"))

    assert delivery.answered("n2", 1) is None, "n2 was never sent command 1"
    assert delivery.answered("n1", 1) == forget(1)
    assert delivery.answered("n1", 1) is None, "a second answer is nothing"


def test_an_older_stream_closing_does_not_detach_the_newer_one():
    delivery = CommandDelivery()
    delivery.connected("n1", "stream 1", "p", wanted)
    delivery.connected("n1", "stream 2", "p", wanted)

    delivery.disconnected("n1", "stream 1")

    assert delivery.stream_of("n1") == "stream 2"
    assert delivery.send(forget(1))


def test_a_forget_removes_only_the_put_it_names():
    index = MemoryIndex()
    index.put([Entry("k", 0, 100, generation=1)])
    index.put([Entry("k", 0, 100, generation=2)])  # put again, same place

    index.delete([Entry("k", 0, 100, generation=1)])  # a late Forget of the first put
    assert [e.generation for e in index.entries()] == [2]
    index.delete([Entry("k", 0, 100, generation=2)])
    index.delete([Entry("k", 0, 100, generation=2)])  # twice: harmless
    assert index.entries() == []


def test_a_late_persist_of_an_older_generation_leaves_the_newer_one_recorded():
    index = MemoryIndex()
    newer, older = Entry("k", 576, 150, generation=20), Entry("k", 704, 700, generation=5)
    assert index.put([newer]) == [newer]

    # (sent before the node's remount, carried out after it)
    assert index.put([older, Entry("other", 0, 10, generation=6)]) == [
        Entry("other", 0, 10, generation=6)
    ]
    assert sorted((e.key, e.generation) for e in index.entries()) == [("k", 20), ("other", 6)]
    assert index.put([newer]) == [newer], "the same put again is recorded again"


def test_a_durable_index_writes_no_record_of_an_older_generation(tmp_path: Path):
    path = tmp_path / "index.log"
    index = DurableIndex(path, {"segment": "n1/nvme0"})
    index.put([Entry("k", 576, 150, 20, 7)])
    before = path.read_bytes()
    assert index.put([Entry("k", 704, 700, 5, 8)]) == []
    assert path.read_bytes() == before, "no record appended"
    index.close()

    assert [(e.generation, e.offset) for e in live_entries(path).values()] == [(20, 576)]
    reopened = DurableIndex(path, {})
    assert [(e.generation, e.crc32c) for e in reopened.entries()] == [(20, 7)]
    reopened.close()


def test_a_durable_index_replays_forgets_the_same_way(tmp_path: Path):
    path = tmp_path / "index.log"
    index = DurableIndex(path, {"segment": "n1/nvme0"})
    index.put([Entry("k", 0, 100, 1, 7)])
    index.put([Entry("k", 0, 100, 2, 8)])
    index.delete([Entry("k", 0, 100, 1)])
    index.close()

    assert [e.generation for e in live_entries(path).values()] == [2]
    reopened = DurableIndex(path, {})
    assert [(e.generation, e.crc32c) for e in reopened.entries()] == [(2, 8)]
    reopened.close()


def test_a_persist_the_core_gave_up_on_is_let_go_wherever_it_waits():
    """It would never be sent again; kept, it would grow the table by every put placed on a
    node that reads its commands and answers none."""
    delivery = CommandDelivery()
    delivery.connected("n1", "stream 1", "process 1", wanted)
    assert delivery.send(persist(1)) and delivery.send(forget(2))
    delivery.disconnected("n1", "stream 1")
    assert not delivery.send(persist(3))

    delivery.expired(persist(1))
    delivery.expired(persist(3))
    assert delivery.unanswered("n1") == [2] and delivery.unsent("n1") == []
    assert delivery.answered("n1", 1) is None, "a late answer counts for nothing"


def test_a_node_that_answers_nothing_leaves_the_master_holding_no_persists():
    """A node that reads its commands and answers none, while its heartbeats keep it alive:
    every put placed on it times out, and what the master keeps for the node stays bounded."""
    clock = FakeClock()
    core = MasterCore(
        MasterState(MasterConfig(), clock=clock), forget_wait=1.0, command_timeout=5.0
    )
    core.mount_segment(0, segment_info("n1", 1 << 30), [], False, 0.0)
    core.node_connected("n1", "stream", "process")
    for i in range(200):
        [slot] = core.put_start(2 * i, "c", [f"k{i}"], [4096], PutOptions()).answers.get(
            2 * i, [None]
        )
        if slot is not None and slot.status is KeyStatus.OK:
            core.put_end(2 * i + 1, [Commit(f"k{i}", slot.put_id, (True,))])
        clock.advance(0.5)
        core.timers()
    clock.advance(5.0)
    core.timers()

    left = [core.delivery._nodes["n1"].unanswered[c] for c in core.delivery.unanswered("n1")]
    print(len(left), [type(c).__name__ for c in left][:20])
    assert not [c for c in left if isinstance(c, PersistCommand)]
    core.state.validate()
