"""What the emulated network does to one packet: the rules of every link, without I/O.

The kernel this suite runs on may have no ``netem`` (nor ``prio``, ``gact``, iptables):
kvpool's CI kernel has none. So the namespaces are joined by a switch of our own
(``switch.py``), and this module is its netem: for a packet from one site to another it
says when, if ever, and how many times the packet is delivered. Faults are layers: each
injected fault adds an ``Impairment`` to some directed pairs under its own id, and a pair's
effect is all its layers combined (blocked if any blocks; losses compound; delays add; the
slowest rate wins), so faults overlap and heal independently. Seeded, so that a run's packet
fate is drawn from its seed (timing still varies from run to run).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

#: A packet that would wait longer than this behind a rate limit is dropped (a full queue).
RATE_QUEUE_S = 0.5
#: How long a packet picked for reordering is held back, at most (later ones overtake it).
REORDER_HOLD_S = (0.002, 0.010)


@dataclass(frozen=True)
class Impairment:
    """netem's knobs, and a partition: ``blocked`` drops every packet."""

    blocked: bool = False
    loss: float = 0.0  # probability a packet is dropped
    delay_s: float = 0.0
    jitter_s: float = 0.0  # each packet's delay is delay_s +- a uniform draw of this
    duplicate: float = 0.0  # probability a packet is delivered twice
    reorder: float = 0.0  # probability a packet is held back so later ones overtake it
    rate_bps: float = 0.0  # bits per second; 0: unlimited

    @staticmethod
    def from_dict(raw: dict) -> Impairment:
        return Impairment(**{name: raw[name] for name in raw})


def combine(layers: list[Impairment]) -> Impairment:
    """The effect of several faults on one pair at once."""
    kept_loss = kept_dup = kept_reorder = 1.0
    rates = [layer.rate_bps for layer in layers if layer.rate_bps > 0]
    for layer in layers:
        kept_loss *= 1 - layer.loss
        kept_dup *= 1 - layer.duplicate
        kept_reorder *= 1 - layer.reorder
    return Impairment(
        blocked=any(layer.blocked for layer in layers),
        loss=1 - kept_loss,
        delay_s=sum(layer.delay_s for layer in layers),
        jitter_s=sum(layer.jitter_s for layer in layers),
        duplicate=1 - kept_dup,
        reorder=1 - kept_reorder,
        rate_bps=min(rates) if rates else 0.0,
    )


@dataclass
class Counters:
    delivered: int = 0
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0


@dataclass
class Links:
    """Every directed pair's layers, and the fate of each packet."""

    seed: int = 0
    layers: dict[tuple[str, str], dict[str, Impairment]] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    _effective: dict[tuple[str, str], Impairment] = field(default_factory=dict)
    _busy_until: dict[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def add(self, fault_id: str, pairs: list[tuple[str, str]], impairment: Impairment) -> None:
        for pair in pairs:
            self.layers.setdefault(pair, {})[fault_id] = impairment
            self._effective[pair] = combine(list(self.layers[pair].values()))

    def remove(self, fault_id: str) -> None:
        for pair, by_id in list(self.layers.items()):
            if by_id.pop(fault_id, None) is None:
                continue
            if by_id:
                self._effective[pair] = combine(list(by_id.values()))
            else:
                del self.layers[pair]
                self._effective.pop(pair, None)
                self._busy_until.pop(pair, None)

    def clear(self) -> None:
        self.layers.clear()
        self._effective.clear()
        self._busy_until.clear()

    def fate(self, source: str, target: str, size: int, now: float) -> list[float]:
        """When the packet is delivered: [] (dropped), [now] (at once), or later times."""
        rule = self._effective.get((source, target))
        if rule is None:
            self.counters.delivered += 1
            return [now]
        if rule.blocked or (rule.loss and self._random.random() < rule.loss):
            self.counters.dropped += 1
            return []
        departs = now
        if rule.rate_bps:
            pair = (source, target)
            departs = max(now, self._busy_until.get(pair, now)) + size * 8 / rule.rate_bps
            if departs - now > RATE_QUEUE_S:
                self.counters.dropped += 1
                return []
            self._busy_until[pair] = departs
        copies = 2 if rule.duplicate and self._random.random() < rule.duplicate else 1
        times = []
        for _ in range(copies):
            delay = rule.delay_s
            if rule.jitter_s:
                delay = max(0.0, delay + self._random.uniform(-rule.jitter_s, rule.jitter_s))
            if rule.reorder and self._random.random() < rule.reorder:
                delay += self._random.uniform(*REORDER_HOLD_S)
            times.append(departs + delay)
        self.counters.delivered += 1
        self.counters.duplicated += copies - 1
        if times[0] > now:
            self.counters.delayed += 1
        return times
