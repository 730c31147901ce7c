"""The objects a segment's disk failed to read, kept for the next heartbeat
(storage_node/unreadable.py)."""

from __future__ import annotations

from kvpool.storage_node.index_log import Entry
from kvpool.storage_node.unreadable import LIMIT, UnreadablePlaces

A = Entry("a", 0, 1 << 20, 1)
B = Entry("b", 1 << 20, 4096, 2)
C = Entry("c", 2 << 20, 1 << 20, 3)


def test_a_failed_read_names_its_object_once():
    places = UnreadablePlaces()
    places.note(A.offset, A.generation)
    places.note(C.offset, C.generation)
    places.note(C.offset, C.generation)
    assert places.take(lambda: [A, B, C]) == [A, C]
    assert places.take(lambda: [A, B, C]) == [], "let go once taken"


def test_an_object_written_since_at_the_same_place_is_not_named():
    """The read failed on ``a``; before the heartbeat ``a`` was removed and ``a2`` written
    at its place: ``a2`` is not the object that failed."""
    places = UnreadablePlaces()
    places.note(A.offset, A.generation)
    written_since = Entry("a2", A.offset, A.size, 9)
    assert places.take(lambda: [written_since, B]) == []


def test_the_index_is_read_only_when_a_read_failed():
    def index() -> list[Entry]:
        raise AssertionError("read without a failure")

    places = UnreadablePlaces()
    assert not places.any()
    assert places.take(index) == []


def test_objects_not_sent_are_noted_again_and_a_failing_disk_notes_a_bounded_number():
    places = UnreadablePlaces()
    places.note(B.offset, B.generation)
    taken = places.take(lambda: [A, B])
    places.give_back(taken)
    assert places.take(lambda: [A, B]) == [B]
    entries = [Entry(str(i), i * 4096, 4096, i + 1) for i in range(10 * LIMIT)]
    for entry in entries:
        places.note(entry.offset, entry.generation)
    assert len(places.take(lambda: entries)) == LIMIT
