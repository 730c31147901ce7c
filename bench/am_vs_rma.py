"""``python -m bench.am_vs_rma``: is the checked data path as fast as one-sided RMA?

Two bare processes, a node-like target with a registered 1 GiB segment and a client, per
placement: ``same-host`` (UCX's default transports: shared memory, CMA), ``tcp`` (the same
host, ``UCX_TLS=tcp``) and, as root with ``--netns``, ``netns`` (two network namespaces over
a veth pair, TCP). For each, today's path (one-sided RMA put/get, ``ucp.Worker.transfer``)
against the checked one (an active-message request carrying a capability, checked by the
target before rendezvous moves the bytes: ``ucp_am``), in variants that try UCX's
thresholds and schemes. The target of an ``am`` variant has no RMA feature, as a secure node
would not. Workloads: 8 x 32 MiB, 32 x 4 MiB (one transfer each), 4 batches of 32 x 1 MiB,
batches of 32 x 4 KiB (median microseconds per batch), and, with ``--clients N``, N client
processes of 16 x 4 MiB each, started together (aggregate GB/s).

Variants run in turn, ``--rounds`` times, each workload's best kept. Prints a table and
writes bench/results/am_vs_rma.json. Each role also runs as ``am_vs_rma.py ROLE CONFIG``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEGMENT = 1 << 30
SEGMENT_ID = "bench-node/dram-0"
KEY_ID = 1
KEY = bytes(range(32))
MiB = 1 << 20

#: name -> (target UCX settings, client UCX settings, path, options)
VARIANTS: dict[str, dict] = {
    "rma": {"path": "rma"},
    "am": {"path": "am"},
    "am thresh 16k": {"path": "am", "put_thresh": 16 * 1024, "get_thresh": 16 * 1024},
    "am thresh 256k": {"path": "am", "put_thresh": 256 * 1024, "get_thresh": 256 * 1024},
    "am rndv put_zcopy": {"path": "am", "ucx": {"RNDV_SCHEME": "put_zcopy"}},
    "am rndv get_zcopy": {"path": "am", "ucx": {"RNDV_SCHEME": "get_zcopy"}},
    "am node TCP_PUT_ENABLE=n": {"path": "am", "target_ucx": {"TCP_PUT_ENABLE": "n"}},
}
DEFAULT_VARIANTS = ["rma", "am", "am thresh 16k", "am node TCP_PUT_ENABLE=n"]


def _publish(path: str, info: dict) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(path)


def _ucx(config: dict, side: str) -> dict:
    settings = {"TLS": "tcp"} if config["tcp_only"] else {}
    settings.update(config["variant"].get("ucx", {}))
    settings.update(config["variant"].get(f"{side}_ucx", {}))
    return settings


# ---------------------------------------------------------------- roles (each a process)


def _target(config: dict) -> None:
    import mmap

    from kvpool.security import capabilities
    from kvpool.transport import ucp, ucp_am

    am = config["variant"]["path"] == "am"
    context = ucp.Context(_ucx(config, "target"), rma=not am, active_messages=am)
    worker = context.create_worker()
    memory = mmap.mmap(-1, SEGMENT)
    memory.write(b"\1" * SEGMENT)  # faults every page in
    region = context.register(memory)
    server = None
    if am:
        server = ucp_am.AmServer(
            worker,
            rndv_threshold=config["variant"].get("get_thresh", ucp_am.DEFAULT_RNDV_THRESHOLD),
        )
        server.set_key(KEY_ID, KEY)
        server.set_policy(max_skew_ms=1000, min_term=1)
        server.add_segment(capabilities.segment_digest(SEGMENT_ID), region)
    progress = ucp.ProgressThread(worker)
    progress.start()
    _publish(
        config["file"],
        {"worker": worker.address.hex(), "rkey": region.rkey.hex(), "base": region.address},
    )
    sys.stdin.read()  # until the orchestrator closes our stdin
    progress.stop()
    if server is not None:
        counters = server.counters()
        if counters.refusals:
            print(f"refusals: {counters.refusals}", file=sys.stderr)


class _Runner:
    """The client's side of one variant: one call moves a list of (offset, length) pieces."""

    def __init__(self, config: dict, target: dict) -> None:
        import numpy as np

        from kvpool.security import capabilities
        from kvpool.transport import ucp, ucp_am

        self.ucp, self.ucp_am, self.caps = ucp, ucp_am, capabilities
        self.am = config["variant"]["path"] == "am"
        self.put_thresh = config["variant"].get("put_thresh", ucp_am.DEFAULT_RNDV_THRESHOLD)
        self.context = ucp.Context(_ucx(config, "client"), rma=not self.am, active_messages=self.am)
        self.worker = self.context.create_worker()
        self.local = np.full(64 * MiB, 7, dtype=np.uint8)
        self.region = self.context.register(self.local)
        self.endpoint = self.worker.connect(bytes.fromhex(target["worker"]))
        self.base = target["base"]
        self.rkey = None if self.am else self.endpoint.unpack_rkey(bytes.fromhex(target["rkey"]))
        self.client = ucp_am.AmClient(self.worker) if self.am else None
        self.ring = capabilities.KeyRing([(KEY_ID, KEY)], current=KEY_ID)
        self._caps: dict[tuple[int, int, bool], bytes] = {}

    def capability(self, offset: int, length: int, is_get: bool) -> bytes:
        """Granted before the clock runs: the master grants them, off the data path."""
        key = (offset, length, is_get)
        if key not in self._caps:
            rights = self.caps.Rights.READ if is_get else self.caps.Rights.WRITE
            self._caps[key] = self.ring.grant(
                segment_id=SEGMENT_ID,
                offset=offset,
                length=length,
                rights=rights,
                expiry_ms=int(time.time() * 1000) + 3_600_000,
                term=1,
                tenant="bench",
            )
        return self._caps[key]

    def prepare(self, pieces: list[tuple[int, int]], is_get: bool) -> list:
        local = self.region.address
        ops = []
        for i, (offset, length) in enumerate(pieces):
            at = local + (i * length) % (self.local.nbytes - length + 1)
            if self.am:
                ops.append(
                    self.ucp_am.AmOp(
                        self.endpoint,
                        at,
                        length,
                        offset,
                        self.capability(offset, length, is_get),
                        self.region.memh,
                    )
                )
            else:
                ops.append(
                    self.ucp.Op(
                        self.endpoint, self.rkey, at, self.base + offset, length, self.region.memh
                    )
                )
        return ops

    def run(self, ops: list, is_get: bool) -> None:
        if self.am:
            statuses = self.client.transfer(
                ops, is_get=is_get, timeout=60, rndv_threshold=self.put_thresh
            )
        else:
            statuses = self.worker.transfer(ops, is_get=is_get, timeout=60)
        bad = [s for s in statuses if s != 0]
        if bad:
            describe = self.ucp_am.describe if self.am else self.ucp.status_string
            raise RuntimeError(f"transfer failed: {describe(bad[0])}")


def _throughput(runner: _Runner, size: int, count: int, batch: int) -> dict[str, float]:
    results = {}
    for is_get in (False, True):
        calls = [
            runner.prepare([((c * batch + i) * size, size) for i in range(batch)], is_get)
            for c in range(count)
        ]
        runner.run(calls[0], is_get)  # warm: connects, registers
        start = time.perf_counter()
        for ops in calls:
            runner.run(ops, is_get)
        elapsed = time.perf_counter() - start
        results["get" if is_get else "put"] = count * batch * size / elapsed / 1e9
    return results


def _latency(runner: _Runner, size: int, batch: int, count: int) -> dict[str, float]:
    results = {}
    for is_get in (False, True):
        ops = runner.prepare([(i * size, size) for i in range(batch)], is_get)
        for _ in range(20):
            runner.run(ops, is_get)
        times = []
        for _ in range(count):
            start = time.perf_counter()
            runner.run(ops, is_get)
            times.append(time.perf_counter() - start)
        results["get" if is_get else "put"] = statistics.median(times) * 1e6
    return results


def _client(config: dict) -> dict:
    target = json.loads(Path(config["file"]).read_text())
    runner = _Runner(config, target)
    if config.get("start_at"):
        # N clients together: all put, wait for one another (files in the run's folder),
        # then all get; each phase's aggregate is timed from its first start to its last end
        runner.run(runner.prepare([(0, 4 * MiB)], False), False)  # connect before the start
        time.sleep(max(0.0, config["start_at"] - time.time()))
        offset = config["client_index"] * 16 * 4 * MiB
        times = {}
        for is_get in (False, True):
            begin = time.time()
            for i in range(16):
                runner.run(runner.prepare([(offset + i * 4 * MiB, 4 * MiB)], is_get), is_get)
            times["get" if is_get else "put"] = (begin, time.time())
            if not is_get:
                folder = Path(config["file"]).parent
                (folder / f"put-done-{config['client_index']}").touch()
                while len(list(folder.glob("put-done-*"))) < config["clients"]:
                    time.sleep(0.001)
        return times
    results: dict[str, dict[str, float]] = {}
    results["32 MiB"] = _throughput(runner, 32 * MiB, 8, 1)
    results["4 MiB"] = _throughput(runner, 4 * MiB, 32, 1)
    results["32 x 1 MiB"] = _throughput(runner, MiB, 4, 32)
    results["32 x 4 KiB (us)"] = _latency(runner, 4096, 32, config.get("latency_batches", 200))
    return results


# ---------------------------------------------------------------- orchestration


def _spawn(prefix: tuple[str, ...], role: str, config: dict, **kwargs) -> subprocess.Popen:
    argv = [*prefix, sys.executable, str(Path(__file__)), role, json.dumps(config)]
    return subprocess.Popen(argv, cwd=HERE.parent, **kwargs)


def _one(placement, variant_name: str, clients: int, latency_batches: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        config = {
            "file": str(Path(tmp) / "target.json"),
            "tcp_only": placement.tcp_only or placement.name == "tcp",
            "variant": VARIANTS[variant_name],
            "latency_batches": latency_batches,
        }
        target = _spawn(placement.server_prefix, "target", config, stdin=subprocess.PIPE)
        try:
            deadline = time.time() + 60
            while not Path(config["file"]).exists():
                if time.time() > deadline or target.poll() is not None:
                    raise RuntimeError(f"target of {variant_name!r} did not start")
                time.sleep(0.05)
            client = _spawn(placement.client_prefix, "client", config, stdout=subprocess.PIPE)
            out, _ = client.communicate(timeout=900)
            if client.returncode != 0:
                raise RuntimeError(f"client of {variant_name!r} failed")
            results = json.loads(out.splitlines()[-1])
            if clients > 1:
                start_at = time.time() + 3
                procs = [
                    _spawn(
                        placement.client_prefix,
                        "client",
                        {**config, "start_at": start_at, "client_index": i, "clients": clients},
                        stdout=subprocess.PIPE,
                    )
                    for i in range(clients)
                ]
                times = [json.loads(p.communicate(timeout=900)[0].splitlines()[-1]) for p in procs]
                total = clients * 16 * 4 * MiB
                results[f"{clients} clients x 4 MiB"] = {
                    op: total / (max(t[op][1] for t in times) - min(t[op][0] for t in times)) / 1e9
                    for op in ("put", "get")
                }
            return results
        finally:
            target.stdin.close()
            try:
                target.wait(timeout=30)
            except subprocess.TimeoutExpired:
                target.kill()
            if target.returncode not in (0, None):
                raise RuntimeError(f"target of {variant_name!r} exited with {target.returncode}")


def _best(runs: list[dict]) -> dict:
    best: dict[str, dict[str, float]] = {}
    for run in runs:
        for workload, values in run.items():
            for op, value in values.items():
                slot = best.setdefault(workload, {})
                better = min if workload.endswith("(us)") else max
                slot[op] = better(slot.get(op, value), value)
    return best


def _table(results: dict[str, dict[str, dict]]) -> str:
    lines = []
    for placement, variants in results.items():
        base = variants.get("rma", {})
        lines.append(f"\n{placement}")
        lines.append("| variant | workload | put | get | put vs rma | get vs rma |")
        lines.append("|---|---|---|---|---|---|")
        for name, workloads in variants.items():
            for workload, values in workloads.items():
                unit = "us" if workload.endswith("(us)") else "GB/s"
                ratios = []
                for op in ("put", "get"):
                    ref = base.get(workload, {}).get(op)
                    if ref is None or name == "rma":
                        ratios.append("")
                    elif unit == "us":
                        ratios.append(f"{ref / values[op]:.2f}x")
                    else:
                        ratios.append(f"{values[op] / ref:.2f}x")
                lines.append(
                    f"| {name} | {workload} | {values['put']:.2f} {unit} | "
                    f"{values['get']:.2f} {unit} | {ratios[0]} | {ratios[1]} |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from bench import netns

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--placements", default="same-host,tcp", help="same-host,tcp,netns")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=", ".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=0)
    parser.add_argument("--latency-batches", type=int, default=200)
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for name in variants:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}")
    results: dict[str, dict[str, dict]] = {}
    for placement_name in args.placements.split(","):

        def measure(placement) -> None:
            runs: dict[str, list[dict]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name in variants:
                    runs[name].append(_one(placement, name, args.clients, args.latency_batches))
                    print(f"{placement.name} / {name}: {runs[name][-1]}", file=sys.stderr)
            results[placement.name] = {name: _best(r) for name, r in runs.items()}

        if placement_name == "netns":
            with netns.veth_pair() as placement:
                measure(placement)
        else:
            base = netns.same_host()
            measure(
                base
                if placement_name == "same-host"
                else base.__class__(
                    "tcp", base.server_ip, base.client_ip, description="loopback, UCX_TLS=tcp"
                )
            )
    print(_table(results))
    out = HERE / "results" / "am_vs_rma.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("target", "client"):
        config = json.loads(sys.argv[2])
        if sys.argv[1] == "target":
            _target(config)
        else:
            print(json.dumps(_client(config)))
    else:
        sys.exit(main())
