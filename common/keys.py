"""Object keys: what makes one valid, checked the same way by client and master."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

MAX_KEY_BYTES = 1024
#: What a tenant's name and its separator add in front of a key where the master and the
#: storage nodes hold it ("TENANT/KEY"; tenant names are at most 63 characters).
TENANT_PREFIX_BYTES = 64
#: The longest key as the master and the nodes hold it.
STORED_KEY_BYTES = MAX_KEY_BYTES + TENANT_PREFIX_BYTES


def key_problem(key: object, limit: int = MAX_KEY_BYTES) -> str | None:
    """Why ``key`` is not a valid kvpool key (of at most ``limit`` bytes), or None."""
    if not isinstance(key, str):
        return f"keys are str, not {type(key).__name__}"
    if not key:
        return "the key is empty"
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:
        return "the key is not valid UTF-8 (it contains lone surrogates)"
    if len(encoded) > limit:
        return f"the key is {len(encoded)} bytes of UTF-8; the limit is {limit}"
    return None


def plainly_valid(keys: Sequence[object], limit: int = MAX_KEY_BYTES) -> bool:
    """True when every key is a non-empty ASCII str short enough: valid without looking
    closer (ASCII is one byte per character, and never a lone surrogate). A False asks for
    ``key_problem`` on each. Checked a whole batch at a time, in C: on every keyed call."""
    try:
        joined = "".join(keys)  # type: ignore[arg-type]  # (a TypeError: not all str)
    except TypeError:
        return False
    strings = cast("Sequence[str]", keys)  # the join took every one
    return joined.isascii() and all(strings) and max(map(len, strings), default=0) <= limit


def valid_positions(keys: Sequence[object]) -> list[int]:
    """The positions of the keys ``key_problem`` takes, in order (all of them, nearly
    always: checked fast), for calls that skip invalid keys rather than answer each (no
    object could be stored under one)."""
    if plainly_valid(keys):
        return list(range(len(keys)))
    return [i for i, key in enumerate(keys) if key_problem(key) is None]


def valid_keys_of(keys: Sequence[str]) -> list[str]:
    """``keys`` less those ``key_problem`` refuses, in order (see ``valid_positions``)."""
    if plainly_valid(keys):
        return list(keys)
    return [keys[i] for i in valid_positions(keys)]


#: Keys longer than this are cut when a message quotes them: a 1 KiB key (the limit, or an
#: invalid longer one) would bury the message itself.
SHOWN_KEY_CHARS = 80


def shown_key(key: object) -> str:
    """``key`` as messages quote it: its repr, or for a long key its start and end around an
    ellipsis, with its length (keys often share a long prefix and differ at the end)."""
    if isinstance(key, str) and len(key) > SHOWN_KEY_CHARS:
        return f"{key[:56] + '…' + key[-16:]!r} ({len(key)} characters)"
    if isinstance(key, bytes) and len(key) > SHOWN_KEY_CHARS:
        return f"{key[:56] + b'...' + key[-16:]!r} ({len(key)} bytes)"
    return repr(key)
