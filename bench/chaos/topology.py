"""The suite's network: one network namespace per process, all joined by the switch.

Every site (``etcd``, ``master0``, ``node1``, ``client0``...) gets a namespace named
``kvc-<pid>-<site>`` (``kvc-`` so as not to clash with the benchmark's ``kvpool-`` ones) with
one TUN device of the switch and one address of ``10.89.K.0/24`` (K from the pid, so that two
runs at once do not share a subnet). The ``observer`` site is this process's own namespace:
the checker reads every process from there, over a link no fault touches, as Jepsen's
control node does. Namespaces are removed on exit, and ones of runs that died are removed on
the next start. Needs root.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import netns
from bench.chaos.links import Impairment
from kvpool.local_cluster import Site, _die_with_parent

PREFIX = "kvc-"
OBSERVER = "observer"
#: Seconds the switch has to answer a command.
SWITCH_DEADLINE = 10.0


class NetworkError(RuntimeError):
    pass


def subnet_of(pid: int) -> str:
    return f"10.89.{pid % 250}"


@dataclass
class Network:
    """The namespaces and the switch; ``Network.create(sites, seed)``, then ``close()``."""

    sites: dict[str, str]  # name -> address
    namespaces: dict[str, str]  # name -> namespace (not the observer)
    switch: subprocess.Popen
    _lock: threading.Lock
    devices: dict[str, str]  # name -> its TUN device (the observer's is in this namespace)

    @staticmethod
    def create(names: Sequence[str], seed: int) -> Network:
        if os.geteuid() != 0:
            raise NetworkError("network namespaces need root")
        netns.remove_stale_owned(PREFIX)
        pid = os.getpid()
        net = subnet_of(pid)
        all_names = [OBSERVER, *names]
        sites = {name: f"{net}.{i + 1}" for i, name in enumerate(all_names)}
        devices = {name: f"kvc{pid % 100000}t{i}" for i, name in enumerate(all_names)}
        namespaces = {name: f"{PREFIX}{pid}-{name}" for name in names}
        config = {"sites": sites, "devices": devices, "seed": seed}
        switch = subprocess.Popen(
            [sys.executable, "-m", "bench.chaos.switch", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        network = Network(sites, namespaces, switch, threading.Lock(), devices)
        try:
            assert switch.stdout is not None
            if '"ready"' not in switch.stdout.readline():
                raise NetworkError("the switch did not start (is /dev/net/tun there?)")
            for name in all_names:
                network._configure(name, devices[name], f"{net}.0/24")
        except BaseException:
            network.close()
            raise
        return network

    def _configure(self, name: str, device: str, subnet: str) -> None:
        address = self.sites[name]
        if name == OBSERVER:
            scope: tuple[str, ...] = ()
        else:
            namespace = self.namespaces[name]
            netns.ip("netns", "add", namespace)
            netns.ip("link", "set", device, "netns", namespace)
            scope = ("-n", namespace)
            netns.ip(*scope, "link", "set", "lo", "up")
        netns.ip(*scope, "link", "set", device, "mtu", "65000", "up")
        netns.ip(*scope, "addr", "add", f"{address}/32", "dev", device)
        netns.ip(*scope, "route", "add", subnet, "dev", device)

    def site(self, name: str) -> Site:
        """Where the process ``name`` runs (its namespace and address)."""
        return Site(self.sites[name], netns.enter_prefix(self.namespaces[name]))

    def prefix(self, name: str) -> tuple[str, ...]:
        return netns.enter_prefix(self.namespaces[name])

    # ---- faults on links

    def _call(self, request: dict) -> dict:
        with self._lock:
            assert self.switch.stdin is not None and self.switch.stdout is not None
            if self.switch.poll() is not None:
                raise NetworkError(f"the switch exited with {self.switch.returncode}")
            self.switch.stdin.write(json.dumps(request) + "\n")
            self.switch.stdin.flush()
            ready, _, _ = select.select([self.switch.stdout], [], [], SWITCH_DEADLINE)
            if not ready:
                raise NetworkError(f"the switch did not answer {request} in time")
            answer = json.loads(self.switch.stdout.readline())
        if not answer.get("ok"):
            raise NetworkError(f"the switch refused {request}: {answer}")
        return answer

    def impair(
        self, fault_id: str, pairs: Iterable[tuple[str, str]], impairment: Impairment
    ) -> None:
        raw = {k: v for k, v in impairment.__dict__.items()}
        self._call({"op": "add", "id": fault_id, "pairs": list(pairs), "impairment": raw})

    def heal(self, fault_id: str) -> None:
        self._call({"op": "remove", "id": fault_id})

    def heal_all(self) -> None:
        self._call({"op": "clear"})

    def stats(self) -> dict:
        return self._call({"op": "stats"})

    def close(self) -> None:
        """Removes the namespaces and stops the switch (its devices go with it)."""
        for namespace in self.namespaces.values():
            netns.delete_namespace(namespace)
        if self.switch.poll() is None:
            assert self.switch.stdin is not None
            self.switch.stdin.close()
            try:
                self.switch.wait(5)
            except subprocess.TimeoutExpired:
                self.switch.kill()
                self.switch.wait()


def both_ways(groups_a: Iterable[str], groups_b: Iterable[str]) -> list[tuple[str, str]]:
    """Every directed pair between two groups of sites (a partition cuts both directions)."""
    a, b = list(groups_a), list(groups_b)
    return [(x, y) for x in a for y in b if x != y] + [(y, x) for x in a for y in b if x != y]


def missing_prerequisite() -> str:
    if os.geteuid() != 0:
        return "the chaos suite needs root (network namespaces, a loop device, SIGSTOP of others)"
    if not os.path.exists("/dev/net/tun"):
        return "the chaos suite needs /dev/net/tun (its switch joins the namespaces)"
    for tool in ("ip", "losetup", "mkfs.ext4", "chattr", "mount"):
        if shutil.which(tool) is None:
            return f"the chaos suite needs {tool}"
    return ""
