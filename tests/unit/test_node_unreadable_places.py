"""Where a segment's disk failed reads, kept for the next heartbeat
(storage_node/unreadable.py)."""

from __future__ import annotations

from kvpool.storage_node.index_log import Entry
from kvpool.storage_node.unreadable import LIMIT, UnreadablePlaces

A = Entry("a", 0, 1 << 20, 1)
B = Entry("b", 1 << 20, 4096, 2)
C = Entry("c", 2 << 20, 1 << 20, 3)


def test_a_failed_read_anywhere_in_an_object_names_that_object_once():
    places = UnreadablePlaces()
    places.note(A.offset + 12_288)
    places.note(C.offset)
    places.note(C.offset + 4096)
    assert places.take(lambda: [A, B, C]) == [A, C]
    assert places.take(lambda: [A, B, C]) == [], "let go once taken"


def test_the_index_is_read_only_when_a_read_failed():
    def index() -> list[Entry]:
        raise AssertionError("read without a failure")

    assert UnreadablePlaces().take(index) == []


def test_places_not_sent_are_noted_again_and_a_failing_disk_notes_a_bounded_number():
    places = UnreadablePlaces()
    places.note(B.offset)
    taken = places.take(lambda: [A, B])
    places.give_back(taken)
    assert places.take(lambda: [A, B]) == [B]
    for offset in range(10 * LIMIT):
        places.note(offset)
    assert len(places.take(lambda: [Entry(str(i), i, 1, 1) for i in range(10 * LIMIT)])) == LIMIT
