"""The published keys in order, for listing and removing by prefix.

Every published object enters this index, but few calls read it in order (ListKeys,
RemovePrefix): a sorted list that took each key at once cost a put about as much as the rest
of publishing it. Keys added since the last ordered read wait in a set and join the sorted
list in one go when one is next needed; the set also answers removals of keys that never got
that far.
"""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedList


class KeyIndex:
    __slots__ = ("_pending", "_sorted")

    def __init__(self) -> None:
        self._sorted: SortedList = SortedList()
        self._pending: set[str] = set()

    def add(self, key: str) -> None:
        self._pending.add(key)

    def remove(self, key: str) -> None:
        """Removes ``key``, which must be present."""
        if key in self._pending:
            self._pending.remove(key)
        else:
            self._sorted.remove(key)  # ValueError when absent

    def irange(self, minimum: str, inclusive: tuple[bool, bool] = (True, True)) -> Iterator[str]:
        """Keys from ``minimum`` on, in order (do not change the index while iterating)."""
        if self._pending:
            self._sorted.update(self._pending)
            self._pending.clear()
        keys: Iterator[str] = self._sorted.irange(minimum=minimum, inclusive=inclusive)
        return keys

    def count_prefix(self, prefix: str) -> int:
        """How many keys start with ``prefix`` (two bisections: no walk over them)."""
        if not prefix:
            return len(self)
        if self._pending:
            self._sorted.update(self._pending)
            self._pending.clear()
        after = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first string past the prefix
        count: int = self._sorted.bisect_left(after) - self._sorted.bisect_left(prefix)
        return count

    def __len__(self) -> int:
        return len(self._sorted) + len(self._pending)

    def __contains__(self, key: str) -> bool:
        return key in self._pending or key in self._sorted
