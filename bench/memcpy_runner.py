"""The ceiling of ``kvpool bench --compare``: the same workloads as plain numpy copies.

A put copies the object from the runner's source slot into a "store" (a prefaulted pool in
the same process, filled round robin); a get copies it back into the destination slot. No
second process, no network, no metadata: what a store could reach if moving bytes cost only
a memory copy. Exists batches have no meaning here and are not measured.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
POOL = 384 * 1024 * 1024


def client_argv() -> list[str]:
    return [sys.executable, str(HERE / "memcpy_runner.py")]


class MemcpyStore:
    def __init__(self) -> None:
        self.pool = np.ones(POOL, dtype=np.uint8)  # ones: every page faulted in now
        self.places: dict[str, tuple[int, int]] = {}
        self.next = 0

    def register(self, arena: Any) -> None:
        pass

    def put(self, keys: list[str], views: list[Any], addresses: list[int]) -> None:
        for key, view in zip(keys, views, strict=True):
            size = view.nbytes
            if self.next + size > POOL:
                self.next = 0
            np.copyto(self.pool[self.next : self.next + size], view)
            self.places[key] = (self.next, size)
            self.next += size

    def get(self, keys: list[str], views: list[Any], addresses: list[int]) -> None:
        for key, view in zip(keys, views, strict=True):
            offset, size = self.places[key]
            np.copyto(view, self.pool[offset : offset + size])

    def exists(self, keys: list[str]) -> int:
        return sum(1 for key in keys if key in self.places)

    def remove(self, keys: list[str]) -> None:
        for key in keys:
            self.places.pop(key, None)

    def close(self) -> None:
        pass


def main() -> int:
    sys.path.insert(0, str(HERE))
    import workloads

    return workloads.serve(MemcpyStore)


if __name__ == "__main__":
    sys.exit(main())
