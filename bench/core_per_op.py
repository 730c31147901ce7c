"""``python -m bench.core_per_op``: the master's CPU per object in this process, layer by
layer, with no socket and no event loop.

``kvpool bench --cpu-per-op`` gives the master process's CPU per put, get and exists: the
lane's frames, TLS, the event loop and the sockets, protobuf, the handlers and the sans-IO
core together. This runs the inner layers alone over the operations of that benchmark (puts
of 32 x 64 KiB, the node recording them; gets of 32; exists of 256 keys without a lease;
forced removals of 1024, the node forgetting them), so that the process's figure splits into
what each layer costs:

- ``core``: ``MasterCore`` (master/core.py around master/state.py) on plain data, as the model
  tests drive it: a clock that moves only when told, one node with one 4 GiB DRAM segment
  that answers every command at once;
- ``handlers``: the same through ``MasterHandlers`` and ``CoreDriver`` as a transport drives
  them: each request parsed from its bytes, the handler (checks, tenant scoping, metrics,
  the core), the answer serialized; the node's commands turned into protobuf and serialized,
  its answers parsed. What the client and the node do (building requests, reading commands,
  writing answers) is not timed.

What the process spends beyond ``handlers`` is the lane (framing, the leader gate, the load
shedder), TLS, asyncio and the system calls. Put is split in steps: ``PutStart``,
``PutEnd`` (to the Persist command it sends the node) and the node's answer (the master
publishes the objects and answers the PutEnd). CPU time of this process
(``time.process_time``) per object (per key for exists), medians of ``--rounds`` rounds of
4096 objects after one untimed; ``--profile`` adds cProfile's top functions over the put
steps of the handler layer. Prints a table and writes ``bench/results/core_per_op.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import pstats
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvpool.common.gc_tuning import tune_for_server
from kvpool.common.status import KeyStatus, Tier
from kvpool.master.config import MasterConfig
from kvpool.master.core import Effects, MasterCore
from kvpool.master.driver import CoreDriver, Pending
from kvpool.master.handlers import MasterHandlers
from kvpool.master.records import Commit, PutOptions, SegmentInfo
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb
from kvpool.security.identity import Identity, Role

HERE = Path(__file__).resolve().parent
KiB = 1024
SIZE = 64 * KiB
BATCH = 32
EXISTS_BATCH = 256
REMOVE_BATCH = 1024
#: Objects per round: 256 MiB of the segment, removed at the round's end.
ROUND = 4096
SEGMENT_SIZE = 4 << 30
LEASE = 1.0
NODE = "bench-node"
CLIENT = "bench-client"
#: Steps, in the table's order: step -> what one unit is.
STEPS = {
    "PutStart": "object",
    "PutEnd": "object",
    "Persist answer": "object",
    "put (the three)": "object",
    "GetReplicas": "object",
    "Exists (256, no lease)": "key",
    "Remove (forced, with Forgets)": "object",
}
PUT_STEPS = ("PutStart", "PutEnd", "Persist answer")


class Clock:
    """A clock that moves only when told (as the model tests')."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Stopwatch:
    """CPU seconds of this process spent in each step."""

    def __init__(self, profiler: cProfile.Profile | None = None) -> None:
        self.spent: dict[str, float] = dict.fromkeys(STEPS, 0.0)
        self.profiler = profiler

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        profile = self.profiler is not None and name in PUT_STEPS
        if profile:
            assert self.profiler is not None
            self.profiler.enable()
        started = time.process_time()
        try:
            yield
        finally:
            self.spent[name] += time.process_time() - started
            if profile:
                assert self.profiler is not None
                self.profiler.disable()


def _segment() -> SegmentInfo:
    return SegmentInfo(
        segment_id=f"{NODE}/dram0",
        node_id=NODE,
        host="bench-host",
        worker_address=b"-" * 64,
        base_address=0x7F00_0000_0000,
        size=SEGMENT_SIZE,
        rkey=b"-" * 32,
        tier=Tier.DRAM,
    )


def _new_core() -> tuple[MasterCore, Clock]:
    clock = Clock()
    state = MasterState(MasterConfig(), clock=clock, rng=random.Random(1))
    core = MasterCore(state)
    core.mount_segment(0, _segment(), [], False, 0.0)
    return core, clock


class CoreLayer:
    """The sans-IO core on plain data; the node answers every command at once."""

    name = "core"

    def __init__(self) -> None:
        self.core, self.clock = _new_core()
        self.ids = itertools.count(1)
        self.stream = object()
        self.core.node_connected(NODE, self.stream, "bench")

    def _answered(self, effects: Effects, call_id: int) -> Any:
        """The answer of ``call_id``, the node answering what the core sent it meanwhile."""
        pending = list(effects.transmit)
        answers = effects.answers
        while pending:
            more = self.core.node_answered(NODE, pending.pop().command_id, True)
            pending += more.transmit
            answers.update(more.answers)
        return answers[call_id]

    def put(self, keys: list[str], watch: Stopwatch) -> None:
        core = self.core
        sizes = [SIZE] * len(keys)
        call = next(self.ids)
        with watch.step("PutStart"):
            slots = core.put_start(call, CLIENT, keys, sizes, PutOptions(replicas=1)).answers[call]
        commits = [Commit(k, s.put_id, (True,)) for k, s in zip(keys, slots, strict=True)]
        call = next(self.ids)
        with watch.step("PutEnd"):
            effects = core.put_end(call, commits)
        with watch.step("Persist answer"):
            statuses = self._answered(effects, call)
        assert all(s is KeyStatus.OK for s in statuses), statuses

    def get(self, keys: list[str], watch: Stopwatch) -> None:
        call = next(self.ids)
        with watch.step("GetReplicas"):
            locations, _ = self.core.get_replicas(call, keys, LEASE, CLIENT).answers[call]
        assert all(loc.status is KeyStatus.OK for loc in locations)

    def exists(self, keys: list[str], watch: Stopwatch) -> None:
        call = next(self.ids)
        with watch.step("Exists (256, no lease)"):
            found = self.core.exists(call, keys, LEASE, False, CLIENT).answers[call]
        assert all(f is KeyStatus.OK for f in found), found

    def remove(self, keys: list[str], watch: Stopwatch) -> None:
        call = next(self.ids)
        with watch.step("Remove (forced, with Forgets)"):
            self._answered(self.core.remove(call, keys, True), call)

    def housekeeping(self) -> None:
        """Time passes (the round's leases end, their space comes back); everyone heartbeats."""
        self.clock.now += LEASE + 0.5
        core = self.core
        core.client_heartbeat(next(self.ids), CLIENT)
        core.heartbeat(next(self.ids), NODE, [f"{NODE}/dram0"])
        core.tick()


class HandlerLayer:
    """The handlers as a transport drives them: bytes in, bytes out (the node's side untimed)."""

    name = "handlers"

    def __init__(self) -> None:
        core, self.clock = _new_core()
        self.driver = CoreDriver(core)
        self.handlers = MasterHandlers(self.driver)
        self.identity = Identity(name=CLIENT, role=Role.CLIENT, tenant="bench")
        self.wire: list[bytes] = []  # the node's commands, as they would be sent
        self.stream = self.driver.node_connected(NODE, "bench", self._write, lambda: None)
        self.answer: bytes | None = None

    def _write(self, command: pb.NodeCommand) -> None:
        self.wire.append(command.SerializeToString())

    def _call(self, method: str, request: bytes) -> bytes | None:
        """The master's part of a call: the answer's bytes, or None while it waits."""
        kind = getattr(pb, f"{method}Request")
        reply = self.handlers.call(method, kind.FromString(request), self.identity)
        if isinstance(reply, Pending):
            reply.then(self._settled)
            return None
        return reply.SerializeToString()

    def _settled(self, response: Any, refused: Any) -> None:
        assert refused is None, refused
        self.answer = response.SerializeToString()

    def _node_reports(self) -> list[bytes]:
        """What the node answers to the commands on the wire (its work: not timed)."""
        reports = []
        for data in self.wire:
            command = pb.NodeCommand.FromString(data)
            result = pb.CommandResult(command_id=command.command_id, ok=True)
            reports.append(pb.NodeReport(result=result).SerializeToString())
        self.wire.clear()
        return reports

    def _reported(self, reports: list[bytes]) -> None:
        """The master's part of the node's answers (which may send more commands)."""
        while reports:
            for data in reports:
                self.driver.node_report(self.stream, pb.NodeReport.FromString(data))
            reports = self._node_reports()

    def put(self, keys: list[str], watch: Stopwatch) -> None:
        request = pb.PutStartRequest(
            client_id=CLIENT, keys=keys, sizes=[SIZE] * len(keys), replicas=1
        ).SerializeToString()
        with watch.step("PutStart"):
            answer = self._call("PutStart", request)
        assert answer is not None
        slots = pb.PutStartResponse.FromString(answer).slots
        end = pb.PutEndRequest(client_id=CLIENT)
        for key, slot in zip(keys, slots, strict=True):
            end.commits.add(key=key, put_id=slot.put_id, replica_ok=[True])
        request = end.SerializeToString()
        self.answer = None
        with watch.step("PutEnd"):
            assert self._call("PutEnd", request) is None  # it waits for the node
        reports = self._node_reports()
        with watch.step("Persist answer"):
            self._reported(reports)
        assert self.answer is not None
        statuses = pb.PutEndResponse.FromString(self.answer).statuses
        assert all(s == KeyStatus.OK for s in statuses), statuses

    def get(self, keys: list[str], watch: Stopwatch) -> None:
        request = pb.GetReplicasRequest(
            client_id=CLIENT, keys=keys, lease_ms=int(LEASE * 1000)
        ).SerializeToString()
        with watch.step("GetReplicas"):
            answer = self._call("GetReplicas", request)
        assert answer is not None
        objects = pb.GetReplicasResponse.FromString(answer).objects
        assert all(o.status == KeyStatus.OK for o in objects)

    def exists(self, keys: list[str], watch: Stopwatch) -> None:
        request = pb.ExistsRequest(client_id=CLIENT, keys=keys, no_lease=True).SerializeToString()
        with watch.step("Exists (256, no lease)"):
            answer = self._call("Exists", request)
        assert answer is not None
        statuses = pb.ExistsResponse.FromString(answer).statuses
        assert all(s == KeyStatus.OK for s in statuses), statuses

    def remove(self, keys: list[str], watch: Stopwatch) -> None:
        request = pb.RemoveRequest(keys=keys, force=True).SerializeToString()
        self.answer = None
        with watch.step("Remove (forced, with Forgets)"):
            answer = self._call("Remove", request)
        if answer is None:  # it waits for the node's Forgets
            reports = self._node_reports()
            with watch.step("Remove (forced, with Forgets)"):
                self._reported(reports)
            assert self.answer is not None

    def housekeeping(self) -> None:
        self.clock.now += LEASE + 0.5
        core = self.driver.core
        assert core is not None
        core.client_heartbeat(0, f"bench/{CLIENT}:{CLIENT}")
        core.heartbeat(0, NODE, [f"{NODE}/dram0"])
        self.driver.tick(None)


def one_round(layer: CoreLayer | HandlerLayer, index: int, watch: Stopwatch) -> None:
    """Puts ``ROUND`` objects in batches of 32, gets them, asks whether they exist (256 keys
    a call), removes them; then time passes."""
    keys = [f"round{index}/{i}" for i in range(ROUND)]
    for i in range(0, ROUND, BATCH):
        layer.put(keys[i : i + BATCH], watch)
    for i in range(0, ROUND, BATCH):
        layer.get(keys[i : i + BATCH], watch)
    for i in range(0, ROUND, EXISTS_BATCH):
        layer.exists(keys[i : i + EXISTS_BATCH], watch)
    for i in range(0, ROUND, REMOVE_BATCH):
        layer.remove(keys[i : i + REMOVE_BATCH], watch)
    layer.housekeeping()


def measure(
    rounds: int = 8, profile: bool = False
) -> tuple[dict[str, dict[str, float]], str | None]:
    """layer -> step -> median CPU microseconds per object (per key for exists), with
    ``beyond core``: the median of each round's difference between the two layers (a core
    round and a handler round run one after the other, so that both see the same machine);
    and, with ``profile``, cProfile's top functions over the handler layer's put steps."""
    tune_for_server()  # as the master runs
    layers: list[CoreLayer | HandlerLayer] = [CoreLayer(), HandlerLayer()]
    per_round: dict[str, dict[str, list[float]]] = {
        name: {step: [] for step in STEPS} for name in ("core", "handlers", "beyond core")
    }
    for layer in layers:
        one_round(layer, 0, Stopwatch())  # untimed: first touches, caches
    for index in range(1, rounds + 1):
        spent = {}
        for layer in layers:
            watch = Stopwatch()
            one_round(layer, index, watch)
            watch.spent["put (the three)"] = sum(watch.spent[s] for s in PUT_STEPS)
            spent[layer.name] = {s: seconds / ROUND * 1e6 for s, seconds in watch.spent.items()}
        spent["beyond core"] = {s: spent["handlers"][s] - spent["core"][s] for s in STEPS}
        for name, steps in spent.items():
            for step, value in steps.items():
                per_round[name][step].append(value)
    results = {
        name: {step: statistics.median(values) for step, values in steps.items()}
        for name, steps in per_round.items()
    }
    profiled = None
    if profile:  # (after the timed rounds: cProfile slows down what it sees)
        profiler = cProfile.Profile()
        for index in range(rounds + 1, rounds + 3):
            one_round(layers[1], index, Stopwatch(profiler))
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        profiled = text.getvalue()
    return results, profiled


def print_table(results: dict[str, dict[str, float]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="the master's CPU per object, in process (µs; medians of rounds)")
    table.add_column("step")
    table.add_column("core", justify="right")
    table.add_column("handlers + protobuf", justify="right")
    table.add_column("beyond the core (paired)", justify="right")
    for step, unit in STEPS.items():
        cells = (results[name][step] for name in ("core", "handlers", "beyond core"))
        table.add_row(f"{step} (per {unit})", *(f"{value:.2f}" for value in cells))
    Console(width=max(Console().width, 110)).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds (default 8)")
    parser.add_argument("--profile", action="store_true", help="cProfile the put steps too")
    parser.add_argument("--json", default=str(HERE / "results" / "core_per_op.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    results, profiled = measure(args.rounds, args.profile)
    print_table(results)
    if profiled:
        print("cProfile, the handler layer's put steps, by own time:")
        print(profiled)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rounds": args.rounds, "us_per_object": results}, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
