"""LMCache ``ObjectKey`` <-> kvpool key: every field is part of the kvpool key.

Layout (``prefix`` defaults to ``lmcache/``)::

    <prefix><model_name>@<kv_rank:08x>@<object_group_id:x>@<chunk_hash hex>[@<cache_salt>]

This is LMCache's own wire form for L2 keys (``@``-separated, the same field order and
encodings as its native connector and S3 adapters) behind a namespace prefix. ``ObjectKey``
forbids ``@`` in ``model_name`` and ``cache_salt``, so the fields split back unambiguously:
two keys that differ in any field (model, rank, object group, hash, salt) never map to the
same kvpool key, and ``list_l2_keys`` can rebuild the ``ObjectKey`` from the string.
"""

from __future__ import annotations

from lmcache.v1.distributed.api import ObjectKey

SEPARATOR = "@"
DEFAULT_PREFIX = "lmcache/"


class KeyCodec:
    """Turns ``ObjectKey`` into kvpool keys under ``prefix`` and back."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if SEPARATOR in prefix:
            raise ValueError(f"key_prefix must not contain {SEPARATOR!r}, got {prefix!r}")
        self.prefix = prefix

    def encode(self, key: ObjectKey) -> str:
        text = (
            f"{self.prefix}{key.model_name}{SEPARATOR}{key.kv_rank:08x}"
            f"{SEPARATOR}{key.object_group_id:x}{SEPARATOR}{key.chunk_hash.hex()}"
        )
        if key.cache_salt:
            text += f"{SEPARATOR}{key.cache_salt}"
        return text

    def encode_all(self, keys: list[ObjectKey]) -> list[str]:
        return [self.encode(key) for key in keys]

    def decode(self, text: str) -> ObjectKey:
        """The ``ObjectKey`` of a kvpool key; ``ValueError`` if it is not one of ours."""
        if not text.startswith(self.prefix):
            raise ValueError(f"{text!r} does not start with the prefix {self.prefix!r}")
        parts = text[len(self.prefix) :].split(SEPARATOR)
        if len(parts) == 4:
            model, rank, group, digest = parts
            salt = ""
        elif len(parts) == 5:
            model, rank, group, digest, salt = parts
        else:
            raise ValueError(f"{text!r} has {len(parts)} fields, expected 4 or 5")
        return ObjectKey(
            chunk_hash=bytes.fromhex(digest),
            model_name=model,
            kv_rank=int(rank, 16),
            object_group_id=int(group, 16),
            cache_salt=salt,
        )

    def model_prefix(self, model_name: str | None) -> str:
        """The kvpool key prefix of every key of ``model_name`` (all models: None)."""
        if model_name is None:
            return self.prefix
        return f"{self.prefix}{model_name}{SEPARATOR}"
