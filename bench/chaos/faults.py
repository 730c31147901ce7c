"""The faults the suite injects, each with its healing.

A ``Fault`` is data (kind, target, parameters, when it starts and how long it lasts), so a
schedule drawn from a seed can be printed, saved and replayed. ``inject`` acts on the running
system and returns an ``Injected`` that knows how to heal it; targets named by role
(``leader``) are resolved when the fault starts. Kinds:

- partitions (both directions cut at the switch): ``partition-leader-etcd`` (the leader
  still reaches clients and nodes: it must stop leading before another is elected),
  ``partition-leader-nodes``, ``partition-node`` (from everyone), ``partition-client-node``;
- degraded links on one site's links or on all: ``loss``, ``delay`` (with jitter), ``rate``,
  ``duplicate-reorder``;
- stalls, SIGSTOP then SIGCONT, longer than the TTL that watches the process:
  ``stall-master``, ``stall-node``, ``stall-client``, ``stall-etcd``;
- the persistent node's disk: ``disk-full`` (a file takes every free block: ENOSPC),
  ``disk-slow`` (the block layer's throttle on its loop device: every write and flush waits),
  ``index-readonly`` (the segment's directory and files made immutable: ``chattr +i``, which
  binds root too).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos.cluster import ChaosCluster
from bench.chaos.links import Impairment
from bench.chaos.topology import OBSERVER, Network, both_ways

PARTITIONS = (
    "partition-leader-etcd",
    "partition-leader-nodes",
    "partition-node",
    "partition-client-node",
)
LINKS = ("loss", "delay", "rate", "duplicate-reorder")
STALLS = ("stall-master", "stall-node", "stall-client", "stall-etcd")
DISKS = ("disk-full", "disk-slow", "index-readonly")
KINDS = (*PARTITIONS, *LINKS, *STALLS, *DISKS)
#: The blkio (cgroup v1) throttle file of the root group: writes to one device.
THROTTLE = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_iops_device")
SLOW_WRITE_IOPS = 8


@dataclass(frozen=True)
class Fault:
    kind: str
    start: float  # seconds from the start of its round
    duration: float
    target: str = ""  # a site name, "leader", "standby", "all" or ""
    params: dict = field(default_factory=dict)

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        where = f" {self.target}" if self.target else ""
        return f"{self.kind}{where}{' ' + extra if extra else ''} for {self.duration:.1f}s"


@dataclass
class Injected:
    fault: Fault
    resolved: str  # the target it hit (the leader's name, ...)
    heal: Callable[[], None]
    at: float  # monotonic time of injection
    pids_stopped: tuple[int, ...] = ()


@dataclass
class Stage:
    """What faults act on."""

    network: Network
    system: ChaosCluster

    def leader(self) -> str:
        assert self.system.cluster is not None
        leader = self.system.cluster.leader()
        return leader.name if leader is not None else "master0"

    def masters(self) -> list[str]:
        return [f"master{i}" for i in range(self.system.layout.masters)]

    def nodes(self) -> list[str]:
        return [f"node{i}" for i in range(self.system.layout.nodes)]

    def clients(self) -> list[str]:
        return [f"client{i}" for i in range(self.system.layout.clients)]

    def sites(self) -> list[str]:
        return [name for name in self.network.sites if name != OBSERVER]

    def resolve(self, target: str) -> str:
        if target == "leader":
            return self.leader()
        if target == "standby":
            leader = self.leader()
            return next(m for m in self.masters() if m != leader)
        return target


def inject(stage: Stage, fault: Fault, fault_id: str, now: float) -> Injected:
    target = stage.resolve(fault.target)
    kind = fault.kind
    network = stage.network

    def cut(pairs: list[tuple[str, str]], impairment: Impairment) -> Injected:
        network.impair(fault_id, pairs, impairment)
        return Injected(fault, target, lambda: network.heal(fault_id), now)

    if kind == "partition-leader-etcd":
        return cut(both_ways([target], ["etcd"]), Impairment(blocked=True))
    if kind == "partition-leader-nodes":
        return cut(both_ways([target], stage.nodes()), Impairment(blocked=True))
    if kind == "partition-node":
        others = [s for s in stage.sites() if s != target]
        return cut(both_ways([target], others), Impairment(blocked=True))
    if kind == "partition-client-node":
        client, node = target.split(":")
        return cut(both_ways([client], [node]), Impairment(blocked=True))
    if kind in LINKS:
        sites = stage.sites()
        if target == "all":
            pairs = [(a, b) for a in sites for b in sites if a != b]
        else:
            pairs = both_ways([target], [s for s in sites if s != target])
        return cut(pairs, link_impairment(kind, fault.params))
    if kind in STALLS:
        pid = stage.system.processes()[target]
        os.kill(pid, signal.SIGSTOP)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

        return Injected(fault, target, resume, now, (pid,))
    if kind in DISKS:
        return inject_disk(stage, fault, now)
    raise ValueError(f"unknown fault kind {kind!r}")


def link_impairment(kind: str, params: dict) -> Impairment:
    if kind == "loss":
        return Impairment(loss=params["loss"])
    if kind == "delay":
        return Impairment(delay_s=params["delay_ms"] / 1000, jitter_s=params["jitter_ms"] / 1000)
    if kind == "rate":
        return Impairment(rate_bps=params["mbit"] * 1e6)
    return Impairment(duplicate=params["duplicate"], reorder=params["reorder"], delay_s=0.001)


def inject_disk(stage: Stage, fault: Fault, now: float) -> Injected:
    disk = stage.system.disk
    assert disk is not None
    if fault.kind == "disk-full":
        if not os.path.ismount(disk.mount):  # (else it fills whatever holds the folder)
            raise RuntimeError(
                f"{disk.mount} is not the loop-mounted file system the disk faults are for "
                "(unmounted meanwhile?): not filling it"
            )
        filler = disk.mount / "filler"
        stats = os.statvfs(disk.mount)
        free = stats.f_bavail * stats.f_frsize
        with filler.open("wb") as out, contextlib.suppress(OSError):  # what fits: full anyway
            os.posix_fallocate(out.fileno(), 0, max(free, 4096))
        # whatever blocks are left (metadata rounding) go to a second file, written
        with (disk.mount / "filler2").open("wb") as out:
            try:
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            except OSError:
                pass

        def unfill() -> None:
            filler.unlink(missing_ok=True)
            (disk.mount / "filler2").unlink(missing_ok=True)

        return Injected(fault, "disk", unfill, now)
    if fault.kind == "disk-slow":
        device = disk.major_minor
        THROTTLE.write_text(f"{device} {SLOW_WRITE_IOPS}\n")
        return Injected(fault, "disk", lambda: THROTTLE.write_text(f"{device} 0\n"), now)
    if fault.kind == "index-readonly":
        segment_dir = disk.mount / "kvpool-nvme"
        _chattr("+i", segment_dir)
        return Injected(fault, "disk", lambda: _chattr("-i", segment_dir), now)
    raise ValueError(fault.kind)


def _chattr(flag: str, directory: Path) -> None:
    """``chattr FLAG`` on the directory's files, then on itself (``+i``) or the other way
    round (``-i``), so that the directory is never immutable while its files are changed."""
    files = [str(p) for p in directory.iterdir() if p.is_file()] if directory.exists() else []
    order = [*files, str(directory)] if flag == "+i" else [str(directory), *files]
    for path in order:
        subprocess.run(["chattr", flag, path], capture_output=True, check=False)
