"""Checks of the settings an inference engine hands a kvpool adapter (LMCache's
``adapter_params``, vLLM's tier entry, SGLang's extra config), shared by the three.

Each check raises ValueError naming the setting and what it takes, while the engine starts:
a value that passed here and failed later would fail every request instead (a lease of
50 days overflows the wire's 32-bit milliseconds at each lookup; a key prefix with a lone
surrogate makes every key invalid), or silently mean something else (``"no"`` is truthy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvpool.common.limits import MAX_REPLICAS, MAX_SECONDS

#: Bytes of UTF-8 a key prefix may take: the rest of the key (at most 1024 bytes) names the
#: chunk.
MAX_PREFIX_BYTES = 256


def settings_dict(name: str, settings: object) -> dict[str, Any]:
    """The settings as a dict (None: no settings)."""
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise ValueError(
            f"{name} must be a mapping of setting -> value, not {type(settings).__name__}"
        )
    return dict(settings)


def seconds(name: str, value: object) -> float:
    """A duration: a finite number of seconds, above 0, at most MAX_SECONDS."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if value > MAX_SECONDS:
        raise ValueError(
            f"{name} must be at most {MAX_SECONDS:.0f} seconds (about 49 days), got {value!r}"
        )
    return float(value)


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def replicas(name: str, value: object) -> int:
    """Copies per object: 0 (the master's default) up to the master's MAX_REPLICAS (a put
    asking for more is refused: every store would fail)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPLICAS:
        raise ValueError(
            f"{name} must be an integer from 0 (the master's default) to {MAX_REPLICAS}, "
            f"got {value!r}"
        )
    return value


def key_prefix(name: str, value: object, *, forbidden: str = "", empty_allowed: bool = True) -> str:
    """The text every key of the adapter starts with: valid UTF-8, at most MAX_PREFIX_BYTES,
    without the characters in ``forbidden`` (the adapter's own separators)."""
    if not isinstance(value, str) or (not value and not empty_allowed):
        what = "a string" if empty_allowed else "a non-empty string"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if any(character in value for character in forbidden):
        raise ValueError(f"{name} must not contain {' or '.join(forbidden)!r}, got {value!r}")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} {value!r} is not valid UTF-8 (it has lone surrogates)") from None
    if len(encoded) > MAX_PREFIX_BYTES:
        raise ValueError(
            f"{name} is {len(encoded)} bytes of UTF-8; at most {MAX_PREFIX_BYTES} leave room "
            "in a key (1024 bytes) for the chunk's name"
        )
    return value


def string_map(name: str, value: object) -> dict[str, str]:
    """Settings of a library (UCX's): str -> str (None or empty: none)."""
    value = value or {}
    if not (
        isinstance(value, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    ):
        raise ValueError(f"{name} must map strings to strings, got {value!r}")
    return dict(value)


#: The settings that carry a caller's credentials, in ``CallerCredentials.resolve``'s order.
CREDENTIALS = ("token", "tls_ca", "tls_cert", "tls_key")


def credential_texts(settings: Mapping[str, Any], names: tuple[str, ...] = CREDENTIALS) -> None:
    """Each credential setting given (a token, certificate paths) is a non-empty string."""
    for name in names:
        value = settings.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{name} must be a non-empty string, got {type(value).__name__}")
