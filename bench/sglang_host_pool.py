"""SGLang's host KV pools as plain torch CPU tensors, for tests and benchmarks of kvpool.sglang.

SGLang 0.5.23's own host pools (``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost``) cannot be
imported on a machine without a GPU: their module chain needs a CUDA build of torchvision.
These allocate the same buffer (``init_kv_buffer``'s shapes, per layout) and describe pages
the same way (``get_page_buffer_meta``: the same pointers and sizes, in the same order), which
is all a storage backend sees of a host pool, plus the page accessors tests compare with.
"""

from __future__ import annotations

import torch

PAGE_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


class MHAHostPool:
    """``MHATokenToKVPoolHost``'s buffer (K and V of every layer) and page description."""

    def __init__(
        self,
        pages: int,
        page_size: int,
        layer_num: int,
        head_num: int,
        head_dim: int,
        *,
        layout: str = "page_first",
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.page_size, self.layer_num = page_size, layer_num
        self.head_num, self.head_dim = head_num, head_dim
        self.layout, self.dtype = layout, dtype
        self.page_num = pages
        self.size = pages * page_size
        if layout == "layer_first":
            dims: tuple[int, ...] = (2, layer_num, self.size, head_num, head_dim)
        elif layout == "page_first":
            dims = (2, self.size, layer_num, head_num, head_dim)
        elif layout == "page_first_direct":
            dims = (2, pages, layer_num, page_size, head_num, head_dim)
        else:
            raise ValueError(f"unsupported layout {layout!r}: one of {PAGE_LAYOUTS}")
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def get_hybrid_pool_buffer(self) -> list[torch.Tensor]:
        return [self.kv_buffer[0], self.kv_buffer[1]]

    def get_ksize_per_token(self) -> int:
        return self.head_dim * self.head_num * self.layer_num * self.dtype.itemsize

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        assert len(indices) % self.page_size == 0
        item = self.dtype.itemsize
        base = self.kv_buffer.data_ptr()
        starts = indices.tolist()[:: self.page_size]
        token = self.head_num * self.head_dim * item
        v_offset = self.layer_num * self.size * token
        pointers: list[int] = []
        if self.layout == "layer_first":
            for index in starts:
                for layer in range(self.layer_num):
                    k = base + index * token + layer * self.size * token
                    pointers += [k, k + v_offset]
            size = item * self.page_size * self.head_num * self.head_dim
        else:
            for index in starts:
                k = base + index * self.layer_num * token
                pointers += [k, k + v_offset]
            size = self.layer_num * item * self.page_size * self.head_num * self.head_dim
        return pointers, [size] * len(pointers)

    def page_bytes(self) -> int:
        """Bytes of one page (K and V, every layer)."""
        return 2 * self.page_size * self.get_ksize_per_token()

    def page(self, index: int) -> torch.Tensor:
        """The page whose first token is ``index``, as a view (``get_data_page(flat=False)``)."""
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index : index + self.page_size]
        if self.layout == "page_first":
            return self.kv_buffer[:, index : index + self.page_size]
        return self.kv_buffer[:, index // self.page_size]


class MLAHostPool:
    """``MLATokenToKVPoolHost``'s buffer (one latent cache row per token and layer) and page
    description, page_first layout."""

    layout = "page_first"

    def __init__(
        self,
        pages: int,
        page_size: int,
        layer_num: int,
        kv_cache_dim: int,
        *,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.page_size, self.layer_num, self.kv_cache_dim = page_size, layer_num, kv_cache_dim
        self.dtype = dtype
        self.page_num = pages
        self.size = pages * page_size
        self.kv_buffer = torch.zeros((self.size, layer_num, 1, kv_cache_dim), dtype=dtype)

    def get_ksize_per_token(self) -> int:
        return self.kv_cache_dim * self.layer_num * self.dtype.itemsize

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        assert len(indices) % self.page_size == 0
        item = self.dtype.itemsize
        base = self.kv_buffer.data_ptr()
        pointers = [
            base + index * self.layer_num * self.kv_cache_dim * item
            for index in indices.tolist()[:: self.page_size]
        ]
        size = self.layer_num * item * self.page_size * self.kv_cache_dim
        return pointers, [size] * len(pointers)

    def page_bytes(self) -> int:
        return self.page_size * self.get_ksize_per_token()

    def page(self, index: int) -> torch.Tensor:
        return self.kv_buffer[index : index + self.page_size]


def page_indices(pages: list[int], page_size: int) -> torch.Tensor:
    """SGLang's host indices of whole pages: ``page_size`` token slots per page."""
    return torch.tensor(
        [p * page_size + t for p in pages for t in range(page_size)], dtype=torch.int64
    )
