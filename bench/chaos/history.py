"""What the checker reads: every operation a client made, and the values it put.

A value is a function of its key (``value_of``): a header naming the key and size, then
bytes drawn from a seed derived from the key. Keys are never put twice, so each key has one
value, and a get that returns anything else returned wrong bytes; the header of what came
back tells whose bytes they were. Each client writes its history as JSON lines (``Op``),
times on ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the machine,
so the faults' times compare with the operations').
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path


def value_of(key: str, size: int) -> bytes:
    header = f"{key}#{size}#".encode()
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return (header + random.Random(seed).randbytes(size))[:size]


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def owner_of(data: bytes) -> str:
    """Whose value ``data`` starts like (the key in its header), or "" if none."""
    head = data[:200].split(b"#", 1)[0]
    try:
        return head.decode("ascii") if head and len(head) < 200 else ""
    except UnicodeDecodeError:
        return ""


@dataclass
class Op:
    """One call: ``result`` is "ok" or the exception's class name (``untyped:NAME`` for an
    exception that is not a ``KVPoolError``)."""

    client: str
    op: str  # put | get | remove | exists
    key: str
    size: int
    start: float
    end: float
    result: str
    detail: str = ""  # the error's message (cut), or what a wrong get returned
    digest: str = ""  # of the bytes a get returned
    expected: str = ""  # of the value put under the key

    @property
    def ok(self) -> bool:
        return self.result == "ok"

    @property
    def duration(self) -> float:
        return self.end - self.start


def write(path: Path, ops: Iterable[Op]) -> None:
    with path.open("a") as out:
        for op in ops:
            out.write(json.dumps(asdict(op)) + "\n")


def read(paths: Iterable[Path]) -> Iterator[Op]:
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                yield Op(**json.loads(line))
            except (ValueError, TypeError):
                continue  # a line cut short by a killed client
