"""The master's sans-IO core: every rule and every timer, as events in and effects out.

``MasterState`` (state.py) holds the object metadata and its life cycle. Around it, this
module owns what used to live in the I/O layer, so that the model tests reach it too:

* delivery of node commands (delivery.py): written at once to a node with an open stream,
  kept for one without, sent again on a new stream when unanswered; an answer counts only from
  the node the command went to;
* how long the master waits for a node's answer before counting the command failed;
* the forget barrier (forget_barrier.py): a PutStart whose buffers overlap space a node has
  not yet confirmed forgetting waits for that answer, ``forget_wait`` at most, after which
  the slots still held are revoked as FENCED (the client retries them);
* removals that answer once their nodes dropped the objects (``forget_wait`` at most);
* PutEnds that answer once their nodes recorded the objects;
* the rebuild window of a new term: clients are turned away until the nodes the cluster
  knows have remounted, or the window has passed.

Each event is a method that takes a call id where a caller waits for an answer, and returns
``Effects``: the commands to write on node streams, and the answers of the calls that have
one now (its own, and any earlier call that waited). Time comes from the injected clock; the
I/O layer calls ``timers()`` at ``next_deadline()`` and ``tick()`` periodically. No asyncio,
sockets or threads here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.common.status import WRITER_HOLDS_RANGE, KeyStatus
from kvpool.master.command_batching import merge_forgets
from kvpool.master.delivery import BOUND_TO_PROCESS, CommandDelivery
from kvpool.master.forget_barrier import ForgetBarrier
from kvpool.master.forget_retries import WRITER, ForgetRetries
from kvpool.master.records import (
    Commit,
    ExplainedStatuses,
    ForgetCommand,
    NodeCommand,
    PutOptions,
    PutSlot,
    SegmentInfo,
    StoredObject,
    TickReport,
    UnreadableReplica,
)
from kvpool.master.state import MasterState

#: Why clients are turned away while the index is rebuilt (``client_refusal``).
REBUILDING = (
    "the master (a new leader, or one that just started) is rebuilding its index from the "
    "storage nodes: retry shortly"
)
#: How long the master waits for a node to answer a command before counting it failed.
COMMAND_TIMEOUT = 5.0
#: How long a PutStart or a removal waits for nodes to confirm their Forgets.
FORGET_WAIT = 1.0
#: A master that does not know which nodes exist (a lone master that just started) and finds
#: that some held objects before it started takes clients once no new node has come for this
#: long (nodes heartbeat every second and remount at the first answer), or once its rebuild
#: window has passed.
REBUILD_QUIET = 2.0


class TermEnded:
    """The answer of a call still waiting when its term ended: the caller must retry (at
    whichever master leads now)."""

    def __repr__(self) -> str:
        return "TERM_ENDED"


TERM_ENDED = TermEnded()


@dataclass(slots=True)
class Effects:
    """What one event of the core asks of the I/O layer."""

    #: Commands to write, in this order, each on the open stream of its node.
    transmit: list[NodeCommand] = field(default_factory=list)
    #: call id -> the answer of a call that has one now.
    answers: dict[int, Any] = field(default_factory=dict)
    #: What an operator should hear of: (event, fields), for the log.
    notes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: Segments whose durable tombstone record changed (``MasterState.durable_record``):
    #: where a new leader can read them (etcd), they are written before ``answers`` go out,
    #: since those may rely on them (a removal answered while a node is away).
    durable: set[str] = field(default_factory=set)


class _PutEndCall:
    """A PutEnd waiting for its objects' nodes: ``statuses`` fills in as they answer."""

    __slots__ = ("left", "messages", "statuses")

    def __init__(self, statuses: list[KeyStatus | None]) -> None:
        self.statuses = statuses
        self.left = statuses.count(None)
        #: index -> why, for the keys whose answer says more than its status.
        self.messages: dict[int, str] | None = None

    def answer(self) -> list[KeyStatus | None]:
        if self.messages is None:
            return self.statuses
        return ExplainedStatuses(self.statuses, self.messages)


@dataclass(slots=True)
class _HeldPutStart:
    """A PutStart whose slots (by index) wait for the Forgets overlapping their buffers."""

    keys: list[str]
    slots: list[PutSlot]
    waiting: dict[int, set[int]]

    def forget_answered(self, command_id: int) -> bool:
        for index in [i for i, ids in self.waiting.items() if command_id in ids]:
            ids = self.waiting[index]
            ids.discard(command_id)
            if not ids:
                del self.waiting[index]
        return not self.waiting


@dataclass(slots=True)
class _HeldRemoval:
    """A removal answered once its nodes confirmed its Forgets."""

    answer: Any
    waiting: set[int]

    def forget_answered(self, command_id: int) -> bool:
        self.waiting.discard(command_id)
        return not self.waiting


FENCED_SLOT = PutSlot(
    KeyStatus.FENCED,
    message="its storage node has not yet confirmed that it cleared the space: retry",
)
ENDED_WHILE_HELD_SLOT = PutSlot(
    KeyStatus.FENCED,
    message="its reservation ended (removed, or its node lost) while it waited for the space: "
    "retry",
)


class MasterCore:
    def __init__(
        self,
        state: MasterState,
        *,
        awaited_nodes: Iterable[str] | None = (),
        rebuild_window: float = 0.0,
        rebuild_quiet: float = REBUILD_QUIET,
        command_timeout: float = COMMAND_TIMEOUT,
        forget_wait: float = FORGET_WAIT,
        epoch_ends: float = 0.0,
    ) -> None:
        """``awaited_nodes``: after an election, the nodes to wait for (``rebuild_window``
        seconds at most) before answering clients from an index rebuilt from their reports;
        None when nobody knows which nodes exist (a lone master that just started): then
        clients wait until the nodes stopped coming (``rebuild_quiet``), or the window ends.

        ``epoch_ends``: a lone master takes no client before this time (on ``state``'s
        clock) whatever else holds. Its epoch is the second it started in, the top half of
        every put id it gives out: a master that gave out none within that second leaves
        the epoch to a successor restarted within it, and one that gave out some did so
        only after it, when a successor's start second is a later one."""
        self.state = state
        self.clock = state.clock
        self.command_timeout = command_timeout
        self.forget_wait = forget_wait
        self.delivery = CommandDelivery()
        self.barrier = ForgetBarrier()
        self._awaited_nodes = set(awaited_nodes or ())
        self._rebuild_until = self.clock() + rebuild_window
        #: Awaited nodes the rebuild window closed without (``take_nodes_not_heard``).
        self._not_heard: set[str] = set()
        #: Every awaited node was heard from, and one still reports a segment in parts.
        self._awaiting_reports = False
        #: Nodes unknown (see __init__): when a new node was last seen; whether one came back
        #: from an earlier run of the cluster (a remount, or a heartbeat as its first word),
        #: rather than starting afresh.
        self._unknown_nodes = awaited_nodes is None and (rebuild_window > 0 or epoch_ends > 0)
        self._epoch_ends = epoch_ends
        self._rebuild_quiet = rebuild_quiet
        self._last_new_node: float | None = None
        self._restarted = False
        #: (key, put_id) -> the PutEnd calls waiting for it, each with its place in the batch.
        self._commit_waits: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self._put_ends: dict[int, _PutEndCall] = {}
        #: call id -> a call held back by unanswered Forgets; Forget id -> calls it holds.
        self._held: dict[int, _HeldPutStart | _HeldRemoval] = {}
        self._held_by: dict[int, set[int]] = {}
        #: (deadline, id) of held calls and of Forgets in the barrier; (deadline, id,
        #: command) of awaited commands.
        self._command_deadlines: list[tuple[float, int, NodeCommand]] = []
        self._call_deadlines: list[tuple[float, int]] = []
        self._forget_deadlines: list[tuple[float, int]] = []
        #: Forget id -> the Forget, while it holds writers back (to quarantine its space).
        self._forgets: dict[int, ForgetCommand] = {}
        #: (key, generation) -> the unanswered Forgets (quarantined ones too) of replicas its
        #: object gave up while it lived on (trimmed, moved away): a removal of the object
        #: waits for them too. By Forget id: its node and the (key, generation)s it named.
        self._trims: dict[tuple[str, int], list[int]] = {}
        self._trimmed: dict[int, tuple[str, list[tuple[str, int]]]] = {}
        #: Forgets a node failed to carry out, to send again (forget_retries.py).
        self._forget_retries = ForgetRetries()

    # ------------------------------------------------------------------ clients

    def client_refusal(self) -> str | None:
        """Why clients' calls are turned away now (UNAVAILABLE: they retry), or None.

        While the index is rebuilt from the nodes' reports (``accepting_clients``); and for
        one node TTL after every node this master had went silent: a master cut off from
        them all (a partition around it) would otherwise answer every get "not found" and
        every put "no space" until it lost the leadership or heard from them again. Past
        that, it answers from what it holds (NO_SPACE saying that no node is heard)."""
        if not self.accepting_clients():
            return REBUILDING
        silent = self.state.all_silent
        if silent is not None and self.clock() - silent[0] < self.state.config.node_ttl:
            return self.state.silence_message() + "; retry shortly"
        return None

    def step_down_reason(self) -> str | None:
        """Why this leader should hand its term to another master, or None: it heard from
        nodes and now hears from none (``MasterState.all_silent``). If they died, a new
        leader answers as this one would; if it is this master that is cut off from them,
        a master that reaches them serves their objects again, where this one would answer
        "not found" for as long as it keeps the term. (A new term's state starts with no
        silence: a master that wins the term again does not step down again for it.)"""
        return None if self.state.all_silent is None else self.state.silence_message()

    def accepting_clients(self) -> bool:
        """False while a new leader (or a master that just started) still waits for the nodes
        to report what they hold: it would answer NOT_FOUND for objects it has not heard of
        yet, and NO_SPACE for space it does not know of."""
        if self._unknown_nodes:
            now = self.clock()
            if now < self._epoch_ends:
                return False  # (see __init__: no put id of a predecessor's epoch)
            last = self._last_new_node
            if now < self._rebuild_until and (
                last is None
                or (self._restarted and now - last < self._rebuild_quiet)
                or self.state.reporting()
            ):
                return False  # no node yet, or nodes of an earlier run still coming back
            self._unknown_nodes = False
            return True
        if not self._awaited_nodes and not self._awaiting_reports:
            return True
        self._close_passed_window()
        self._awaited_nodes -= self.state.nodes.keys()
        if self._awaited_nodes:
            return False
        # (every node heard from; one may still be reporting a segment in parts)
        self._awaiting_reports = self.clock() < self._rebuild_until and self.state.reporting()
        return not self._awaiting_reports

    def _close_passed_window(self) -> None:
        """Once the rebuild window has passed, clients are taken without the nodes not heard
        from yet: each gets its entry (what ends from now on must not come back with it)."""
        if self._awaited_nodes and self.clock() >= self._rebuild_until:
            unheard = self._awaited_nodes - self.state.nodes.keys()
            if unheard:
                self.state.nodes_unheard(unheard)
                self._not_heard |= unheard
            self._awaited_nodes = set()

    def take_nodes_not_heard(self) -> set[str]:
        """The awaited nodes the rebuild window closed without, each once: away from now on
        as far as the cluster's list of nodes goes (master/election.py), so that the next
        leader does not wait for them."""
        taken, self._not_heard = self._not_heard, set()
        return taken

    def put_start(
        self,
        call_id: int,
        client_id: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        options: PutOptions,
    ) -> Effects:
        """Answers the slots, once no buffer overlaps space with a Forget unanswered."""
        slots = self.state.put_start(client_id, keys, sizes, options)
        effects = self._flush()  # the Forgets of what this call evicted
        waiting = self._forgets_under(slots, sizes) if self.barrier else None
        if not waiting:
            effects.answers[call_id] = slots
            return effects
        self._hold(call_id, _HeldPutStart(list(keys), slots, waiting), waiting.values())
        return effects

    def put_end(self, call_id: int, commits: Sequence[Commit]) -> Effects:
        """Answers once every object's nodes recorded it (or failed, or timed out)."""
        statuses = self.state.put_end(commits)
        call = _PutEndCall(statuses)
        if call.left:
            self._put_ends[call_id] = call
            waits = self._commit_waits
            for i, (commit, status) in enumerate(zip(commits, statuses, strict=True)):
                if status is None:
                    waits.setdefault((commit.key, commit.put_id), []).append((call_id, i))
        effects = self._flush()
        if not call.left:
            effects.answers[call_id] = statuses
        return effects

    def put_revoke(self, call_id: int, keys: Sequence[str], put_ids: Sequence[int]) -> Effects:
        return self._answer(call_id, self.state.put_revoke(keys, put_ids))

    def get_replicas(
        self, call_id: int, keys: Sequence[str], lease_ttl: float, client_id: str = ""
    ) -> Effects:
        return self._answer(call_id, self.state.get_replicas(keys, lease_ttl, client_id))

    def exists(
        self,
        call_id: int,
        keys: Sequence[str],
        lease_ttl: float,
        lease: bool,
        client_id: str = "",
        tenant: str | None = None,
    ) -> Effects:
        """``keys`` are the master's, or with ``tenant`` those of that tenant."""
        answer = self.state.exists(
            keys, lease_ttl, grant_lease=lease, client_id=client_id, tenant=tenant
        )
        return self._answer(call_id, answer)

    def release_leases(self, call_id: int, client_id: str, keys: Sequence[str]) -> Effects:
        return self._answer(call_id, self.state.release_leases(client_id, keys))

    def remove(self, call_id: int, keys: Sequence[str], force: bool) -> Effects:
        """Answers once the nodes dropped what it removed (see ``_removal``)."""
        return self._removal(call_id, self.state.remove(keys, force))

    def remove_prefix(
        self, call_id: int, prefix: str, force: bool, start_after: str = ""
    ) -> Effects:
        """One page of a prefix removal (``MasterState.remove_prefix``)."""
        return self._removal(call_id, self.state.remove_prefix(prefix, force, start_after))

    def client_heartbeat(self, call_id: int, client_id: str) -> Effects:
        self.state.client_heartbeat(client_id)
        return self._answer(call_id, None)

    # ------------------------------------------------------------------ nodes

    def mount_segment(
        self,
        call_id: int,
        info: SegmentInfo,
        stored: Sequence[StoredObject],
        remount: bool,
        silent: float,
        more: bool = False,
    ) -> Effects:
        """A node mounts a segment with what it holds (``more``: the first part of a report
        in parts, ``report_more`` takes the rest); answers the keys not adopted."""
        if self._unknown_nodes and info.node_id not in self.state.nodes:
            self._last_new_node = self.clock()
            self._restarted |= remount or bool(stored)
        dropped = self.state.mount_segment(info, stored, remount=remount, silent=silent, more=more)
        return self._answer(call_id, dropped)

    def report_more(
        self, call_id: int, info: SegmentInfo, stored: Sequence[StoredObject], more: bool
    ) -> Effects:
        """A later part of a segment's report in parts; answers the keys not adopted, or
        None when the segment is not mounted as ``info`` says (``MasterState.report_more``)."""
        return self._answer(call_id, self.state.report_more(info, stored, more=more))

    def drain(self, call_id: int, node_id: str) -> Effects:
        """Drains a node (``MasterState.drain``); answers its progress, None for a node not
        known. Its copies start at the next ticks."""
        return self._answer(call_id, self.state.drain(node_id))

    def unmount_segment(self, call_id: int, node_id: str, segment_id: str) -> Effects:
        return self._answer(call_id, self.state.unmount_segment(node_id, segment_id))

    def heartbeat(
        self,
        call_id: int,
        node_id: str,
        segment_ids: Iterable[str],
        incarnation: str = "",
        unreadable: Sequence[UnreadableReplica] = (),
    ) -> Effects:
        if self._unknown_nodes and node_id not in self.state.nodes:
            self._last_new_node = self.clock()  # (it mounts at this answer)
            self._restarted = True
        remount = self.state.heartbeat(node_id, segment_ids, incarnation, unreadable)
        return self._answer(call_id, remount)

    def node_connected(self, node_id: str, stream: object, incarnation: str) -> Effects:
        """A node opened its command stream: what it must get first goes out on it."""
        effects = Effects()
        effects.transmit.extend(
            self.delivery.connected(node_id, stream, incarnation, self._still_wanted)
        )
        return effects

    def node_disconnected(self, node_id: str, stream: object) -> None:
        self.delivery.disconnected(node_id, stream)

    def node_answered(
        self,
        node_id: str,
        command_id: int,
        ok: bool,
        crc32c: Sequence[int] = (),
        *,
        source_corrupt: bool = False,
        error: str = "",
    ) -> Effects:
        """A node's answer to a command (``error``: why it failed, in the node's words); one
        it was not sent (or already answered) changes nothing."""
        command = self.delivery.answered(node_id, command_id)
        if command is None:
            effects = Effects()
            note = "an answer to no command awaited from this node (late, or sent twice)"
            effects.notes.append((note, {"node_id": node_id, "command": command_id}))
            return effects
        self.state.node_answered(node_id)  # (it is not silent, if it was)
        if isinstance(command, ForgetCommand):
            answers: dict[int, Any] = {}
            if not ok:  # (a transfer did not stop, its log is unwritable: it still lists it)
                channel = WRITER if WRITER_HOLDS_RANGE in error else ""
                self._forget_retries.failed(command, self.state.segments.get, self.clock(), channel)
                note = "a node could not forget: its space stays quarantined, sent again later"
                if channel != WRITER:
                    effects = Effects()
                    effects.notes.append((note, {"node_id": node_id, "command": command_id}))
                    return effects  # (as if unanswered: forget_wait quarantines the space)
                # A same-host writer's copy holds the range: quarantined now, the node not
                # counted silent (it answered; its other commands go on as before).
                self._quarantine(command_id, answers, node_silent=False)
                effects = self._flush()
                effects.answers.update(answers)
                effects.notes.append((note, {"node_id": node_id, "command": command_id}))
                return effects
            self._forget_answered(command_id, answers)
            effects = self._flush()
            effects.answers.update(answers)
            if self._forget_retries:
                again = self._forget_retries.succeeded(command, self.state.segments.get)
                effects.transmit.extend(f for f in again if self.delivery.send(f))
            return effects
        self.state.command_done(command_id, ok, crc32c, source_corrupt=source_corrupt, error=error)
        return self._flush()

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """When ``timers`` has something to do next (None: nothing waits)."""
        # (Asked after every event: no list built, no generator.)
        first = None
        for heap in (self._command_deadlines, self._call_deadlines, self._forget_deadlines):
            if heap and (first is None or heap[0][0] < first):
                first = heap[0][0]
        retry = self._forget_retries.next_deadline()
        if retry is not None and (first is None or retry < first):
            first = retry
        return first

    def timers(self) -> Effects:
        """Commands whose node did not answer in time count as failed (the node may still
        carry them out: the state keeps their space a while); calls held back by Forgets past
        ``forget_wait`` are answered."""
        now = self.clock()
        state = self.state
        expired: list[int] = []
        commands = self._command_deadlines
        while commands and commands[0][0] <= now:
            _, command_id, command = heapq.heappop(commands)
            if state.awaiting(command_id):
                state.command_expired(command_id)
                self.delivery.expired(command)
                expired.append(command_id)
        answers: dict[int, Any] = {}
        deadlines = self._call_deadlines
        while deadlines and deadlines[0][0] <= now:
            _, call_id = heapq.heappop(deadlines)
            held = self._held.pop(call_id, None)
            if held is not None:
                answers[call_id] = self._release(held, timed_out=True)
        late: list[int] = []
        deadlines = self._forget_deadlines
        while deadlines and deadlines[0][0] <= now:
            _, command_id = heapq.heappop(deadlines)
            if self._quarantine(command_id, answers):
                late.append(command_id)
        effects = self._flush()
        effects.answers.update(answers)
        for probe in self._forget_retries.due(now, state.segments.get):
            if self.delivery.send(probe):
                effects.transmit.append(probe)
        if expired:
            note = "storage nodes did not answer in time: no new objects go to them for a while"
            effects.notes.append((note, {"commands": expired}))
        if late:
            note = "storage nodes did not confirm Forgets in time: their space is quarantined"
            effects.notes.append((note, {"forgets": late}))
        return effects

    def _quarantine(
        self, command_id: int, answers: dict[int, Any], *, node_silent: bool = True
    ) -> bool:
        """A Forget still unanswered after ``forget_wait`` (or failed for a same-host
        writer's lock: not ``node_silent``): the writers it holds back get FENCED for the
        slots it holds (they retry, elsewhere), and its space stays out of use until the
        node answers, instead of holding every later writer back."""
        forget = self._forgets.pop(command_id, None)
        if forget is None or command_id not in self.barrier:
            return False
        removals = set()
        for call_id in self._held_by.pop(command_id, ()):
            held = self._held.get(call_id)
            if isinstance(held, _HeldRemoval):
                removals.add(call_id)  # (sent before it: it waits on, to its own deadline)
            elif held is not None:
                del self._held[call_id]
                answers[call_id] = self._release(held, timed_out=True)
        if removals:
            self._held_by[command_id] = removals
        self.barrier.answered(command_id)
        self.state.quarantine(forget, node_silent=node_silent)
        return True

    def tick(self, step: int | None = None, *, late_by: float = 0.0) -> tuple[TickReport, Effects]:
        """The state's tick (timeouts, dead nodes and clients, frees, eviction; in steps of
        ``step`` objects), and what it releases here: nothing waits for a dead node.
        ``late_by``: how much later than planned it comes (``MasterState.tick``): the
        master's own silence is no part of the nodes' time to report after an election
        either."""
        forgiven = self.state.forgive_own_silence(late_by) if late_by else 0.0
        if forgiven:
            self._rebuild_until += forgiven
            if self._last_new_node is not None:
                self._last_new_node = min(self.clock(), self._last_new_node + forgiven)
        # (first: an object the tick ends, evicted say, must be noted for the nodes not
        # heard from, or it would come back with them)
        self._close_passed_window()
        report = self.state.tick(step)
        report.silence_forgiven = forgiven
        answers: dict[int, Any] = {}
        for node_id in report.dead_nodes:
            self.delivery.discard(node_id)
            self._forget_retries.node_gone(node_id)
            for command_id in self.barrier.node_gone(node_id):
                self.state.forget_overdue(command_id)  # (answered now without it)
                self._forget_answered(command_id, answers, released=True)
            for command_id in [c for c, (n, _) in self._trimmed.items() if n == node_id]:
                # (quarantined ones, which the barrier had let go: removals wait on them)
                self._forget_answered(command_id, answers, released=True)
        effects = self.timers()
        effects.answers.update(answers)
        return report, effects

    def end_term(self) -> Effects:
        """The term ends (a new leader, or this one lost leadership): every call still
        waiting is answered, commits as STALE_PUT (the writer puts again), held PutStarts and
        removals as TERM_ENDED: a removal whose nodes have not confirmed may come back at the
        next leader, so its caller must remove again there."""
        effects = Effects()
        for call_id, call in self._put_ends.items():
            effects.answers[call_id] = [
                KeyStatus.STALE_PUT if status is None else status for status in call.statuses
            ]
        for call_id in self._held:
            effects.answers[call_id] = TERM_ENDED
        self._put_ends.clear()
        self._commit_waits.clear()
        self._held.clear()
        self._held_by.clear()
        return effects

    # ------------------------------------------------------------------ internals

    def _answer(self, call_id: int, answer: Any) -> Effects:
        effects = self._flush()
        effects.answers[call_id] = answer
        return effects

    def _flush(self, forgets: list[int] | None = None) -> Effects:
        """What the state's last event produced: its node commands (Forgets in a row for one
        segment merged) go to delivery, and PutEnds whose objects settled are answered.
        ``forgets`` collects the ids of the Forgets sent."""
        effects = Effects()
        state = self.state
        if state.outbox:
            now = self.clock()
            transmit = effects.transmit
            absorbed: dict[int, int] = {}
            for command in merge_forgets(state.outbox, absorbed):
                if isinstance(command, ForgetCommand):
                    self.barrier.sent(command)
                    self._forgets[command.command_id] = command
                    self._note_trims(command)
                    deadline = (now + self.forget_wait, command.command_id)
                    heapq.heappush(self._forget_deadlines, deadline)
                    if forgets is not None:
                        forgets.append(command.command_id)
                if self.delivery.send(command):
                    transmit.append(command)
                if state.awaiting(command.command_id):
                    heapq.heappush(
                        self._command_deadlines,
                        (now + self.command_timeout, command.command_id, command),
                    )
            state.outbox.clear()
            if absorbed:
                state.forgets_merged(absorbed)
        if state.resolved:
            answers = effects.answers
            for result in state.resolved:
                for call_id, index in self._commit_waits.pop((result.key, result.put_id), ()):
                    call = self._put_ends.get(call_id)
                    if call is None or call.statuses[index] is not None:
                        continue
                    call.statuses[index] = result.status
                    if result.message:
                        if call.messages is None:
                            call.messages = {}
                        call.messages[index] = result.message
                    call.left -= 1
                    if not call.left:
                        del self._put_ends[call_id]
                        answers[call_id] = call.answer()
            state.resolved.clear()
        if state.durable_changed:
            effects.durable = state.durable_changes()
        return effects

    def _forgets_under(self, slots: list[PutSlot], sizes: Sequence[int]) -> dict[int, set[int]]:
        """Slot index -> the unanswered Forgets overlapping its buffers."""
        waiting: dict[int, set[int]] = {}
        pending = self.barrier.pending
        ok = KeyStatus.OK
        for i, slot in enumerate(slots):
            if slot.status is not ok:
                continue
            ids: set[int] = set()
            for r in slot.replicas:
                segment = r.segment
                ids.update(pending(segment.segment_id, r.address - segment.base_address, sizes[i]))
            if ids:
                waiting[i] = ids
        return waiting

    def _note_trims(self, forget: ForgetCommand) -> None:
        """Notes the objects ``forget`` names that live on elsewhere (see ``_trims``)."""
        find = self.state.objects.get
        named = []
        for o in forget.objects:
            record = find(o.key)
            if record is not None and record.generation == o.generation:
                named.append((o.key, o.generation))
        if named:
            self._trimmed[forget.command_id] = (forget.node_id, named)
            for pair in named:
                self._trims.setdefault(pair, []).append(forget.command_id)

    def _forget_done(self, command_id: int) -> None:
        """The node answered Forget ``command_id``, or is gone: it lists those objects no
        more."""
        entry = self._trimmed.pop(command_id, None)
        if entry is None:
            return
        trims = self._trims
        for pair in entry[1]:
            ids = trims.get(pair)
            if ids is not None and command_id in ids:
                ids.remove(command_id)
                if not ids:
                    del trims[pair]

    def _removal(self, call_id: int, answer: Any) -> Effects:
        """A removal answers once the nodes have dropped what it removed (or ``forget_wait``
        has passed: a node that is away gets the Forget when it comes back). Answered earlier,
        a master that died before its nodes heard would leave a new leader to adopt the
        removed objects again from what the nodes report."""
        forgets: list[int] = []
        effects = self._flush(forgets)
        if forgets:
            waits = set(forgets)
            if self._trims:  # a replica trimmed earlier may still be listed by its node
                trims, sent = self._trims, self._forgets
                for command_id in forgets:
                    for o in sent[command_id].objects:
                        waits.update(trims.get((o.key, o.generation), ()))
            self._hold(call_id, _HeldRemoval(answer, waits), [waits])
        else:
            effects.answers[call_id] = answer
        return effects

    def _hold(
        self, call_id: int, held: _HeldPutStart | _HeldRemoval, waits: Iterable[set[int]]
    ) -> None:
        self._held[call_id] = held
        for ids in waits:
            for command_id in ids:
                self._held_by.setdefault(command_id, set()).add(call_id)
        heapq.heappush(self._call_deadlines, (self.clock() + self.forget_wait, call_id))

    def _forget_answered(
        self, command_id: int, answers: dict[int, Any], released: bool = False
    ) -> None:
        self._forgets.pop(command_id, None)
        if self._trimmed:
            self._forget_done(command_id)
        if not released:
            self.barrier.answered(command_id)
            self.state.forget_answered(command_id)
        for call_id in self._held_by.pop(command_id, ()):
            held = self._held.get(call_id)
            if held is not None and held.forget_answered(command_id):
                del self._held[call_id]
                answers[call_id] = self._release(held, timed_out=False)

    def _release(self, held: _HeldPutStart | _HeldRemoval, timed_out: bool) -> Any:
        """The answer of a held call; a PutStart's slots still held are revoked as FENCED,
        and so are those whose reservation ended while the call waited (a forced removal, a
        node declared dead): their space may have gone to another object meanwhile, which
        the writer would overwrite."""
        if isinstance(held, _HeldRemoval):
            return held.answer
        slots = list(held.slots)
        if timed_out and held.waiting:
            late = sorted(held.waiting)
            self.state.put_revoke([held.keys[i] for i in late], [slots[i].put_id for i in late])
            for i in late:
                slots[i] = FENCED_SLOT
        ok, reserved = KeyStatus.OK, self.state.still_reserved
        for i, slot in enumerate(slots):
            if slot.status is ok and not reserved(held.keys[i], slot.put_id):
                slots[i] = ENDED_WHILE_HELD_SLOT
        return slots

    def _still_wanted(self, command: NodeCommand) -> bool:
        """Whether a command a broken stream may have lost is worth sending again: not a
        Persist or Copy the master stopped waiting for (its target may be reused by now)."""
        if isinstance(command, BOUND_TO_PROCESS):
            return self.state.awaiting(command.command_id)
        return True
