"""Published objects in least-recently-used order, with soft-pinned ones kept apart.

Eviction walks ``candidates()``: every unpinned object from least to most recently used, then
the soft-pinned ones the same way. Hard-pinned objects are not indexed at all, so they cost
eviction nothing and can never be chosen.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from kvpool.common.status import Pin

#: (By plain names: reading a member off its Enum class is slow on Python 3.11, and every
#: published object is added here twice.)
_NONE, _SOFT = Pin.NONE, Pin.SOFT


class LruIndex:
    __slots__ = ("_normal", "_soft")

    def __init__(self) -> None:
        self._normal: OrderedDict[str, None] = OrderedDict()
        self._soft: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str, pin: Pin) -> None:
        """Indexes ``key`` as the most recently used object of its pin class."""
        if pin is _NONE:
            self._normal[key] = None
        elif pin is _SOFT:
            self._soft[key] = None

    def add_oldest(self, key: str, pin: Pin) -> None:
        """Indexes ``key`` as the least recently used object of its pin class: an object
        taken back from a node's report (a new master, a node's restart), which nothing has
        read since. Reports are taken newest first, so each goes in front of the ones before
        it and the order of their ages holds (one report's parts come newest first too);
        every object put or read at this master stays more recent than they are."""
        if pin is _NONE:
            self._normal[key] = None
            self._normal.move_to_end(key, last=False)
        elif pin is _SOFT:
            self._soft[key] = None
            self._soft.move_to_end(key, last=False)

    def touch(self, key: str) -> None:
        try:
            self._normal.move_to_end(key)
        except KeyError:
            if key in self._soft:
                self._soft.move_to_end(key)

    def discard(self, key: str) -> None:
        self._normal.pop(key, None)
        self._soft.pop(key, None)

    def unpin(self, key: str) -> None:
        """A soft pin ended: the object joins the unpinned ones (as most recently used)."""
        if self._soft.pop(key, 0) is None:
            self._normal[key] = None

    def candidates(self) -> Iterator[str]:
        """Keys in eviction order. Do not change the index while iterating."""
        yield from self._normal
        yield from self._soft

    def __len__(self) -> int:
        return len(self._normal) + len(self._soft)

    def __contains__(self, key: str) -> bool:
        return key in self._normal or key in self._soft
