"""Garbage-collector settings for the long-running servers (master, storage node).

CPython's default collector runs a young-generation pass every 700 net allocations; a master
handling a batch of 32 puts allocates thousands of objects (records, protobuf messages,
futures), so several passes ran inside every call, each also walking what survived the last
ones: a measurable share of the call. The servers' state lives long and has few cycles, so
they collect less often, and freeze what start-up allocated (modules, configuration) out of
every pass. Memory held by real cycles is still reclaimed, just in larger, rarer passes.
"""

from __future__ import annotations

import gc

#: Net allocations between young-generation passes (CPython's default: 700).
YOUNG_THRESHOLD = 50_000


def tune_for_server() -> None:
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
