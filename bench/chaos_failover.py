"""Failover under load: kill the leading master with SIGKILL, again and again, and count.

``python -m bench.chaos_failover [--rounds 3] [--masters 3] [--nodes 2] [--no-mapping]``
starts a real etcd, several masters electing a leader through it, storage nodes, and a client
that puts (two replicas) and reads back without pause. Each round kills the leader and measures
how long until a new one is elected and until the load is served again; then every object
published before the kill is read back. Prints a table: failover times, objects lost, wrong bytes.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from dataclasses import dataclass

from kvpool.errors import KVPoolError


@dataclass
class Round:
    killed: str
    elected_s: float
    served_s: float
    published_before: int
    lost: int
    wrong_bytes: int
    errors: int


class Load:
    """A client putting and reading back, recording what it published and what it read."""

    def __init__(self, master: str) -> None:
        self.master = master
        self.published: dict[str, bytes] = {}
        self.wrong: list[str] = []
        self.errors = 0
        self.successes: list[float] = []  # when operations begun after `mark` ended
        self.mark = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        from kvpool import Client

        with Client(self.master, timeout=30) as client:
            i = 0
            while not self._stop.is_set():
                key, value = f"chaos-{i}", os.urandom(4096 + i % 60_000)
                started = time.monotonic()
                try:
                    client.put(key, value, replicas=2)
                    self.published[key] = value
                    probe = f"chaos-{max(0, i - 7)}"
                    if probe in self.published and client.get(probe) != self.published[probe]:
                        self.wrong.append(probe)
                    if self.mark and started > self.mark:
                        self.successes.append(time.monotonic())
                except KVPoolError:
                    self.errors += 1
                i += 1


def run_round(cluster, load: Load) -> Round:
    from kvpool import Client

    time.sleep(1.0)
    before = dict(load.published)
    errors_before = load.errors
    leader = cluster.leader()
    killed_at = time.monotonic()
    load.mark = killed_at
    leader.kill()
    new = cluster.wait_for_leader(timeout=30)
    elected = time.monotonic() - killed_at
    deadline = time.monotonic() + 60
    while not load.successes and time.monotonic() < deadline:
        time.sleep(0.02)
    served = (load.successes[0] - killed_at) if load.successes else float("inf")
    load.successes.clear()
    load.mark = 0.0
    with Client(cluster.master_address, timeout=30) as client:
        results = client.get_many(list(before))
    lost = sum(1 for r in results if isinstance(r, Exception))
    wrong = sum(
        1 for r, v in zip(results, before.values(), strict=True) if isinstance(r, bytes) and r != v
    )
    leader.restart()  # it rejoins as a standby
    del new
    return Round(
        leader.name, elected, served, len(before), lost, wrong, load.errors - errors_before
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument(
        "--no-mapping",
        action="store_true",
        help="clients do not map the nodes' memory (every write on the checked stream, under "
        "a capability carrying the master's term): a new leader fences from the nodes' last "
        "contact, not from its election",
    )
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from kvpool.etcd_process import EtcdProcess
    from kvpool.local_cluster import LocalCluster

    rounds = []
    with (
        EtcdProcess() as etcd,
        LocalCluster(
            args.nodes,
            "256MiB",
            masters=args.masters,
            etcd=etcd.endpoint,
            same_host=not args.no_mapping,
        ) as cluster,
    ):
        cluster.export_client_env()
        load = Load(cluster.master_address)
        load.start()
        try:
            for _ in range(args.rounds):
                rounds.append(run_round(cluster, load))
        finally:
            load.stop()
    table = Table(title="kvpool failover under load (SIGKILL of the leader; etcd lease 2 s)")
    for column in ("round", "killed", "new leader", "load served", "objects", "lost", "wrong"):
        table.add_column(column, justify="right")
    for i, r in enumerate(rounds, 1):
        table.add_row(
            str(i),
            r.killed,
            f"{r.elected_s:.2f} s",
            f"{r.served_s:.2f} s",
            str(r.published_before),
            str(r.lost),
            str(r.wrong_bytes),
        )
    Console().print(table)
    wrong_total = len(load.wrong) + sum(r.wrong_bytes for r in rounds)
    print(
        f"wrong bytes returned during the whole run: {wrong_total}; "
        f"objects lost: {sum(r.lost for r in rounds)}"
    )
    return 1 if wrong_total or any(r.lost for r in rounds) else 0


if __name__ == "__main__":
    raise SystemExit(main())
