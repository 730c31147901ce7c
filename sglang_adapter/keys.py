"""kvpool keys of SGLang's pages:
``<prefix><model>@<shard>@<layout>-<dtype>-<shape>@<page hash>``.

SGLang names a page by the hash of its tokens (and of the pages before it). The same tokens
give other bytes on another tensor-parallel rank (its share of the heads), another pipeline
stage (its layers), another host-pool layout (the order of tokens, layers and heads within a
page) or another KV dtype, so each of those is part of the key: an engine never loads a page
laid out for another one, it misses. So is the shape of the host pool's pages (``shape_of``:
layers, heads, head sizes, tokens a page): two pools whose pages have the same size in bytes
but another shape (another checkpoint served from the same model path, say) would otherwise
read each other's pages as hits, the heads cut in the wrong places. MLA keeps the whole
latent cache on every TP rank, so its pages are shared by the ranks (SGLang lets only one of
them write).

A key is at most 1024 bytes of UTF-8 (kvpool's limit): the engine refuses to start where its
longest key would be longer (a very long ``--model-path`` or ``key_prefix``), instead of
missing on every page.
"""

from __future__ import annotations

from typing import Any

from kvpool.common.keys import MAX_KEY_BYTES, key_problem

#: SGLang's page key: the hex SHA-256 of the page's tokens and of the pages before it.
PAGE_HASH_CHARS = 64
#: The longest host pool layout and KV dtype names SGLang 0.5.23 has: the room kept for them
#: before a host pool is registered.
LONGEST_LAYOUT = "page_first_kv_split"
LONGEST_DTYPE = "float8_e4m3fnuz"


#: The host pool's attributes that make up the shape of its pages, each with the letter
#: that names it in a key (``shape_of``), in key order.
SHAPE_ATTRIBUTES = (
    ("layer_num", "L"),
    ("head_num", "H"),
    ("head_dim", "D"),
    ("v_head_dim", "V"),
    ("kv_lora_rank", "R"),
    ("qk_rope_head_dim", "E"),
    ("page_size", "P"),
)
#: The room kept for the shape before a host pool is registered: every attribute, 7 digits.
LONGEST_SHAPE = "".join(letter + "9" * 7 for _, letter in SHAPE_ATTRIBUTES)


def shape_of(host_pool: Any) -> str:
    """The shape of ``host_pool``'s pages for a key: each of ``SHAPE_ATTRIBUTES`` the pool
    has as a whole number, its letter then its value (``L32H8D128V128P64``); '?' where it
    has none (a pool of another kind: its layout and dtype still tell pools apart)."""
    parts = []
    for name, letter in SHAPE_ATTRIBUTES:
        value = getattr(host_pool, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**7:
            parts.append(f"{letter}{value}")
    return "".join(parts) or "?"


class PageKeys:
    def __init__(self, prefix: str, storage_config: Any) -> None:
        config = storage_config
        self._model = config.model_name or "unnamed"
        shard = "mla" if config.is_mla_model else f"tp{config.tp_rank}of{config.tp_size}"
        if config.pp_size > 1:
            shard += f"-pp{config.pp_rank}of{config.pp_size}"
        if config.attn_cp_size > 1:
            shard += f"-cp{config.attn_cp_rank}of{config.attn_cp_size}"
        self._rank = f"{prefix}{self._model}@{shard}@"
        #: Until a host pool is registered: objects that the caller's buffers lay out.
        self._namespace = self._rank + "raw@"
        self._check_length(f"{self._rank}{LONGEST_LAYOUT}-{LONGEST_DTYPE}-{LONGEST_SHAPE}@")

    def bind(self, host_pool: Any) -> None:
        """Completes the namespace with what the host pool says of its pages."""
        layout = getattr(host_pool, "layout", "unknown")
        dtype = str(getattr(host_pool, "dtype", "unknown")).removeprefix("torch.")
        namespace = f"{self._rank}{layout}-{dtype}-{shape_of(host_pool)}@"
        self._check_length(namespace)
        self._namespace = namespace

    def _check_length(self, namespace: str) -> None:
        """ValueError where a page key under ``namespace`` would not be a valid kvpool key
        (over 1024 bytes: every lookup, load and store of the engine would fail)."""
        problem = key_problem(namespace + "0" * PAGE_HASH_CHARS)
        if problem is None:
            return
        shown = namespace if len(namespace) <= 120 else namespace[:100] + "..."
        raise ValueError(
            f"kvpool: this engine's page keys would not be valid kvpool keys ({problem}): "
            f"a key is the namespace {shown!r} ({_utf8_bytes(namespace)} bytes: key_prefix, "
            f"the model name ({_utf8_bytes(self._model)} bytes), rank and host pool "
            f"layout) and a {PAGE_HASH_CHARS}-character page hash, at most {MAX_KEY_BYTES} "
            "bytes of UTF-8 in all. Give the backend a shorter key_prefix, or serve the "
            "model from a shorter --model-path (a symbolic link to its directory)."
        )

    @property
    def namespace(self) -> str:
        """What every key of this engine (rank, and host pool once bound) starts with."""
        return self._namespace

    def names(self, keys: list[str]) -> list[str]:
        namespace = self._namespace
        return [namespace + key for key in keys]


def _utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", errors="replace"))
