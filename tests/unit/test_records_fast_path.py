"""The records the master's per-key paths make with ``records.make`` (one C call, no field
checks) are whole: every field there, each the named tuple's own, equal to the record the
class would have made. A field added to one of these named tuples without adding it at the
fast path fails here, not as an IndexError in production."""

from __future__ import annotations

from state_helpers import MiB, answer_nodes, get, mount, new_state, publish, put

from kvpool.common.status import KeyStatus
from kvpool.master.records import (
    Commit,
    CommitResult,
    Location,
    PlacedReplica,
    PutSlot,
    Replica,
    StoredObject,
    make,
)


def _whole(record: tuple, kind: type) -> None:
    assert type(record) is kind
    fields: tuple[str, ...] = kind._fields  # type: ignore[attr-defined]
    assert len(record) == len(fields), f"{kind.__name__} made with {len(record)} fields"
    assert record == kind(*record)


def test_make_is_the_class_call_without_its_checks() -> None:
    made = make(Commit, ("t/k", 7, (True,), None))
    assert made == Commit("t/k", 7, (True,)) and type(made) is Commit
    assert made.crc32c is None


def test_a_put_slot_and_its_replicas_are_whole() -> None:
    state, _ = new_state()
    mount(state, "n1", 4 * MiB)
    slot = put(state, "t/a")
    assert slot.status is KeyStatus.OK
    _whole(slot, PutSlot)
    assert slot.message == ""
    for placed in slot.replicas:
        _whole(placed, PlacedReplica)
    record = state.objects["t/a"]
    for replica in record.replicas:
        assert replica is not None
        _whole(replica, Replica)


def test_a_persist_names_whole_objects_and_a_commit_resolves_whole() -> None:
    state, _ = new_state()
    mount(state, "n1", 4 * MiB)
    slot = put(state, "t/b", replicas=1)
    statuses = state.put_end([Commit("t/b", slot.put_id, (True,), 1234)])
    assert statuses == [None]  # waits for its node
    [persist] = [c for c in state.outbox if hasattr(c, "objects")]
    [item] = persist.objects
    _whole(item, StoredObject)
    assert (item.key, item.generation, item.crc32c, item.replicas) == ("t/b", slot.put_id, 1234, 1)
    answer_nodes(state)
    [result] = state.resolved
    _whole(result, CommitResult)
    assert result == CommitResult("t/b", slot.put_id, KeyStatus.OK)


def test_a_location_is_whole() -> None:
    state, _ = new_state()
    mount(state, "n1", 4 * MiB)
    slot = publish(state, "t/c", crc32c=99)
    location = get(state, "t/c", lease_ttl=1.0)
    _whole(location, Location)
    assert (location.size, location.crc32c, location.generation) == (4096, 99, slot.put_id)


def test_a_node_s_entries_made_from_a_command_are_whole() -> None:
    """storage_node/commands.py makes an ``Entry`` per object of a Persist or Forget the
    same way (``tuple.__new__``), with and without a checksum."""
    from kvpool.proto import master_pb2 as pb
    from kvpool.storage_node.commands import _entries
    from kvpool.storage_node.object_index import Entry

    command = pb.Persist(segment_id="n1/dram-0")
    command.objects.add(key="t/a", offset=4096, size=100, generation=7, crc32c=9, replicas=2)
    command.objects.add(key="t/b", offset=8192, size=5, generation=8)
    with_crc, without = _entries(command.objects)
    _whole(with_crc, Entry)
    _whole(without, Entry)
    assert with_crc == Entry("t/a", 4096, 100, 7, 9, 2)
    assert without == Entry("t/b", 8192, 5, 8, None, 0)
