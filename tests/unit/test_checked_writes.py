"""What the checked stream wrote under a grant proves an object whole only when every byte
of it was written under that grant (storage_node/checked_writes.py); the table is bounded."""

from __future__ import annotations

from kvpool.storage_node import checked_writes
from kvpool.storage_node.checked_writes import WrittenRanges

SEGMENT = b"d" * 16


def test_an_object_written_whole_in_pieces_in_any_order_is_proven():
    written = WrittenRanges()
    for start in (4096, 0, 8192, 2048):  # (two connections, out of order, overlapping)
        written.wrote(SEGMENT, 0, 7, start, min(start + 4096, 10_000))
    assert written.proven(SEGMENT, 0, 7, 10_000)
    assert len(written) == 0, "asked once: no longer followed"


def test_a_gap_a_short_write_or_another_grant_s_bytes_prove_nothing():
    written = WrittenRanges()
    written.wrote(SEGMENT, 0, 7, 0, 4096)
    written.wrote(SEGMENT, 0, 7, 8192, 12_288)
    assert not written.proven(SEGMENT, 0, 7, 12_288), "a gap"
    written.wrote(SEGMENT, 0, 7, 0, 4096)
    assert not written.proven(SEGMENT, 0, 7, 8192), "short"
    written.wrote(SEGMENT, 0, 6, 0, 8192)  # an older grant at the same place
    assert not written.proven(SEGMENT, 0, 7, 8192), "not this grant's bytes"
    assert not written.proven(SEGMENT, 0, 7, 1), "nothing written at all"
    assert written.proven(SEGMENT, 0, 7, 0), "an empty object needs no bytes"


def test_the_same_small_piece_written_again_and_again_does_not_add_up_to_the_object():
    written = WrittenRanges()
    for _ in range(16):
        written.wrote(SEGMENT, 0, 7, 0, 4096)
    assert not written.proven(SEGMENT, 0, 7, 65_536)


def test_a_forget_drops_its_grant_and_older_ones_at_its_place_only():
    written = WrittenRanges()
    for generation in (5, 6, 7):
        written.wrote(SEGMENT, 0, generation, 0, 10)
    written.wrote(SEGMENT, 4096, 5, 4096, 4106)
    written.forget(SEGMENT, 0, 6)
    assert len(written) == 2
    assert written.proven(SEGMENT, 0, 7, 10)
    assert written.proven(SEGMENT, 4096, 5, 10)


def test_grants_nobody_names_again_go_by_age_and_by_count(monkeypatch):
    now = [0.0]
    written = WrittenRanges(clock=lambda: now[0])
    written.wrote(SEGMENT, 0, 1, 0, 10)
    now[0] += checked_writes.MAX_AGE + 1
    written.wrote(SEGMENT, 64, 1, 64, 74)
    assert len(written) == 1, "the old one went"
    monkeypatch.setattr(checked_writes, "MAX_GRANTS", 8)
    for offset in range(128, 128 + 20 * 64, 64):
        written.wrote(SEGMENT, offset, 1, offset, offset + 10)
    assert len(written) <= 8
    assert written.proven(SEGMENT, 128 + 19 * 64, 1, 10), "the newest are kept"


def test_a_grant_written_in_more_disjoint_pieces_than_are_kept_proves_nothing(monkeypatch):
    monkeypatch.setattr(checked_writes, "MAX_RANGES", 8)
    written = WrittenRanges()
    for start in range(0, 64 * 20, 64):  # 20 disjoint pieces, 32 bytes of every 64
        written.wrote(SEGMENT, 0, 7, start, start + 32)
    assert not written.proven(SEGMENT, 0, 7, 32)
    for start in range(20 * 64, -1, -64):  # 21 pieces backwards, touching: merged, kept
        written.wrote(SEGMENT, 0, 8, start, start + 64)
    assert written.proven(SEGMENT, 0, 8, 21 * 64)


def test_pieces_out_of_order_merge_and_prove_the_object():
    written = WrittenRanges()
    for start in reversed(range(0, 8192, 1024)):
        written.wrote(SEGMENT, 0, 9, start, start + 1024)
    assert written.proven(SEGMENT, 0, 9, 8192)
