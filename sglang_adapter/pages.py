"""SGLang's host KV pool as kvpool sees it: its buffers registered with UCX once, and the
pieces of each page as views into them (no copy).

A page is one kvpool object. SGLang's host pool says where a page's bytes lie through
``get_page_buffer_meta(host_indices)``: one or more (pointer, size) pieces per page (MHA: the
page's K and V; layer-first layouts: K and V of every layer; MLA: the latent cache), in an
order that depends only on the pool's layout. The object is those pieces one after another:
a store gathers them (``put_parts_many``), a load scatters the object back into them
(``get_into_parts_many``), each piece its own transfer straight out of or into the pool.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

from kvpool import Client
from kvpool.errors import KVPoolError

logger = logging.getLogger(__name__)


def byte_view(address: int, length: int) -> memoryview:
    """A writable view of ``length`` bytes at ``address`` (memory SGLang owns)."""
    return memoryview((ctypes.c_ubyte * length).from_address(address)).cast("B")


def pool_buffers(host_pool: Any) -> list[Any]:
    """The tensors that hold a host pool's pages (MHA: K and V; MLA: the one kv buffer)."""
    get_buffers = getattr(host_pool, "get_hybrid_pool_buffer", None)
    buffers = get_buffers() if get_buffers is not None else getattr(host_pool, "kv_buffer", None)
    if buffers is None:
        return []
    if not isinstance(buffers, list | tuple):
        buffers = [buffers]
    return [b for b in buffers if b is not None]


class HostPages:
    def __init__(self, host_pool: Any) -> None:
        self.pool = host_pool
        self.page_size = int(host_pool.page_size)
        #: (start, end, view) of each contiguous pool buffer.
        self._spans: list[tuple[int, int, memoryview]] = []
        for tensor in pool_buffers(host_pool):
            if tensor.is_contiguous() and tensor.numel():
                start = tensor.data_ptr()
                length = tensor.numel() * tensor.element_size()
                self._spans.append((start, start + length, byte_view(start, length)))
        self._regions: list[tuple[Client, Any]] = []

    def register_with(self, clients: Sequence[Client]) -> int:
        """Registers every pool buffer with each client's UCX context (once); returns the
        bytes registered. A buffer that cannot be registered moves with per-transfer
        registration instead (slower, still without a copy)."""
        registered = 0
        for start, end, view in self._spans:
            try:
                for client in clients:
                    self._regions.append((client, client.register_buffer(view)))
            except KVPoolError as error:
                logger.warning(
                    "kvpool: cannot register %d bytes of host pool: %s", end - start, error
                )
                continue
            registered += end - start
        return registered

    def unregister(self) -> None:
        for client, region in self._regions:
            client.unregister_buffer(region)
        self._regions.clear()

    def pieces(self, count: int, host_indices: Any) -> list[list[memoryview]]:
        """The pieces of each of ``count`` pages at ``host_indices`` (``page_size`` indices
        per page, as SGLang passes them), in the pool's order."""
        if len(host_indices) != count * self.page_size:
            raise ValueError(
                f"{count} page key(s) but {len(host_indices)} host indices: pass "
                f"page_size ({self.page_size}) indices per key"
            )
        if not count:
            return []
        pointers, sizes = self.pool.get_page_buffer_meta(host_indices)
        pointers, sizes = _flat(pointers), _flat(sizes)
        if len(pointers) != len(sizes) or len(pointers) % count:
            raise ValueError(
                f"the host pool described {len(pointers)} piece(s) for {count} page(s): "
                "a layout kvpool cannot split into pages"
            )
        per_page = len(pointers) // count
        views = [self._view(p, s) for p, s in zip(pointers, sizes, strict=True)]
        return [views[i : i + per_page] for i in range(0, len(views), per_page)]

    def _view(self, address: int, length: int) -> memoryview:
        for start, end, view in self._spans:
            if start <= address and address + length <= end:
                return view[address - start : address - start + length]
        return byte_view(address, length)


def _flat(items: Sequence[Any]) -> list[int]:
    """Pointers or sizes, whether given one per piece or grouped per page (multi-buffer)."""
    if items and isinstance(items[0], Sequence):
        return [int(x) for group in items for x in group]
    return [int(x) for x in items]
