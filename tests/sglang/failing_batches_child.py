"""A process of its own for test_sglang_failures.py: a backend whose stores and loads fail as
a whole (the master, given as argv[1], is stopped), through both of SGLang's interfaces, each
round followed by a full garbage collection, the way an engine's collector runs at some point
after them. A crash here (a segfault in the collector) ends this process only, and the test
reads its exit code.

Prints ``survived`` and exits 0 when every round failed as expected and the process lived.

After a call fails because the master did not answer, the backend skips the calls of the
next timeout (they fail without asking kvpool): each call here waits that out first, so
that every one of them asks, and fails as a whole.
"""

from __future__ import annotations

import gc
import sys
import time

import torch
from sglang_support import attach, hashes, storage_config

from bench.sglang_host_pool import MHAHostPool, page_indices

ROUNDS = 5
TOKENS_PER_PAGE = 16
TIMEOUT = 0.3


def main(master: str) -> None:
    pool = MHAHostPool(16, TOKENS_PER_PAGE, 4, 4, 64)
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape).to(pool.dtype))
    params = {"store_timeout_s": TIMEOUT, "load_timeout_s": TIMEOUT}
    backend = attach(storage_config(master, params=params), pool)
    pages = page_indices([0, 1, 2, 3], TOKENS_PER_PAGE)
    page_elements = pool.page_bytes() // pool.dtype.itemsize
    for round_ in range(ROUNDS):
        # the zero-copy page interface (host pool views), then the one-buffer-per-key one
        time.sleep(TIMEOUT)
        assert backend.batch_set_v1(hashes(4), pages) == [False] * 4
        time.sleep(TIMEOUT)
        assert backend.batch_get_v1(hashes(4), pages) == [False] * 4
        targets = [torch.zeros(page_elements, dtype=pool.dtype) for _ in range(2)]
        time.sleep(TIMEOUT)
        assert backend.batch_set(hashes(2), targets) is False
        time.sleep(TIMEOUT)
        assert backend.batch_get(hashes(2), targets) == [None, None]
        print(f"round {round_}: collected {gc.collect()}", flush=True)
    backend.close()
    gc.collect()
    print("survived", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
