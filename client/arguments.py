"""Checks of a caller's numeric arguments (durations, counts, sizes) before they reach a wire
field or a wait.

Why: a NaN passes ``timeout <= 0`` and then never runs out (a retry loop with no end), an
infinite one does the same, and a number past its wire field's range fails deep inside
protobuf with a message that does not name the argument. Each check here says which argument
is wrong and what it may be.
"""

from __future__ import annotations

import math

from kvpool.errors import InvalidArgument

#: The longest duration a call may carry: the wire's millisecond fields are 32-bit.
MAX_SECONDS = (2**32 - 1) / 1000.0
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
