"""The bytes of the kvpool tier: primary-tier slots moved to and from kvpool, zero copy.

vLLM hands a secondary tier one ``memoryview`` over the primary (CPU) tier's memory, shaped
(slots, bytes per slot); jobs name slots by index. ``PrimarySlots`` registers that memory once
with each kvpool client, so a store reads a slot straight into a storage node's segment and a
load writes straight into the slot: no staging copy, no per-transfer registration. One
object per slot, the whole slot (its padding included, as vLLM's file-system tier does), so a
chunk is valid only at exactly the slot's size.

``store`` and ``load`` are one kvpool batch each (one master round trip to reserve or locate
every key, all transfers in flight together). They return what happened per chunk; the
caller turns that into vLLM's job result. kvpool guarantees that when a get returns (done,
failed or timed out), no transfer still writes into its buffers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvpool.common.kept_errors import forget_tracebacks
from kvpool.errors import KVPoolError, ObjectBeingWritten, ObjectExists

if TYPE_CHECKING:
    from kvpool import Client
    from kvpool.client.types import RegisteredRegion


class PrimarySlots:
    """The primary tier's memory as flat bytes: slot ``i`` is ``[i * stride, (i+1) * stride)``."""

    def __init__(self, view: memoryview) -> None:
        if view.ndim < 2 or not view.c_contiguous or view.strides is None:
            raise ValueError(
                "the primary tier's memoryview must be C-contiguous and shaped "
                f"(slots, bytes per slot), got ndim={view.ndim} shape={view.shape}"
            )
        self.count = view.shape[0] if view.shape else 0
        self.stride = view.strides[0]
        self.flat = view.cast("B")
        self._regions: list[tuple[Client, RegisteredRegion]] = []

    def problem(self, slots: Sequence[int], keys: int) -> str | None:
        """Why a job naming ``slots`` for ``keys`` keys cannot run, or None."""
        if len(slots) != keys:
            return f"{keys} keys but {len(slots)} slots"
        bad = [s for s in slots if not 0 <= s < self.count]
        if bad:
            return f"slot(s) {bad[:4]} outside the primary tier's {self.count} slots"
        return None

    def slot(self, index: int) -> memoryview:
        start = index * self.stride
        return self.flat[start : start + self.stride]

    def register_with(self, clients: Sequence[Client]) -> None:
        for client in clients:
            self._regions.append((client, client.register_buffer(self.flat)))

    def unregister(self) -> None:
        for client, region in self._regions:
            client.unregister_buffer(region)
        self._regions.clear()

    def release(self) -> None:
        """Lets go of the primary's memory (after ``unregister`` and the last transfer), so
        that vLLM can unmap it: a view still held would keep the mapping exported."""
        self.flat.release()

    @property
    def registered(self) -> bool:
        return bool(self._regions)


@dataclass
class Stored:
    """One store batch: per chunk, new, already there (same key, same bytes), or an error."""

    new: list[int] = field(default_factory=list)
    existing: list[int] = field(default_factory=list)
    errors: dict[int, KVPoolError] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0


@dataclass
class Loaded:
    """One load batch: the chunks that arrived whole, and an error for each other."""

    hits: list[int] = field(default_factory=list)
    errors: dict[int, KVPoolError] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0


def store(client: Client, names: Sequence[str], buffers: Sequence[memoryview]) -> Stored:
    outcome = Stored()
    started = time.monotonic()
    results: list[int | KVPoolError]
    try:
        results = client.put_many(list(zip(names, buffers, strict=True)))
    except KVPoolError as error:
        results = [error] * len(names)
    forget_tracebacks(results)  # (they would pin views of the primary: common/kept_errors.py)
    for i, result in enumerate(results):
        # (objects are immutable and the key names the content; one another engine is still
        # writing is not stored yet: its put may fail)
        if isinstance(result, ObjectExists) and not isinstance(result, ObjectBeingWritten):
            outcome.existing.append(i)
        elif isinstance(result, KVPoolError):
            outcome.errors[i] = result
        else:
            outcome.new.append(i)
            outcome.bytes += len(buffers[i])
    outcome.seconds = time.monotonic() - started
    return outcome


def load(client: Client, names: Sequence[str], buffers: Sequence[memoryview]) -> Loaded:
    """Gets ``names[i]`` into ``buffers[i]`` within the client's timeout; a chunk of another
    size than its slot is an error (another layout's chunk, never a partial hit)."""
    outcome = Loaded()
    started = time.monotonic()
    results: list[int | KVPoolError]
    try:
        results = client.get_into_many(names, buffers)
    except KVPoolError as error:
        results = [error] * len(names)
    forget_tracebacks(results)
    for i, result in enumerate(results):
        if isinstance(result, KVPoolError):
            outcome.errors[i] = result
        elif result != len(buffers[i]):
            outcome.errors[i] = KVPoolError(
                f"{names[i]!r} is {result} bytes, its slot {len(buffers[i])}", key=names[i]
            )
        else:
            outcome.hits.append(i)
            outcome.bytes += result
    outcome.seconds = time.monotonic() - started
    return outcome
