"""Human-readable byte sizes: ``4GiB`` in, ``4.0 GiB`` out."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
#: The largest size a wire field holds (64 bits).
MAX_SIZE = 2**64 - 1
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parses ``4GiB``, ``512MiB``, ``1.5G``, ``4096``; a ValueError names the accepted forms."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative, got {text}")
        return text
    match = _PATTERN.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a size: use a number with an optional unit "
            "(B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB), e.g. 4GiB"
        )
    number = match.group(1)
    whole = number.partition(".")[0].lstrip("0")
    # (whole numbers exactly; a fraction as a float, which a number of 400 digits overflows;
    # and none of more digits than the largest size has: Python reads at most 4,300)
    if len(whole) > len(str(MAX_SIZE)):
        size: float = math.inf
    elif "." not in number:
        size = int(number) * _UNITS[unit]
    else:
        size = float(number) * _UNITS[unit]
    if size > MAX_SIZE:
        shown = text if len(text) <= 40 else f"{text[:20]}...{text[-8:]}"
        raise ValueError(f"{shown!r} is too large a size: at most 16 EiB ({MAX_SIZE} bytes)")
    if unit in ("", "b") and size != int(size):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(size)


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
