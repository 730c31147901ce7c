"""kvpool keys of SGLang's pages: ``<prefix><model>@<shard>@<layout>-<dtype>@<page hash>``.

SGLang names a page by the hash of its tokens (and of the pages before it). The same tokens
give other bytes on another tensor-parallel rank (its share of the heads), another pipeline
stage (its layers), another host-pool layout (the order of tokens, layers and heads within a
page) or another KV dtype, so each of those is part of the key: an engine never loads a page
laid out for another one, it misses. MLA keeps the whole latent cache on every TP rank, so
its pages are shared by the ranks (SGLang lets only one of them write).
"""

from __future__ import annotations

from typing import Any


class PageKeys:
    def __init__(self, prefix: str, storage_config: Any) -> None:
        config = storage_config
        shard = "mla" if config.is_mla_model else f"tp{config.tp_rank}of{config.tp_size}"
        if config.pp_size > 1:
            shard += f"-pp{config.pp_rank}of{config.pp_size}"
        if config.attn_cp_size > 1:
            shard += f"-cp{config.attn_cp_rank}of{config.attn_cp_size}"
        self._rank = f"{prefix}{config.model_name or 'unnamed'}@{shard}@"
        #: Until a host pool is registered: objects that the caller's buffers lay out.
        self._namespace = self._rank + "raw@"

    def bind(self, host_pool: Any) -> None:
        """Completes the namespace with what the host pool says of its pages."""
        layout = getattr(host_pool, "layout", "unknown")
        dtype = str(getattr(host_pool, "dtype", "unknown")).removeprefix("torch.")
        self._namespace = f"{self._rank}{layout}-{dtype}@"

    @property
    def namespace(self) -> str:
        """What every key of this engine (rank, and host pool once bound) starts with."""
        return self._namespace

    def names(self, keys: list[str]) -> list[str]:
        namespace = self._namespace
        return [namespace + key for key in keys]
