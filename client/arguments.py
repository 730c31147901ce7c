"""Checks of a caller's arguments (durations, counts, flags, texts, the shape of a batch)
before they reach a wire field or a wait.

Why: a NaN passes ``timeout <= 0`` and then never runs out (a retry loop with no end), an
infinite one does the same, and a number past its wire field's range fails deep inside
protobuf with a message that does not name the argument. A str where a list of keys belongs
is a sequence too, of one-character keys: ``remove_many("key")`` would remove "k", "e" and
"y". A truthy string where a flag belongs (``checksum="no"``) would mean yes. Each check here
says which argument is wrong and what it may be.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvpool.common.keys import shown_key
from kvpool.common.limits import MAX_SECONDS
from kvpool.errors import InvalidArgument

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


def seconds(name: str, value: object, *, zero_allowed: bool) -> float:
    """``value`` as a duration in seconds: a real number, finite, positive (or zero where
    ``zero_allowed``), at most MAX_SECONDS."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{name} must be a number of seconds, got {value!r}")
    least = "0 or more" if zero_allowed else "more than 0"
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
        raise InvalidArgument(f"{name} must be a finite number of seconds, {least}; got {value!r}")
    if value > MAX_SECONDS:
        raise InvalidArgument(
            f"{name} must be at most {MAX_SECONDS:.0f} seconds (about 49 days), got {value!r}"
        )
    return float(value)


def whole(name: str, value: object, *, least: int = 0, most: int = UINT64_MAX) -> int:
    """``value`` as a whole number from ``least`` to ``most``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be a whole number, got {value!r}")
    if not least <= value <= most:
        raise InvalidArgument(f"{name} must be from {least} to {most}, got {value}")
    return value


def flag(name: str, value: object) -> bool:
    """``value`` as a flag: True or False only (a string such as "no" is truthy)."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    return value


def text(name: str, value: object, *, empty_allowed: bool = True) -> str:
    """``value`` as text that can go on the wire: a str of valid UTF-8 (no lone surrogates)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a str, not {type(value).__name__} ({value!r})")
    if not value and not empty_allowed:
        raise InvalidArgument(f"{name} must not be empty")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"{name} {shown_key(value)} is not valid UTF-8 (it contains lone surrogates)"
            ) from None
    return value


def texts(name: str, values: object) -> tuple[str, ...]:
    """``values`` as a list of texts (host names, say); one str is refused, not split."""
    if isinstance(values, str | bytes):
        raise InvalidArgument(f"{name} must be a list of str, not one {type(values).__name__}")
    if not isinstance(values, Iterable):
        raise InvalidArgument(f"{name} must be a list of str, not {type(values).__name__}")
    return tuple(text(f"each of {name}", value, empty_allowed=False) for value in values)


def string_map(name: str, value: object) -> dict[str, str] | None:
    """``value`` as settings: a mapping of str to str, or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidArgument(
            f"{name} must map str to str (such as {{'TLS': 'tcp'}}), got {value!r}"
        )
    return dict(value)


def key_list(call: str, keys: object, single: str) -> Sequence[Any]:
    """``keys`` of a batch call as a list (the keys themselves are checked per key, later).
    One str is refused rather than taken for its characters; ``single`` names the call for one
    key."""
    if isinstance(keys, list | tuple):  # (the common case, at once)
        return keys
    if isinstance(keys, str | bytes | bytearray | memoryview):
        raise InvalidArgument(
            f"{call} takes a list of keys, not one {type(keys).__name__}: for one key, "
            f"call {single}"
        )
    if not isinstance(keys, Iterable):
        raise InvalidArgument(f"{call} takes a list of keys (str), not {type(keys).__name__}")
    return list(keys)


def pair_list(call: str, items: object, what: str) -> tuple[list[Any], list[Any]]:
    """``items`` of a batch call, a mapping or (key, ``what``) pairs, as a list of pairs and the
    list of their keys."""
    if isinstance(items, Mapping):
        pairs = list(items.items())
    elif isinstance(items, Iterable) and not isinstance(items, str | bytes | bytearray):
        pairs = list(items)
    else:
        raise InvalidArgument(
            f"{call} takes a dict of key -> {what} or a list of (key, {what}) pairs, not "
            f"{type(items).__name__}"
        )
    try:
        keys = [key for key, _ in pairs]
    except (TypeError, ValueError):
        for i, pair in enumerate(pairs):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise InvalidArgument(
                    f"{call} takes (key, {what}) pairs: entry {i} is {shown_key(pair)}"
                ) from None
        raise
    return pairs, keys


def one_buffer(value: object) -> bool:
    """Whether ``value`` is one buffer (it exposes the buffer protocol, or it is a torch
    tensor), not a list of them: a call that takes one buffer per key must not take its
    bytes, or its rows, for the buffers."""
    if isinstance(value, bytes | bytearray | memoryview):
        return True
    if hasattr(value, "data_ptr"):  # (a torch tensor, on any device)
        return True
    try:
        view = memoryview(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    view.release()
    return True
