"""Node commands reach their node even when its stream breaks, and repeating one is harmless.

The master remembers every command written to a node's stream until the node answers it; a new
stream of that node gets the unanswered ones first (but not a Persist or Copy the master gave
up on, as the service's ``still_wanted`` says, nor one written to an earlier process of the
node: its bytes died with it). A node's index forgets exactly the object a
Forget names (its key, offset and generation), so a Forget that arrives twice, or late, never
removes a newer put of the same key.
"""

from __future__ import annotations

from pathlib import Path

from kvpool.master.node_channels import NodeChannels
from kvpool.proto import master_pb2 as pb
from kvpool.storage_node.object_index import DurableIndex, Entry, MemoryIndex, live_entries


def forget(command_id: int, key: str = "k") -> pb.NodeCommand:
    return pb.NodeCommand(
        command_id=command_id,
        forget=pb.Forget(
            segment_id="n1/dram0", objects=[pb.StoredObject(key=key, offset=0, generation=1)]
        ),
    )


def persist(command_id: int) -> pb.NodeCommand:
    return pb.NodeCommand(command_id=command_id, persist=pb.Persist(segment_id="n1/dram0"))


def drain(channels: NodeChannels, node: str) -> list[int]:
    queue = channels.queue(node)
    ids = []
    while not queue.empty():
        ids.append(queue.get_nowait().command_id)
    return ids


def test_commands_written_to_a_stream_that_broke_go_first_on_the_next_one():
    channels = NodeChannels()
    channels.attach("n1", "stream 1", incarnation="process 1")
    for command_id in (1, 2, 3):
        channels.send("n1", forget(command_id))
    for command_id in drain(channels, "n1"):
        channels.written("n1", forget(command_id))
    channels.answered("n1", 2)  # 1 and 3 may have been lost with the stream
    channels.send("n1", forget(4))  # queued while the node was away

    channels.attach("n1", "stream 2", incarnation="process 1")

    assert drain(channels, "n1") == [1, 3, 4]
    assert channels.unanswered("n1") == []


def test_commands_the_master_no_longer_wants_are_not_sent_again():
    channels = NodeChannels()
    channels.attach("n1", "stream 1", incarnation="process 1")
    channels.written("n1", persist(1))  # the master gave up waiting for this one
    channels.written("n1", persist(2))
    channels.written("n1", forget(3))

    channels.attach("n1", "stream 2", lambda c: c.command_id != 1, "process 1")

    assert drain(channels, "n1") == [2, 3]


def test_a_restarted_node_gets_the_lost_forgets_but_no_persist_or_copy():
    channels = NodeChannels()
    channels.attach("n1", "stream 1", incarnation="process 1")
    channels.written("n1", persist(1))
    channels.written("n1", forget(2))
    copy = pb.NodeCommand(command_id=3, copy=pb.Copy(source_segment_id="n1/dram0"))
    channels.written("n1", copy)

    channels.attach("n1", "stream 2", incarnation="process 2")  # the node process restarted

    assert drain(channels, "n1") == [2]


def test_a_node_declared_dead_takes_its_unanswered_commands_with_it():
    channels = NodeChannels()
    channels.attach("n1", "stream 1")
    channels.written("n1", forget(1))

    channels.discard("n1")
    channels.attach("n1", "stream 2")

    assert drain(channels, "n1") == []


def test_a_forget_removes_only_the_put_it_names():
    index = MemoryIndex()
    index.put([Entry("k", 0, 100, generation=1)])
    index.put([Entry("k", 0, 100, generation=2)])  # put again, same place

    index.delete([Entry("k", 0, 100, generation=1)])  # a late Forget of the first put
    assert [e.generation for e in index.entries()] == [2]
    index.delete([Entry("k", 0, 100, generation=2)])
    index.delete([Entry("k", 0, 100, generation=2)])  # twice: harmless
    assert index.entries() == []


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


def test_a_stream_that_can_write_at_once_gets_commands_at_once_but_never_ahead_of_queued_ones():
    channels = NodeChannels()
    written: list[int] = []
    channels.attach("n1", "stream 1", incarnation="process 1")
    channels.written("n1", forget(1))  # lost with the stream

    channels.attach(
        "n1", "stream 2", incarnation="process 1", send_now=lambda c: written.append(c.command_id)
    )
    channels.send("n1", forget(2))  # 1 still waits in the queue: 2 goes behind it
    assert written == [] and drain(channels, "n1") == [1, 2]

    channels.send("n1", forget(3))  # nothing queued: written at once, and remembered
    assert written == [3] and drain(channels, "n1") == []
    assert channels.unanswered("n1") == [3]

    channels.detach("n1", "stream 2")
    channels.send("n1", forget(4))  # no stream: it waits for the next one
    assert written == [3] and drain(channels, "n1") == [4]
