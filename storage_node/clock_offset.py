"""How far this node's wall clock is from the master's, told by each heartbeat (sans-IO).

Capabilities carry an expiry in the master's wall-clock time, and the node checks them
against its own clock, allowing ``max_skew_ms`` either way (security/capabilities.py). A node
whose clock is ahead by more than that cuts every grant short, and ahead by more than a
grant's life refuses every transfer as EXPIRED; one behind by more than the longest grant
refuses them as running too far ahead. Nothing else in kvpool depends on wall clocks agreeing,
so nothing else would show it: the master puts its wall clock in each heartbeat's answer, and
the node estimates the offset from it and says so (a gauge, and a warning) before a put fails.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds between two warnings while the offset stays past what is allowed.
WARN_EVERY = 600.0


@dataclass(frozen=True, slots=True)
class OffsetEstimate:
    #: This node's clock minus the master's, in seconds (positive: the node is ahead).
    offset: float
    #: How far off the estimate may be: half the heartbeat's round trip.
    uncertainty: float
    #: The offset surely passes what capabilities allow.
    too_far: bool


class ClockOffset:
    """Estimates from heartbeats; ``warn`` says when to log (once, then every WARN_EVERY
    seconds while it lasts, and once more when it is over)."""

    def __init__(self) -> None:
        self.latest: OffsetEstimate | None = None
        self._warned_at: float | None = None

    def heard(
        self, sent: float, received: float, master_time_ms: int, allowed_ms: int
    ) -> OffsetEstimate | None:
        """A heartbeat sent at ``sent`` and answered at ``received`` (this node's wall
        clock, seconds) carried the master's wall clock ``master_time_ms`` (0: a master of an
        older kvpool, which sends none); capabilities allow ``allowed_ms`` of skew."""
        if master_time_ms <= 0 or received < sent:
            return None  # (no time given, or this clock was set back meanwhile)
        uncertainty = (received - sent) / 2
        offset = sent + uncertainty - master_time_ms / 1000
        too_far = abs(offset) - uncertainty > allowed_ms / 1000
        self.latest = OffsetEstimate(offset, uncertainty, too_far)
        return self.latest

    def warn(self, now: float) -> str | None:
        """What to log about the latest estimate at ``now`` (monotonic seconds), if anything:
        "too_far" or "back_in_range"."""
        latest = self.latest
        if latest is None:
            return None
        if latest.too_far:
            if self._warned_at is None or now - self._warned_at >= WARN_EVERY:
                self._warned_at = now
                return "too_far"
            return None
        if self._warned_at is not None:
            self._warned_at = None
            return "back_in_range"
        return None
