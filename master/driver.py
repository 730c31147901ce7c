"""Carries out what the core decides, on one asyncio event loop: the only glue between the
sans-IO core (core.py) and the transports (gRPC in service.py, the lane in lane_server.py).

It writes the core's commands on the nodes' open streams, hands each answer to the call that
waits for it, and wakes the core when a timer of its falls due. It keeps no rule of its own:
which commands go where, what waits for what and for how long are the core's.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from kvpool.common.logging import get_logger
from kvpool.master import metrics
from kvpool.master.commands_pb import command_to_pb
from kvpool.master.core import Effects, MasterCore
from kvpool.master.node_processes import Attached, NodeProcesses, incarnation_problem
from kvpool.master.records import CopyCommand, TickReport
from kvpool.proto import master_pb2 as pb

if TYPE_CHECKING:
    from kvpool.master.record_writer import RecordWriter

log = get_logger("kvpool.master")

#: Why a call whose answer relies on a tombstone record is refused when it could not be kept.
NOT_DURABLE = (
    "this master could not record what its answer relies on (in etcd: it may be losing "
    "leadership; or in its --tombstone-file): retry"
)


class CallRefused(Exception):
    """A call ends with this status instead of an answer (either transport says it its way)."""

    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self.code = code  # a grpc.StatusCode
        self.details = details


class Pending:
    """The answer of a call that waits: ``then(callback)`` gets (response, None) or (None,
    CallRefused) once the core answers; ``outcome()`` is the same for a coroutine.
    ``when_settled(hook)`` runs ``hook()`` then too, before the callback, whoever waits.
    """

    __slots__ = ("_callback", "_finish", "_hooks", "_outcome", "prepare")

    def __init__(
        self, finish: Callable[[Any], Any], prepare: Callable[[Any], None] | None = None
    ) -> None:
        self._finish = finish
        #: Run with the answer as soon as the core gives it (``CoreDriver.call``).
        self.prepare = prepare
        self._callback: Callable[[Any, CallRefused | None], None] | None = None
        self._outcome: tuple[Any, CallRefused | None] | None = None
        self._hooks: list[Callable[[], None]] = []

    def when_settled(self, hook: Callable[[], None]) -> None:
        if self._outcome is not None:
            hook()
        else:
            self._hooks.append(hook)

    def then(self, callback: Callable[[Any, CallRefused | None], None]) -> None:
        if self._outcome is not None:
            callback(*self._outcome)
        else:
            self._callback = callback

    async def outcome(self) -> tuple[Any, CallRefused | None]:
        """(response, None) or (None, the refusal), once settled. (Not raised: a refusal
        raised out of a future keeps the waiting frame in a reference cycle, and with it
        whatever the call held, until the collector's next full pass.)"""
        future: asyncio.Future[tuple[Any, CallRefused | None]]
        future = asyncio.get_running_loop().create_future()

        def settle(response: Any, refused: CallRefused | None) -> None:
            if not future.done():  # (else the caller went away)
                future.set_result((response, refused))

        self.then(settle)
        return await future

    def resolve(self, answer: Any) -> None:
        try:
            outcome: tuple[Any, CallRefused | None] = (self._finish(answer), None)
        except CallRefused as refused:
            # (kept without its traceback, which holds this frame: a cycle through outcome)
            outcome = (None, refused.with_traceback(None))
        self._settle(outcome)

    def refuse(self, refused: CallRefused) -> None:
        self._settle((None, refused))

    def _settle(self, outcome: tuple[Any, CallRefused | None]) -> None:
        self._outcome = outcome
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()
        if self._callback is not None:
            self._callback(*outcome)


class NodeStream:
    """One open command stream of a node, as a transport offers it: ``write`` sends a command
    at once, ``close`` ends the stream (the node reconnects to whoever leads)."""

    __slots__ = ("attached", "close", "core", "node_id", "write")

    def __init__(
        self,
        node_id: str,
        core: MasterCore,
        write: Callable[[pb.NodeCommand], None],
        close: Callable[[], None],
        attached: Attached,
    ) -> None:
        self.node_id = node_id
        self.core = core
        self.write = write
        self.close = close
        self.attached = attached


_NO_ANSWER = object()


def check_incarnation(incarnation: str) -> None:
    """CallRefused (INVALID_ARGUMENT) for a node process id no node makes."""
    if (problem := incarnation_problem(incarnation)) is not None:
        raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT, problem)


class CoreDriver:
    def __init__(self, core: MasterCore | None) -> None:
        """``core`` is None on a standby (the leader gate turns every call away)."""
        self.core = core
        self._streams: dict[str, NodeStream] = {}
        self._waiting: dict[int, Pending] = {}
        self._call_ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.processes = NodeProcesses(core.state.config.node_ttl if core is not None else 0.0)
        #: Where tombstone records the next master needs are written: etcd, with several
        #: masters; a file (--tombstone-file) or None for a master that runs alone.
        self.durable: RecordWriter | None = None
        #: Grants the READ capability of a copy from another node's checked stream (set
        #: where this master holds capability keys), minted as the command goes out.
        self.copy_grant: Callable[[CopyCommand], bytes] | None = None
        #: When the capabilities for a segment's space end (``Handlers.grants_end_ms``), for
        #: Forgets; None: this master grants none.
        self.grants_end_ms: Callable[[str], tuple[int, int]] | None = None

    def client_refusal(self) -> str | None:
        """Why the core turns clients away now (``MasterCore.client_refusal``), or None."""
        return None if self.core is None else self.core.client_refusal()

    def step_down_reason(self) -> str | None:
        """Why this leader should hand its term on (``MasterCore.step_down_reason``)."""
        return None if self.core is None else self.core.step_down_reason()

    def call(
        self,
        event: Callable[[int], Effects],
        finish: Callable[[Any], Any],
        prepare: Callable[[Any], None] | None = None,
    ) -> Any:
        """Runs one event of the core for a call: returns ``finish(answer)`` when the core
        answers at once, else a ``Pending`` that resolves when it does. ``prepare(answer)``
        runs as soon as the core gives the answer, before the commands of that event go out
        (and so before any later one's): ``finish`` may run later, once tombstone records
        are written. (Capabilities are noted then: a Forget says when they end.)"""
        call_id = next(self._call_ids)
        effects = event(call_id)
        if self._after_records(effects):
            pending = self._waiting[call_id] = Pending(finish, prepare)
            self.carry_out(effects)
            return pending
        answer = effects.answers.pop(call_id, _NO_ANSWER)
        if answer is _NO_ANSWER:
            pending = self._waiting[call_id] = Pending(finish, prepare)
            self.carry_out(effects)
            return pending
        if prepare is not None:
            prepare(answer)
        self.carry_out(effects)
        return finish(answer)

    def carry_out(self, effects: Effects) -> None:
        if effects.answers and self._waiting:
            waiting = self._waiting
            for call_id, answer in effects.answers.items():
                pending = waiting.get(call_id)
                if pending is not None and pending.prepare is not None:
                    pending.prepare(answer)
                    pending.prepare = None
        if effects.transmit:
            streams = self._streams
            for command in effects.transmit:
                stream = streams.get(command.node_id)
                if stream is not None:  # (the core transmits only to open streams)
                    stream.write(command_to_pb(command, self.copy_grant, self.grants_end_ms))
        if self._after_records(effects):
            assert self.durable is not None
            answers = effects.answers
            self.durable.write(effects.durable, lambda ok: self._answer(answers, ok))
        elif effects.answers:
            self._answer(effects.answers, True)
        for event, fields in effects.notes:
            log.warning(event, **fields)
        self._arm_timer()

    def _after_records(self, effects: Effects) -> bool:
        """Whether ``effects``' answers go out only once tombstone records are written:
        those they carry, or one under way (an answer may rely on it)."""
        return self.durable is not None and bool(effects.durable or self.durable.busy)

    def _answer(self, answers: dict[int, Any], ok: bool) -> None:
        """Sends ``answers``; refused instead when what they rely on could not be made
        durable (the caller retries, at whichever master leads then)."""
        for call_id, answer in answers.items():
            pending = self._waiting.pop(call_id, None)
            if pending is None:
                continue
            if ok:
                pending.resolve(answer)
            else:
                pending.refuse(CallRefused(grpc.StatusCode.UNAVAILABLE, NOT_DURABLE))

    # ---- nodes' command streams

    def node_connected(
        self,
        node_id: str,
        incarnation: str,
        write: Callable[[pb.NodeCommand], None],
        close: Callable[[], None],
        peer: str = "?",
    ) -> NodeStream:
        """A node opened its command stream; CallRefused when this master is not serving,
        does not know the node (it has mounted nothing here), or another live process of the
        node holds its stream."""
        core = self.core
        if core is None:
            raise CallRefused(grpc.StatusCode.UNAVAILABLE, "this master is not serving: retry")
        check_incarnation(incarnation)
        if node_id not in core.state.nodes:  # (bounds what a peer can make the core remember)
            raise CallRefused(
                grpc.StatusCode.UNAVAILABLE,
                f"node {node_id!r} has mounted no segment here: mount one, then open the stream",
            )
        held = self._streams.get(node_id)
        if held is not None:
            self.processes.node_ttl = core.state.config.node_ttl
            refusal = self.processes.refusal(node_id, incarnation, held.attached, core.clock())
            if refusal is not None:
                raise CallRefused(grpc.StatusCode.FAILED_PRECONDITION, refusal)
            held.close()  # (its process is gone, or reconnects on this new stream)
        attached = Attached(incarnation, peer)
        stream = self._streams[node_id] = NodeStream(node_id, core, write, close, attached)
        self.carry_out(core.node_connected(node_id, stream, incarnation))
        return stream

    def process_refusal(self, node_id: str, incarnation: str) -> str | None:
        """Why process ``incarnation`` may not act for node ``node_id`` (mount segments):
        another live process of the node holds its command stream. None when it may."""
        check_incarnation(incarnation)
        core = self.core
        held = self._streams.get(node_id)
        if core is None or held is None or not incarnation:
            return None
        self.processes.node_ttl = core.state.config.node_ttl
        return self.processes.refusal(node_id, incarnation, held.attached, core.clock())

    def node_report(self, stream: NodeStream, report: pb.NodeReport) -> bool:
        """Applies a node's report; False once the stream's term has ended (ids start afresh
        each term, so its answers must change nothing)."""
        core = self.core
        if stream.core is not core or core is None:
            return False
        if report.HasField("result"):
            metrics.labelled(metrics.REQUESTS, "NodeResult").inc()
            result = report.result
            if not result.ok and result.error:
                log.warning("a node command failed", node_id=stream.node_id, error=result.error)
            self.carry_out(
                core.node_answered(
                    stream.node_id,
                    result.command_id,
                    result.ok,
                    result.crc32c,
                    source_corrupt=result.source_corrupt,
                    error=result.error,
                )
            )
        return True

    def node_disconnected(self, stream: NodeStream) -> None:
        if self._streams.get(stream.node_id) is stream:
            del self._streams[stream.node_id]
        if stream.core is self.core:
            stream.core.node_disconnected(stream.node_id, stream)

    # ---- time and terms

    def tick(self, step: int | None, late_by: float = 0.0) -> TickReport | None:
        if self.core is None:
            return None
        report, effects = self.core.tick(step, late_by=late_by)
        self.carry_out(effects)
        return report

    def reset(self, core: MasterCore | None) -> None:
        """A new term begins (``core``: a fresh one) or ends (None). The old term's waiting
        calls get their answers, and the nodes' streams close, so that they reconnect to
        whoever leads now."""
        old = self.core
        self.core = core
        if old is not None:
            self.carry_out(old.end_term())
        if self.durable is not None:
            self.durable.end()  # (answers still waiting for a write are refused)
            if core is not None:
                self.durable.begin(core.state.durable_record)
        for pending in self._waiting.values():  # (none should be left: end_term answers all)
            pending.refuse(CallRefused(grpc.StatusCode.UNAVAILABLE, "the term ended: retry"))
        self._waiting.clear()
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf

    def _arm_timer(self) -> None:
        core = self.core
        if core is None:
            return
        at = core.next_deadline()
        if at is None or at >= self._timer_at:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # driven without a loop (a test): it calls timers() itself
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = loop.call_later(max(0.0, at - core.clock()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        if self.core is not None:
            self.carry_out(self.core.timers())
