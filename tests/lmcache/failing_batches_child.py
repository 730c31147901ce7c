"""A process of its own for test_lmcache_failures.py: an adapter whose stores and loads fail
as a whole (the master, given as argv[1], is stopped), each round followed by a full garbage
collection, the way an LMCache server's collector runs at some point after them. A crash
here (a segfault in the collector) ends this process only, and the test reads its exit code.

Prints ``survived`` and exits 0 when every round failed as expected and the process lived.
"""

from __future__ import annotations

import gc
import sys

from lmcache_support import Arena, bits, load, object_keys, store

from kvpool.lmcache import KVPoolL2Adapter

MIB = 1024 * 1024
ROUNDS = 5


def main(master: str) -> None:
    arena = Arena(16 * MIB)
    adapter = KVPoolL2Adapter(
        {
            "master": master,
            "store_timeout_s": 0.3,
            "load_timeout_s": 0.3,
            "health_timeout_s": 0.3,
        },
        l1_memory_desc=arena.desc,
    )
    for round_ in range(ROUNDS):
        arena.reset()
        stored = store(adapter, object_keys(4), arena.objs(4, MIB))
        assert not stored.is_successful(), "a store reached a stopped master"
        loaded = bits(load(adapter, object_keys(4), arena.objs(4, MIB, random=False)), 4)
        assert loaded == [False] * 4, loaded
        print(f"round {round_}: collected {gc.collect()}", flush=True)
    adapter.close()
    gc.collect()
    print("survived", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
