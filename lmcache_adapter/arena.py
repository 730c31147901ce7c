"""Zero copy: the L1 arena registered once with UCX, and buffers for memory objects in it.

LMCache's memory objects are slices of one contiguous L1 arena (``l1_memory_desc``). The
arena is registered once with each data client's UCX context, so a store reads a chunk
straight out of L1 into a storage node's segment and a load writes straight from the segment
into L1: no staging copy, no per-transfer registration. A memory object outside the arena
(a caller that built its own buffers) still moves without a copy, registered per transfer.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lmcache.logging import init_logger
from lmcache.v1.distributed.internal_api import L1MemoryDesc
from lmcache.v1.memory_management import MemoryObj

from kvpool import Client
from kvpool.errors import KVPoolError

if TYPE_CHECKING:
    from kvpool.client.types import RegisteredRegion

logger = init_logger(__name__)


@dataclass
class L1Arena:
    base: int = 0
    size: int = 0
    #: Bytes of the arena registered with UCX (0: nothing registered).
    registered: int = 0
    #: Transfers whose buffer lay in the arena / outside it.
    arena_buffers: int = 0
    other_buffers: int = 0
    _view: memoryview | None = field(default=None, repr=False)
    _regions: list[tuple[Client, RegisteredRegion]] = field(default_factory=list, repr=False)

    @classmethod
    def of(cls, desc: L1MemoryDesc | None) -> L1Arena:
        if desc is None or desc.ptr == 0 or desc.size <= 0:
            return cls()
        raw = (ctypes.c_ubyte * desc.size).from_address(desc.ptr)
        return cls(base=desc.ptr, size=desc.size, _view=memoryview(raw).cast("B"))

    def register_with(self, clients: list[Client], stable_size: int | None = None) -> None:
        """Registers the arena with every client's UCX context, once.

        A lazily grown arena may refuse registration past its populated prefix: then the
        stable prefix is registered and the rest moves with per-transfer registration.
        """
        if self._view is None:
            return
        for length in dict.fromkeys(s for s in (self.size, stable_size) if s):
            try:
                for client in clients:
                    self._regions.append((client, client.register_buffer(self._view[:length])))
            except KVPoolError as error:
                logger.warning("kvpool: cannot register %d bytes of L1: %s", length, error)
                self.unregister()
                continue
            self.registered = length
            logger.info("kvpool: registered the L1 arena (%d bytes) for zero copy", length)
            return

    def unregister(self) -> None:
        for client, region in self._regions:
            client.unregister_buffer(region)
        self._regions.clear()
        self.registered = 0

    def buffer(self, obj: MemoryObj) -> memoryview:
        """The bytes of ``obj`` (its logical size), without copying them."""
        size = obj.get_size()
        offset = obj.data_ptr - self.base
        if self._view is not None and offset >= 0 and offset + size <= self.size:
            self.arena_buffers += 1
            return self._view[offset : offset + size]
        self.other_buffers += 1
        return obj.byte_array.cast("B")
