"""Numbers on a command line, checked as argparse reads them: finite and within their range.

Each function here returns an argparse ``type``. A value out of range ends the command with
exit code 2 and one line that names the flag (argparse adds it): ``argument --tick: must be a
number of seconds in (0, 60], got '-5'``. Ranges that depend on the machine (the memory a
DRAM segment may take) are checked when the command runs, not here: a command line must read
the same everywhere (the Helm chart's tests parse the chart's).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from kvpool.common.sizes import format_size, parse_size

#: Durations of timeouts and TTLs: at most 30 days (the wire carries some in 32-bit ms).
MAX_SECONDS = 30 * 24 * 3600.0
#: A segment is mapped whole into the node's address space (47 bits on x86-64 and arm64).
MAX_SEGMENT = 1 << 47


def seconds(low: float, high: float = MAX_SECONDS, *, zero: bool = False) -> Callable[[str], float]:
    """A number of seconds in (``low``, ``high``], or [``low``, ``high``] with ``zero``."""
    return real(low, high, low_included=zero, unit="a number of seconds")


def real(
    low: float,
    high: float,
    *,
    low_included: bool = True,
    high_included: bool = True,
    unit: str = "a number",
) -> Callable[[str], float]:
    """A finite number between ``low`` and ``high`` (each end included or not)."""
    opening, closing = "[" if low_included else "(", "]" if high_included else ")"
    span = f"{opening}{_plain(low)}, {_plain(high)}{closing}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above = value >= low if low_included else value > low
        below = value <= high if high_included else value < high
        if not (math.isfinite(value) and above and below):
            raise argparse.ArgumentTypeError(f"must be {unit} in {span}, got {text!r}")
        return value

    return parse


def integer(low: int, high: int) -> Callable[[str], int]:
    """A whole number in [``low``, ``high``]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be a whole number from {low} to {high}, got {text!r}"
            )
        return value

    return parse


def port(*, none: int | None = None) -> Callable[[str], int]:
    """A TCP port, 0 for any free one (and ``none`` to mean no port at all, when given)."""
    return integer(0 if none is None else min(none, 0), 65535)


def size(*, low: int = 0, high: int = MAX_SEGMENT) -> Callable[[str], int]:
    """A byte size (``4GiB``, ``512MiB``, ``4096``) in [``low``, ``high``]."""

    def parse(text: str) -> int:
        try:
            value = parse_size(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        except OverflowError:  # "9" * 400 reads as an infinite float
            value = high + 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be a size from {format_size(low)} to {format_size(high)}, got {text!r}"
            )
        return value

    return parse


def _plain(number: float) -> str:
    """``2592000`` rather than ``2.592e+06``; ``0.5`` as it is."""
    return str(int(number)) if number == int(number) else f"{number:g}"
