"""Random schedules of faults from a seed: the same seed gives the same rounds, so a failing
run is replayed with ``--seed``. A round is one to three faults, staggered over its first
seconds, each lasting past the TTL it is meant to cross; the next round starts once the
cluster has converged after the last one healed."""

from __future__ import annotations

import random
from collections.abc import Iterator

from bench.chaos.faults import DISKS, LINKS, PARTITIONS, STALLS, Fault

#: seconds: (shortest, longest) of each kind, past the TTL it crosses where there is one
#: (etcd lease 2 s, node TTL 5 s, client TTL 10 s)
DURATIONS = {
    "partition-leader-etcd": (3.0, 8.0),
    "partition-leader-nodes": (3.0, 10.0),
    "partition-node": (3.0, 10.0),
    "partition-client-node": (2.0, 8.0),
    "loss": (4.0, 12.0),
    "delay": (4.0, 12.0),
    "rate": (4.0, 10.0),
    "duplicate-reorder": (4.0, 10.0),
    "stall-master": (3.0, 7.0),
    "stall-node": (6.0, 10.0),
    "stall-client": (11.0, 14.0),
    "stall-etcd": (3.0, 7.0),
    "disk-full": (4.0, 10.0),
    "disk-slow": (4.0, 10.0),
    "index-readonly": (4.0, 10.0),
}


def draw(rng: random.Random, kind: str, nodes: int, clients: int, start: float) -> Fault:
    low, high = DURATIONS[kind]
    duration = round(rng.uniform(low, high), 1)
    node = f"node{rng.randrange(nodes)}"
    client = f"client{rng.randrange(clients)}"
    target, params = "", {}
    if kind in ("partition-leader-etcd", "partition-leader-nodes"):
        target = "leader"
    elif kind == "partition-node" or kind == "stall-node":
        target = node
    elif kind == "partition-client-node":
        target = f"{client}:{node}"
    elif kind in LINKS:
        target = "all" if rng.random() < 0.4 else rng.choice([node, client, "leader", "etcd"])
        if kind == "loss":
            params = {"loss": rng.choice([0.01, 0.10])}
        elif kind == "delay":
            delay = rng.choice([1, 5, 20, 50, 100])
            params = {"delay_ms": delay, "jitter_ms": round(delay * rng.uniform(0, 0.5), 1)}
        elif kind == "rate":
            params = {"mbit": rng.choice([1, 10, 100])}
        else:
            params = {
                "duplicate": rng.choice([0.01, 0.05]),
                "reorder": rng.choice([0.05, 0.2]),
            }
    elif kind == "stall-master":
        target = "leader" if rng.random() < 0.6 else "standby"
    elif kind == "stall-client":
        target = client
    elif kind == "stall-etcd":
        target = "etcd"
    return Fault(kind, round(start, 1), duration, target, params)


def rounds(seed: int, nodes: int = 3, clients: int = 2) -> Iterator[list[Fault]]:
    """Endless rounds drawn from ``seed``."""
    rng = random.Random(seed)
    families = [PARTITIONS, LINKS, STALLS, DISKS]
    while True:
        count = rng.choice([1, 1, 2, 2, 3])
        faults: list[Fault] = []
        used_targets: set[str] = set()
        for i in range(count):
            family = rng.choice(families)
            kind = rng.choice(family)
            fault = draw(rng, kind, nodes, clients, start=0.0 if i == 0 else rng.uniform(0, 4))
            key = f"{fault.kind.split('-')[0]}:{fault.target}"
            if fault.kind in DISKS:
                key = fault.kind
            if key in used_targets:
                continue  # one stall or partition of one target at a time
            used_targets.add(key)
            faults.append(fault)
        yield faults
