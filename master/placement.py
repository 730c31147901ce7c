"""Where a new object's replicas go: the choice of nodes and segments, apart from allocating.

The rule: one replica per node, on distinct nodes, none on a node the writer asked to avoid
(one it could not reach); nodes on a preferred host first; then random nodes (which spreads
objects and load evenly) or the nodes with the most free space; within a node, its segment
with the largest free extent.

A PutStart places every object of its batch, and a scan of every node for every object made
placement the master's largest cost on a cluster of many nodes, growing with the cluster
(docs/benchmarks.md, bench/placement_scale.py). So a ``TierPool`` lists,
once per call, the nodes that offer a tier (and groups them by host); random placement then
draws nodes until enough have room, at an expected cost of the number of replicas, not of
nodes. Most-free placement ranks the nodes once per call in a heap and takes the top of
it per object (preferred hosts, usually few, are looked at in full).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence, Set

from kvpool.master.records import NodeRecord, SegmentRecord

#: Random draws a single-replica object gets before the nodes are shuffled (when most nodes are
#: full, a draw rarely finds room).
QUICK_DRAWS = 3
#: A node and its segments of one tier that take writes now.
PoolEntry = tuple[NodeRecord, list[SegmentRecord]]


class TierPool:
    """The nodes offering one tier, as found at the start of a call. Free space may shrink
    meanwhile (the call's own allocations); where it may grow (an eviction), the caller
    finds a new pool."""

    __slots__ = ("_by_host", "_ranked", "entries")

    def __init__(self, entries: list[PoolEntry]) -> None:
        self.entries = entries
        self._by_host: dict[str, list[PoolEntry]] = {}
        for entry in entries:
            self._by_host.setdefault(entry[0].host, []).append(entry)
        #: Most-free placement's ranking, made on first use: a heap of (-largest free extent
        #: when pushed, position in ``entries``). A node's free space only shrinks during a
        #: call, so an item whose node has less than it says is pushed again when popped.
        self._ranked: list[tuple[int, int]] | None = None

    def choose(
        self,
        size: int,
        wanted: int,
        preferred_hosts: Sequence[str],
        rng: random.Random,
        most_free: bool,
        avoid: Set[str] = frozenset(),
    ) -> list[SegmentRecord]:
        """Segments on up to ``wanted`` distinct nodes with room for ``size`` bytes, none in
        ``avoid`` (node ids), in the order their replicas take (fewer when fewer nodes have
        room)."""
        # Free extents are aligned, so one of at least ``size`` bytes (one, for an empty
        # object) holds the object's rounded size too.
        least = size if size > 0 else 1
        if wanted == 1 and not preferred_hosts and not most_free and not avoid:
            # The common case: a few draws, each uniform over all nodes, find a node with
            # room, and the one they find is uniform over those with room.
            entries = self.entries
            for _ in range(QUICK_DRAWS):
                if not entries:
                    return []
                draw = entries[rng.randrange(len(entries))] if len(entries) > 1 else entries[0]
                best = _roomiest(draw[1], least)
                if best is not None:
                    return [best]
        chosen: list[SegmentRecord] = []
        taken: set[str] = set(avoid)  # (an avoided node counts as taken: it gets no replica)
        if preferred_hosts:
            front: list[PoolEntry] = []
            for host in dict.fromkeys(preferred_hosts):  # each host once, in the caller's order
                front.extend(self._by_host.get(host, ()))
            _take(front, least, wanted, rng, most_free, chosen, taken)
        if len(chosen) < wanted:
            if most_free:
                self._take_most_free(least, wanted, chosen, taken)
            else:
                _take(self.entries, least, wanted, rng, False, chosen, taken)
        return chosen

    def _take_most_free(
        self, least: int, wanted: int, chosen: list[SegmentRecord], taken: set[str]
    ) -> None:
        """Adds the nodes with the largest free extents (ties: in pool order), not yet
        ``taken``, until ``chosen`` holds ``wanted``: a few heap operations per object, where
        ranking every node cost a scan of the cluster."""
        ranked = self._ranked
        if ranked is None:
            ranked = self._ranked = []
            for position, (_, segments) in enumerate(self.entries):
                best = _roomiest(segments, 1)
                if best is not None:
                    ranked.append((-best.allocator.largest_free, position))
            heapq.heapify(ranked)
        put_back = []
        while ranked and len(chosen) < wanted:
            negative_free, position = heapq.heappop(ranked)
            node, segments = self.entries[position]
            best = _roomiest(segments, 1)
            free = best.allocator.largest_free if best is not None else 0
            if free != -negative_free:  # it shrank since: rank it again by what it has now
                if free:
                    heapq.heappush(ranked, (-free, position))
                continue
            put_back.append((negative_free, position))
            if free < least:
                break  # the freest node left cannot hold it: none can
            if node.node_id not in taken:
                assert best is not None
                chosen.append(best)
                taken.add(node.node_id)
        for item in put_back:  # (as they were: their allocations will show when next popped)
            heapq.heappush(ranked, item)


def _take(
    entries: list[PoolEntry],
    least: int,
    wanted: int,
    rng: random.Random,
    most_free: bool,
    chosen: list[SegmentRecord],
    taken: set[str],
) -> None:
    """Adds segments of ``entries``' nodes (not yet ``taken``) to ``chosen`` until it holds
    ``wanted`` or no node is left."""
    if most_free:
        ranked = []
        for node, segments in entries:
            if node.node_id not in taken:
                best = _roomiest(segments, least)
                if best is not None:
                    ranked.append((best.allocator.largest_free, best))
        ranked.sort(key=lambda ranked_segment: ranked_segment[0], reverse=True)
        for _, segment in ranked[: wanted - len(chosen)]:
            chosen.append(segment)
            taken.add(segment.node_id)
        return
    # Random: a Fisher-Yates shuffle of a copy, stopped as soon as enough nodes have room.
    order = list(entries)
    count = len(order)
    for i in range(count):
        if len(chosen) >= wanted:
            return
        if count - i > 1:
            j = rng.randrange(i, count)
            order[i], order[j] = order[j], order[i]
        node, segments = order[i]
        if node.node_id not in taken:
            best = _roomiest(segments, least)
            if best is not None:
                chosen.append(best)
                taken.add(node.node_id)


def _roomiest(segments: list[SegmentRecord], least: int) -> SegmentRecord | None:
    """The segment with the largest free extent, if that holds ``least`` bytes."""
    best, best_free = None, 0
    for segment in segments:
        free = segment.allocator.largest_free
        if free > best_free:
            best, best_free = segment, free
    return best if best_free >= least else None
