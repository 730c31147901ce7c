"""Offset allocator for one segment: best-fit over free extents that coalesce on free.

Free extents live in a size-ordered list (best fit in O(log n)) and in two maps keyed by start
and by end (neighbours found in O(1) when an extent is freed). ``allocate_at`` (adopting what
a remounting node reports, a burst of calls) also needs the extent holding a given offset: an
ordered list of starts, built on its first call after other changes and kept up to date
through the burst, so that ``allocate`` and ``free`` (every put and removal) need not maintain
it. The cost of an allocation grows with the logarithm of the number of free extents, never
with the number of objects. Sizes are rounded up to ``alignment`` so every buffer starts
aligned.
"""

from __future__ import annotations

from sortedcontainers import SortedList

DEFAULT_ALIGNMENT = 64


class Allocator:
    def __init__(self, capacity: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self.alignment = alignment
        self.capacity = capacity - capacity % alignment
        self._by_size: SortedList = SortedList()  # (size, offset)
        self._by_start: dict[int, int] = {}  # offset -> size
        self._by_end: dict[int, int] = {}  # offset + size -> offset
        #: Offsets of free extents, while allocate_at uses them (None: to be rebuilt).
        self._starts: SortedList | None = None
        self._allocated: dict[int, int] = {}  # offset -> size
        self.used = 0
        if self.capacity:
            self._add_free(0, self.capacity)

    def rounded(self, size: int) -> int:
        """The bytes an allocation of ``size`` occupies (at least one alignment unit)."""
        size = max(size, 1)
        return (size + self.alignment - 1) & ~(self.alignment - 1)

    def allocate(self, size: int) -> int | None:
        """Offset of a new buffer of at least ``size`` bytes, or None when nothing fits."""
        self._starts = None
        need = self.rounded(size)
        by_size = self._by_size
        index = by_size.bisect_left((need, -1))
        if index == len(by_size):
            return None
        extent: tuple[int, int] = by_size.pop(index)  # (found once: no second search)
        free_size, offset = extent
        self._unlist(offset, free_size)
        if free_size > need:
            self._add_free(offset + need, free_size - need)
        self._allocated[offset] = need
        self.used += need
        return offset

    def allocate_at(self, offset: int, size: int) -> bool:
        """Claims the buffer at ``offset`` (as ``allocate`` would have sized it), if free.

        Used to re-adopt objects a storage node reports after a restart; False when the
        range is not entirely free (an overlapping buffer exists) or misaligned.
        """
        need = self.rounded(size)
        if offset % self.alignment or offset < 0 or offset + need > self.capacity:
            return False
        if self._starts is None:
            self._starts = SortedList(self._by_start)
        index = self._starts.bisect_right(offset) - 1
        if index < 0:
            return False
        start = self._starts[index]
        free_size = self._by_start[start]
        if offset + need > start + free_size:
            return False
        self._remove_free(start, free_size)
        if offset > start:
            self._add_free(start, offset - start)
        if start + free_size > offset + need:
            self._add_free(offset + need, start + free_size - offset - need)
        self._allocated[offset] = need
        self.used += need
        return True

    def free(self, offset: int) -> None:
        size = self._allocated.pop(offset)
        self._starts = None
        self.used -= size
        end = offset + size
        after = self._by_start.get(end)
        if after is not None:
            self._remove_free(end, after)
            size += after
        before = self._by_end.get(offset)
        if before is not None:
            before_size = offset - before
            self._remove_free(before, before_size)
            offset, size = before, size + before_size
        self._add_free(offset, size)

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    @property
    def largest_free(self) -> int:
        return self._by_size[-1][0] if self._by_size else 0

    def size_of(self, offset: int) -> int:
        return self._allocated[offset]

    def allocations(self) -> dict[int, int]:
        """A copy of offset -> rounded size of every live buffer (for checks and tests)."""
        return dict(self._allocated)

    def free_extents(self) -> list[tuple[int, int]]:
        """(offset, size) of every free extent, by offset (for checks and tests)."""
        return sorted(self._by_start.items())

    def _add_free(self, offset: int, size: int) -> None:
        self._by_size.add((size, offset))
        self._by_start[offset] = size
        self._by_end[offset + size] = offset
        if self._starts is not None:
            self._starts.add(offset)

    def _remove_free(self, offset: int, size: int) -> None:
        self._by_size.remove((size, offset))
        self._unlist(offset, size)

    def _unlist(self, offset: int, size: int) -> None:
        """Takes a free extent out of the maps by start and end (not the size list)."""
        del self._by_start[offset]
        del self._by_end[offset + size]
        if self._starts is not None:
            self._starts.remove(offset)
