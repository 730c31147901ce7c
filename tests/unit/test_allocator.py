"""Specification of the segment offset allocator (master/allocator.py).

The allocator hands out aligned buffers from one segment by best fit over free extents, and
coalesces a freed buffer with the free extents on both sides of it, so that freeing everything
always gives back one extent covering the whole segment.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.master.allocator import DEFAULT_ALIGNMENT, Allocator

# ------------------------------------------------------------------ helpers


def live_buffers(allocator: Allocator) -> list[tuple[int, int]]:
    """(offset, size) of every live buffer, by offset."""
    return sorted(allocator.allocations().items())


def check_invariants(allocator: Allocator) -> None:
    """What must hold after any sequence of allocations and frees."""
    buffers = live_buffers(allocator)
    extents = allocator.free_extents()

    # Buffers and free extents are aligned, in bounds, and never overlap one another.
    pieces = sorted(buffers + extents)
    position = 0
    for offset, size in pieces:
        assert offset % allocator.alignment == 0, f"{offset} is not aligned"
        assert size > 0 and size % allocator.alignment == 0, f"bad size {size} at {offset}"
        assert offset >= position, f"piece at {offset} overlaps the one ending at {position}"
        position = offset + size
    assert position <= allocator.capacity

    # Together they tile the segment exactly: nothing leaked, nothing counted twice.
    assert allocator.used == sum(size for _, size in buffers)
    assert allocator.used + sum(size for _, size in extents) == allocator.capacity
    assert allocator.free_bytes == allocator.capacity - allocator.used

    # Free space is fully coalesced: no two free extents touch.
    for (offset, size), (next_offset, _) in itertools.pairwise(extents):
        assert offset + size < next_offset, f"free extents at {offset} and {next_offset} touch"

    assert allocator.largest_free == max((size for _, size in extents), default=0)


# ------------------------------------------------------------------ construction


def test_a_new_allocator_is_one_free_extent_covering_the_capacity():
    allocator = Allocator(4096)
    assert allocator.capacity == 4096
    assert allocator.used == 0
    assert allocator.free_bytes == 4096
    assert allocator.largest_free == 4096
    assert allocator.free_extents() == [(0, 4096)]


def test_capacity_is_rounded_down_to_the_alignment():
    allocator = Allocator(1000, alignment=64)
    assert allocator.capacity == 960
    assert allocator.free_extents() == [(0, 960)]


def test_a_segment_smaller_than_the_alignment_has_no_space():
    allocator = Allocator(63, alignment=64)
    assert allocator.capacity == 0
    assert allocator.largest_free == 0
    assert allocator.free_extents() == []
    assert allocator.allocate(1) is None


@pytest.mark.parametrize("alignment", [0, -64, 3, 48, 100])
def test_alignment_must_be_a_positive_power_of_two(alignment):
    with pytest.raises(ValueError, match="power of two"):
        Allocator(4096, alignment=alignment)


def test_default_alignment_is_64_bytes():
    assert DEFAULT_ALIGNMENT == 64
    assert Allocator(4096).alignment == 64


# ------------------------------------------------------------------ allocation


@pytest.mark.parametrize(
    ("size", "occupies"),
    [(0, 64), (1, 64), (63, 64), (64, 64), (65, 128), (128, 128), (1000, 1024)],
)
def test_sizes_are_rounded_up_to_the_alignment(size, occupies):
    allocator = Allocator(4096, alignment=64)
    assert allocator.rounded(size) == occupies
    offset = allocator.allocate(size)
    assert offset == 0
    assert allocator.size_of(offset) == occupies
    assert allocator.used == occupies


def test_every_buffer_starts_aligned():
    allocator = Allocator(1 << 16, alignment=256)
    offsets = [allocator.allocate(size) for size in (1, 300, 7, 513, 256, 1)]
    assert all(offset is not None and offset % 256 == 0 for offset in offsets)
    assert offsets == [0, 256, 768, 1024, 1792, 2048]
    check_invariants(allocator)


def test_consecutive_allocations_are_packed_from_the_start():
    allocator = Allocator(1024)
    assert [allocator.allocate(64) for _ in range(4)] == [0, 64, 128, 192]
    assert allocator.free_extents() == [(256, 768)]


def test_allocation_returns_none_when_nothing_is_large_enough():
    allocator = Allocator(256)
    assert allocator.allocate(257) is None
    assert allocator.used == 0, "a failed allocation must not consume space"
    assert allocator.allocate(256) == 0
    assert allocator.allocate(1) is None


def test_free_space_that_is_fragmented_does_not_satisfy_a_larger_request():
    allocator = Allocator(512)
    offsets = [allocator.allocate(64) for _ in range(8)]
    for offset in offsets[::2]:  # free every other buffer: 256 bytes free, in 64-byte holes
        allocator.free(offset)
    assert allocator.free_bytes == 256
    assert allocator.largest_free == 64
    assert allocator.allocate(128) is None
    check_invariants(allocator)


def test_best_fit_picks_the_smallest_extent_that_fits():
    # Layout: [A 128][hole 256][B 64][hole 128][C 64][tail 384]
    allocator = Allocator(1024)
    a = allocator.allocate(128)
    hole_256 = allocator.allocate(256)
    allocator.allocate(64)
    hole_128 = allocator.allocate(128)
    allocator.allocate(64)
    assert a == 0
    allocator.free(hole_256)
    allocator.free(hole_128)
    assert allocator.free_extents() == [(128, 256), (448, 128), (640, 384)]

    # 100 bytes (128 rounded) fits the 128-byte hole exactly, not the first or the largest one.
    assert allocator.allocate(100) == 448
    # 200 bytes (256 rounded) fits the 256-byte hole better than the 384-byte tail.
    assert allocator.allocate(200) == 128
    # Only the tail is left.
    assert allocator.free_extents() == [(640, 384)]
    check_invariants(allocator)


def test_among_equal_extents_best_fit_picks_the_lowest_offset():
    allocator = Allocator(512)
    offsets = [allocator.allocate(64) for _ in range(8)]
    allocator.free(offsets[5])
    allocator.free(offsets[1])
    allocator.free(offsets[3])
    assert allocator.allocate(64) == offsets[1]


def test_allocating_part_of_an_extent_leaves_the_remainder_free():
    allocator = Allocator(1024)
    big = allocator.allocate(512)
    allocator.allocate(64)
    allocator.free(big)
    assert allocator.free_extents() == [(0, 512), (576, 448)]
    assert allocator.allocate(128) == 576  # the smaller of the two extents that fit
    assert allocator.free_extents() == [(0, 512), (704, 320)]


# ------------------------------------------------------------------ freeing and coalescing


def three_neighbours() -> tuple[Allocator, int, int, int]:
    """A full 192-byte segment holding three adjacent 64-byte buffers."""
    allocator = Allocator(192)
    left, middle, right = (allocator.allocate(64) for _ in range(3))
    assert (left, middle, right) == (0, 64, 128)
    assert allocator.free_extents() == []
    return allocator, left, middle, right


def test_freeing_next_to_a_free_extent_on_the_left_coalesces():
    allocator, left, middle, _ = three_neighbours()
    allocator.free(left)
    allocator.free(middle)
    assert allocator.free_extents() == [(0, 128)]


def test_freeing_next_to_a_free_extent_on_the_right_coalesces():
    allocator, _, middle, right = three_neighbours()
    allocator.free(right)
    allocator.free(middle)
    assert allocator.free_extents() == [(64, 128)]


def test_freeing_between_two_free_extents_coalesces_all_three():
    allocator, left, middle, right = three_neighbours()
    allocator.free(left)
    allocator.free(right)
    assert allocator.free_extents() == [(0, 64), (128, 64)]
    allocator.free(middle)
    assert allocator.free_extents() == [(0, 192)]
    assert allocator.largest_free == 192


def test_freeing_between_two_live_buffers_makes_a_separate_hole():
    allocator, _, middle, _ = three_neighbours()
    allocator.free(middle)
    assert allocator.free_extents() == [(64, 64)]
    assert allocator.used == 128


def test_freed_space_is_reused():
    allocator, _, middle, _ = three_neighbours()
    allocator.free(middle)
    assert allocator.allocate(10) == middle


def test_freeing_an_offset_that_is_not_allocated_raises_and_changes_nothing():
    allocator = Allocator(1024)
    offset = allocator.allocate(64)
    with pytest.raises(KeyError):
        allocator.free(offset + 64)
    allocator.free(offset)
    with pytest.raises(KeyError):
        allocator.free(offset)  # a double free is refused
    assert allocator.free_extents() == [(0, 1024)]
    assert allocator.used == 0


def test_fill_until_full_then_free_all_gives_back_one_extent_of_full_capacity():
    allocator = Allocator(64 * 1000 + 10)
    sizes = [1, 64, 65, 200, 7, 129]
    offsets = []
    index = 0
    while (offset := allocator.allocate(sizes[index % len(sizes)])) is not None:
        offsets.append(offset)
        index += 1
    assert allocator.largest_free < allocator.rounded(sizes[index % len(sizes)])
    check_invariants(allocator)

    random.Random(7).shuffle(offsets)
    for offset in offsets:
        allocator.free(offset)
    assert allocator.used == 0
    assert allocator.free_extents() == [(0, allocator.capacity)]
    assert allocator.largest_free == allocator.capacity == 64 * 1000


# ------------------------------------------------------------------ accounting


def test_used_free_and_largest_free_track_allocations_and_frees():
    allocator = Allocator(1024)
    a = allocator.allocate(100)  # 128
    b = allocator.allocate(64)  # 64
    assert (allocator.used, allocator.free_bytes, allocator.largest_free) == (192, 832, 832)
    allocator.free(a)
    assert (allocator.used, allocator.free_bytes, allocator.largest_free) == (64, 960, 832)
    allocator.free(b)
    assert (allocator.used, allocator.free_bytes, allocator.largest_free) == (0, 1024, 1024)


def test_allocations_reports_a_copy_of_the_live_buffers():
    allocator = Allocator(1024)
    a = allocator.allocate(1)
    b = allocator.allocate(100)
    snapshot = allocator.allocations()
    assert snapshot == {a: 64, b: 128}
    snapshot.clear()
    assert allocator.allocations() == {a: 64, b: 128}, "callers must not reach the internals"


# ------------------------------------------------------------------ properties

operations = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(min_value=0, max_value=600)),
        st.tuples(st.just("free"), st.integers(min_value=0, max_value=10_000)),
    ),
    max_size=120,
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    capacity=st.integers(min_value=0, max_value=8192),
    alignment=st.sampled_from([1, 8, 64, 256]),
    ops=operations,
)
def test_any_sequence_of_allocations_and_frees_keeps_the_segment_consistent(
    capacity, alignment, ops
):
    allocator = Allocator(capacity, alignment)
    live: dict[int, int] = {}  # offset -> requested size
    for op, value in ops:
        if op == "alloc":
            largest_before = allocator.largest_free
            offset = allocator.allocate(value)
            if offset is None:
                assert allocator.rounded(value) > largest_before, "refused although it fit"
            else:
                assert offset not in live
                assert allocator.size_of(offset) >= value
                live[offset] = value
        elif live:
            offset = sorted(live)[value % len(live)]
            allocator.free(offset)
            del live[offset]
        assert set(allocator.allocations()) == set(live)
        check_invariants(allocator)

    for offset in list(live):
        allocator.free(offset)
    expected = [(0, allocator.capacity)] if allocator.capacity else []
    assert allocator.free_extents() == expected


# ------------------------------------------------------------------ scale


def test_one_hundred_thousand_buffers_fill_then_coalesce_back_to_one_extent():
    """Correctness at scale (kept well under a few seconds): 100k live buffers, freed in random
    order, coalesce back to one extent; while filling, the free space stays one extent no matter
    how many buffers are live, so best fit searches a structure that does not grow with them."""
    count = 100_000
    allocator = Allocator(count * 64)
    offsets = []
    for i in range(count):
        offset = allocator.allocate(1 + i % 64)
        assert offset == i * 64
        offsets.append(offset)
        if i % 10_000 == 0:
            assert len(allocator.free_extents()) == 1
    assert allocator.used == allocator.capacity
    assert allocator.free_extents() == []
    assert allocator.allocate(1) is None

    random.Random(2024).shuffle(offsets)
    half = count // 2
    for offset in offsets[:half]:
        allocator.free(offset)
    assert allocator.used == (count - half) * 64
    extents = allocator.free_extents()
    for (offset, size), (next_offset, _) in itertools.pairwise(extents):
        assert offset + size < next_offset
    for offset in offsets[half:]:
        allocator.free(offset)
    assert allocator.used == 0
    assert allocator.free_extents() == [(0, count * 64)]
    assert allocator.allocate(count * 64) == 0
