"""Model check of the master's whole sans-IO core (``master/core.py``): delivery of node
commands across broken streams, answers waited for and given up on, the forget barrier, the
rebuild window of a new term, and master failover.

A hypothesis state machine drives ``MasterCore`` (fake clock) with a small cluster of simulated
storage nodes, each with one DRAM segment and an index of what it recorded, as a node keeps it:
a command the core writes travels on the node's stream; the node runs its commands in order
(Persist records objects, Forget drops exactly the generation it names) and answers; a stream
breaks, losing what was on the wire, and the node opens a new one; answers get lost (only with
their stream, as TCP loses nothing on a live connection and a node that cannot answer a command
ends its stream: the stream is broken, and noticed later); a node answers a command it was
never sent; clients put, commit and remove; time passes and the core's
timers fire; the leader dies and a new term rebuilds its index from the nodes' remounts; a
node stalls (no heartbeats, runs nothing) long enough to be declared dead, then resumes: it
may run some of what was on its wire before it notices, and remounts with what it holds.

Invariants, after every step:

1. the barrier: a PutStart hands out (OK) only buffers that no node's index lists under
   another object: what a writer writes can never be adopted as an old object's bytes;
2. nothing placed in fenced space: after a failover, no OK slot lies in a segment before its
   fence (a write timeout and a margin after the node last heard from the old master);
3. a held call (PutStart behind a Forget, a removal waiting for its Forgets) is answered within
   ``forget_wait``, a PutEnd within the command timeout, once the core's timers ran;
4. a removal answered before its wait ran out has had its Forgets run by the nodes (but a
   node declared dead meanwhile, which the removal no longer waits for: its remount must not
   bring the object back, see 7);
5. an answer from a node the command was not sent to changes nothing;
6. the rebuild window: a new leader turns clients away until every known node remounted (or
   the window passed), and takes them once they have;
7. failover loses nothing and brings nothing back: every object published and not removed is
   published again once the nodes remounted; an object whose removal was answered by its nodes
   stays gone; and so after a dead node's remount;
8. delivery: once every node is connected (a stream that lost an answer broken and opened
   again) and has run what it was sent (``settle``, also at the end of every example), nothing
   is left unanswered or unsent, no call waits, the forget barrier is empty and no space is
   quarantined (a Forget unanswered past ``forget_wait`` takes its space out of use instead of
   holding writers back: invariant 1 covers that space too);
9. the state's own invariants (``MasterState.validate``) hold after every step.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from model_seeds import run_seeded
from state_helpers import FakeClock, segment_info

from kvpool.common.status import KeyStatus
from kvpool.master.config import MasterConfig
from kvpool.master.core import TERM_ENDED, Effects, MasterCore
from kvpool.master.records import (
    Commit,
    CopyCommand,
    ForgetCommand,
    NodeCommand,
    ObjectState,
    PersistCommand,
    PutOptions,
    PutSlot,
    SegmentInfo,
    StoredObject,
)
from kvpool.master.state import FENCE_MARGIN, MasterState
from kvpool.master.tombstones import node_entry

# Nodes heartbeat as time passes, and their TTL is longer than any step but a long silence
# (``a_long_silence``), which declares the stalled ones dead.
CONFIG = MasterConfig(node_ttl=60.0, reservation_timeout=8.0, reclaim_delay=0.0)
#: A secure master (capabilities, nodes serving the checked stream: Forgets for objects never
#: recorded, to seal their grants), most-free placement, and re-replication of what a dead node
#: held (Copy commands between nodes).
SECURE_CONFIG = dataclasses.replace(
    CONFIG, capability_skew=0.5, placement="most-free", rereplication_rate=1e9
)
COMMAND_TIMEOUT = 2.0
FORGET_WAIT = 1.0
NODES = ("n0", "n1", "n2")
KEYS = ("a", "b", "c", "d", "e", "f")
SEGMENT_SIZE = 2048
STEPS = (0.1, 0.5, 1.0, 1.5, 3.0)


@dataclass
class SimNode:
    """A storage node as the core sees it through its stream: what is on the wire to it, and
    what its index holds (key, generation) -> the stored object."""

    name: str
    index: dict[tuple[str, int], StoredObject] = field(default_factory=dict)
    stream: object | None = None
    wire: list[NodeCommand] = field(default_factory=list)
    streams_opened: int = 0
    #: An answer of this node's open stream was lost: that stream is broken (it is closed at
    #: the latest when everything settles).
    lost_answer: bool = False
    ran: list[NodeCommand] = field(default_factory=list)
    #: Stalled (since ``stalled_at``): no heartbeats, runs nothing, its stream stays open.
    stalled: bool = False
    stalled_at: float = 0.0

    def run(self, command: NodeCommand) -> None:
        self.ran.append(command)
        if isinstance(command, PersistCommand):
            for item in command.objects:
                self.index[item.key, item.generation] = item
        elif isinstance(command, ForgetCommand):
            for item in command.objects:
                self.index.pop((item.key, item.generation), None)
        elif isinstance(command, CopyCommand):
            target = command.target
            self.index[target.key, target.generation] = target

    def lists(self, offset: int, size: int) -> list[StoredObject]:
        end = offset + max(size, 1)
        return [
            o for o in self.index.values() if o.offset < end and offset < o.offset + max(o.size, 1)
        ]


@dataclass
class Call:
    kind: str  # "put_start", "put_end", "remove"
    started: float
    keys: list[str]
    sizes: list[int] = field(default_factory=list)
    #: A removal's keys -> the generation published when it was asked for.
    generations: dict[str, int] = field(default_factory=dict)
    #: A PutStart's: the nodes silent on their commands when it came, and whether another
    #: node had room for its first object then (placement ran at once, whenever it answers).
    silent: frozenset[str] = frozenset()
    others_had_room: bool = True


class CoreModel(RuleBasedStateMachine):
    CONFIG = CONFIG

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.epoch = 1
        self.core = self.new_core(awaited=())
        self.nodes = {name: SimNode(name) for name in NODES}
        self.call_ids = iter(range(1, 1 << 30))
        self.calls: dict[int, Call] = {}
        #: key -> (put_id, slot) of an answered, uncommitted PutStart of this term.
        self.reserved: dict[str, tuple[int, PutSlot]] = {}
        #: key -> generation of the objects published when the last term ended.
        self.published: dict[str, int] = {}
        #: key -> generation of objects whose removal the nodes confirmed.
        self.removed: dict[str, int] = {}
        #: segment id -> the time before which nothing may be placed there (after a failover).
        self.fences: dict[str, float] = {}
        self.last_heard: dict[str, float] = {}
        self.remounted: set[str] = set(NODES)
        self.rebuild_until = 0.0
        #: Clients put or removed before every node remounted after the last failover: an
        #: object published then may since have been written again, removed or evicted.
        self.clients_before_remounts = False

    def new_core(self, awaited: tuple[str, ...]) -> MasterCore:
        state = MasterState(
            self.CONFIG, clock=self.clock, rng=random.Random(self.epoch), epoch=self.epoch
        )
        return MasterCore(
            state,
            awaited_nodes=awaited,
            rebuild_window=self.CONFIG.node_ttl,
            command_timeout=COMMAND_TIMEOUT,
            forget_wait=FORGET_WAIT,
        )

    def segment(self, name: str) -> SegmentInfo:
        info = segment_info(name, SEGMENT_SIZE)
        if self.CONFIG.capability_skew is not None:
            info = dataclasses.replace(info, checked_address=f"{name}.cluster.local:7000")
        return info

    @initialize()
    def mount_and_connect(self) -> None:
        for name, node in self.nodes.items():
            self.apply(
                self.core.mount_segment(next(self.call_ids), self.segment(name), [], False, 0.0)
            )
            self.connect(node)
            self.last_heard[name] = self.clock()

    # ------------------------------------------------------------------ the I/O layer's part

    def apply(self, effects: Effects) -> None:
        for command in effects.transmit:
            node = self.nodes[command.node_id]
            assert node.stream is not None, "the core wrote to a node without a stream"
            node.wire.append(command)
        for call_id, answer in effects.answers.items():
            call = self.calls.pop(call_id, None)
            if call is not None:
                self.answered(call, answer)

    def call(self, kind: str, keys: list[str], event, sizes: list[int] | None = None) -> None:
        call_id = next(self.call_ids)
        objects = self.core.state.objects
        generations = {
            k: objects[k].generation
            for k in keys
            if k in objects and objects[k].state is ObjectState.PUBLISHED
        }
        self.calls[call_id] = Call(kind, self.clock(), keys, sizes or [], generations)
        if kind == "put_start":
            self.note_silent_nodes(self.calls[call_id])
        if kind != "put_end" and self.remounted != set(NODES):
            self.clients_before_remounts = True
        self.apply(event(call_id))

    def note_silent_nodes(self, call: Call) -> None:
        """Which nodes are silent now, and whether another had room for the first object
        (what placement's first pass looks at: master/state.py, SILENT_NODE_PAUSE)."""
        state = self.core.state
        now = self.clock()
        call.silent = state._silent_nodes(now)
        if not call.silent:
            return
        call.others_had_room = any(
            segment.allocator.largest_free >= segment.allocator.rounded(call.sizes[0])
            and segment.fenced_until <= now
            for node in state.nodes.values()
            if node.node_id not in call.silent and not node.draining
            for segment in map(state.segments.__getitem__, node.segment_ids)
        )
        event("a put while a node is silent on its commands")

    def connect(self, node: SimNode) -> None:
        node.streams_opened += 1
        node.stream = f"{node.name}/stream{node.streams_opened}/term{self.epoch}"
        node.wire = []
        node.lost_answer = False
        self.apply(self.core.node_connected(node.name, node.stream, "process 1"))

    def answered(self, call: Call, answer) -> None:
        now = self.clock()
        if call.kind == "put_start":
            if answer is TERM_ENDED:
                return
            first = answer[0]
            if first.status is KeyStatus.OK and call.others_had_room:
                on = {r.segment.node_id for r in first.replicas}
                assert not on & call.silent, (
                    f"{call.keys[0]!r} placed on {sorted(on & call.silent)}, silent on their "
                    "commands, while another node had room"
                )
            for key, size, slot in zip(call.keys, call.sizes, answer, strict=True):
                if slot.status is not KeyStatus.OK:
                    continue
                for replica in slot.replicas:
                    segment = replica.segment
                    offset = replica.address - segment.base_address
                    listed = self.nodes[segment.node_id].lists(offset, size)
                    assert not listed, (
                        f"{key!r} handed {segment.segment_id}+{offset} ({size} B) where the "
                        f"node still lists {listed}: the forget barrier let it through; "
                        f"ran {self.nodes[segment.node_id].ran[-6:]}; "
                        f"wire {self.nodes[segment.node_id].wire}; "
                        f"unanswered {self.core.delivery.unanswered(segment.node_id)}; "
                        f"unsent {self.core.delivery.unsent(segment.node_id)}"
                    )
                    assert now >= self.fences.get(segment.segment_id, 0.0), (
                        f"{key!r} placed in {segment.segment_id} before its fence"
                    )
                self.reserved[key] = (slot.put_id, slot)
        elif call.kind == "remove" and answer is not TERM_ENDED:
            in_time = now < call.started + FORGET_WAIT
            for key, status in zip(call.keys, answer, strict=True):
                generation = call.generations.get(key)
                if status is not KeyStatus.OK or generation is None or not in_time:
                    continue
                for node in self.nodes.values():
                    if node.name not in self.core.state.nodes:
                        # declared dead, or a new leader never heard from it (its rebuild
                        # window passed): its remount must refuse it (invariant 7)
                        continue
                    if self.core.state._tombstones.refuses(
                        f"{node.name}/dram0", key, generation, False, node.name
                    ):
                        # its remount refused it, and the Forget that said so is still on
                        # its way (the answer that did was lost): refused again at any
                        # later mount until it is answered (invariant 7)
                        continue
                    assert (key, generation) not in node.index, (
                        f"removal of {key!r} answered while {node.name} still lists it; "
                        f"{call}; ran {node.ran[-8:]}; wire {node.wire}; now {now}"
                    )
                self.removed[key] = generation

    # ------------------------------------------------------------------ clients

    @precondition(lambda self: self.core.accepting_clients())
    @rule(
        batch=st.lists(
            st.tuples(st.sampled_from(KEYS), st.integers(64, 1500)),
            min_size=1,
            max_size=3,
            unique_by=lambda t: t[0],
        ),
        replicas=st.integers(1, 2),
        then=st.sampled_from(["nothing", "commit", "commit", "commit and record"]),
    )
    def put(self, batch, replicas, then) -> None:
        """A PutStart; its writer may commit at once, and the nodes may record it at once."""
        keys = [k for k, _ in batch]
        sizes = [s for _, s in batch]
        options = PutOptions(replicas=replicas)
        self.call(
            "put_start",
            keys,
            lambda c: self.core.put_start(c, "client", keys, sizes, options),
            sizes,
        )
        if then == "nothing":
            return
        for key in [k for k in keys if k in self.reserved]:
            self.commit(key)
        if then == "commit and record":
            for name in NODES:
                self.node_runs_commands(name, 10, False)

    def commit(self, key: str) -> None:
        put_id, slot = self.reserved.pop(key)
        commit = Commit(key, put_id, (True,) * len(slot.replicas))
        self.call("put_end", [key], lambda c: self.core.put_end(c, [commit]))

    @precondition(lambda self: self.reserved)
    @rule(data=st.data())
    def put_end(self, data) -> None:
        self.commit(data.draw(st.sampled_from(sorted(self.reserved))))

    @precondition(lambda self: self.core.accepting_clients())
    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
        force=st.booleans(),
    )
    def remove(self, keys, force) -> None:
        self.call("remove", keys, lambda c: self.core.remove(c, keys, force))

    # ------------------------------------------------------------------ nodes

    @rule(
        name=st.sampled_from(NODES),
        count=st.integers(1, 3),
        lose_answer=st.sampled_from([False] * 5 + [True]),
    )
    def node_runs_commands(self, name, count, lose_answer) -> None:
        """The node runs its next commands in order and answers them (or the last answer is
        lost, and with it the stream: no later answer of that stream arrives)."""
        node = self.nodes[name]
        if node.stalled:
            return
        for i in range(count):
            if not node.wire:
                return
            command = node.wire.pop(0)
            node.run(command)
            if lose_answer and i == count - 1:
                node.lost_answer = True  # (its stream is broken: it is noticed later)
            if not node.lost_answer:
                self.apply(self.core.node_answered(name, command.command_id, True))

    @rule(name=st.sampled_from(NODES))
    def stream_breaks(self, name) -> None:
        node = self.nodes[name]
        if node.stream is None:
            return
        self.core.node_disconnected(name, node.stream)
        node.stream, node.wire = None, []  # what was on the wire is lost

    @precondition(
        lambda self: any(
            n.stream is None and n.name in self.remounted and not n.stalled
            for n in self.nodes.values()
        )
    )
    @rule(data=st.data())
    def node_reconnects(self, data) -> None:
        name = data.draw(
            st.sampled_from(
                sorted(
                    n.name
                    for n in self.nodes.values()
                    if n.stream is None and n.name in self.remounted and not n.stalled
                )
            )
        )
        self.connect(self.nodes[name])

    @rule(name=st.sampled_from(NODES), other=st.sampled_from(NODES))
    def answer_from_the_wrong_node(self, name, other) -> None:
        """``other`` answers a command on ``name``'s wire: nothing changes."""
        if name == other or not self.nodes[name].wire:
            return
        command = self.nodes[name].wire[0]
        state = self.core.state
        awaiting = state.awaiting(command.command_id)
        effects = self.core.node_answered(other, command.command_id, False)
        assert not effects.transmit and not effects.answers, "a stranger's answer had effects"
        assert state.awaiting(command.command_id) == awaiting

    # ------------------------------------------------------------------ time and terms

    @rule(step=st.sampled_from(STEPS), tick_step=st.sampled_from([None, 1, 4]))
    def time_passes(self, step, tick_step) -> None:
        self.clock.advance(step)
        self.heartbeats_and_ticks(tick_step)

    def heartbeats_and_ticks(self, tick_step: int | None) -> None:
        for name in sorted(self.remounted):
            if self.nodes[name].stalled or name not in self.core.state.nodes:
                continue  # (a node declared dead learns it at its heartbeat: node_resumes)
            self.apply(self.core.heartbeat(next(self.call_ids), name, [f"{name}/dram0"]))
            self.last_heard[name] = self.clock()
        self.apply(self.core.timers())
        _, effects = self.core.tick(tick_step)
        self.apply(effects)

    # ------------------------------------------------------------------ a node declared dead

    @precondition(
        lambda self: (
            self.remounted == set(NODES) and not any(n.stalled for n in self.nodes.values())
        )
    )
    @rule(name=st.sampled_from(NODES))
    def node_stalls(self, name) -> None:
        """The node stops: no heartbeats, no commands run, its stream stays open."""
        node = self.nodes[name]
        node.stalled, node.stalled_at = True, self.clock()

    @precondition(lambda self: any(n.stalled for n in self.nodes.values()))
    @rule(tick_step=st.sampled_from([None, 1]))
    def a_long_silence(self, tick_step) -> None:
        """Longer than a node's TTL: the stalled node is declared dead (its segments dropped,
        nothing waits for it any more)."""
        self.clock.advance(self.CONFIG.node_ttl + 1.0)
        self.heartbeats_and_ticks(tick_step)
        while tick_step is not None and any(
            n.stalled and n.name in self.core.state.nodes for n in self.nodes.values()
        ):
            self.heartbeats_and_ticks(tick_step)  # (a tick in steps may take several)

    @precondition(lambda self: any(n.stalled for n in self.nodes.values()))
    @rule(runs_late=st.integers(0, 3), answer_lost=st.booleans())
    def node_resumes(self, runs_late, answer_lost=False) -> None:
        """The stalled node goes on. Still known to the master: as if nothing happened.
        Declared dead: it runs up to ``runs_late`` commands it had read off its stream before
        it learns that (their answers reach no one), then closes that stream, remounts with
        what it holds (``answer_lost``: the mount's answer does not reach it) and opens a
        new one."""
        [node] = [n for n in self.nodes.values() if n.stalled]
        node.stalled = False
        if node.name in self.core.state.nodes:
            return  # (or a new leader that never knew it: it remounts there, as below)
        for command in node.wire[:runs_late]:
            node.run(command)
            effects = self.core.node_answered(node.name, command.command_id, True)
            assert not effects.transmit and not effects.answers, "a dead node's answer counted"
        if node.stream is not None:
            self.core.node_disconnected(node.name, node.stream)
        node.stream, node.wire, node.lost_answer = None, [], False
        self.remount(node, silent=self.clock() - node.stalled_at, answer_lost=answer_lost)
        rebuilding = node.name not in self.remounted  # (a failover happened meanwhile)
        self.remounted.add(node.name)
        if rebuilding and self.remounted == set(NODES):
            self.check_nothing_lost_nothing_back()
        else:
            self.check_nothing_removed_back()

    @rule(chance=st.integers(0, 3))
    def leader_fails_over(self, chance) -> None:
        """The leader dies; the next one reads the tombstone records it kept (etcd), then
        waits for the nodes to remount (a stalled one may never come in its window)."""
        if chance:
            return  # (rarer than other events: a new term takes several steps to rebuild)
        published = {
            key: record.generation
            for key, record in self.core.state.objects.items()
            if record.state is ObjectState.PUBLISHED
        }
        rebuilt = self.remounted == set(NODES)
        if not rebuilt:  # a term that had not heard from every node yet:
            for key, generation in self.published.items():  # what it had not is expected
                published[key] = max(generation, published.get(key, 0))  # all the same
        self.published = published
        # (clients that acted in a term still rebuilding make its predecessor's list moot)
        clients_acted = self.clients_before_remounts and not rebuilt
        self.apply(self.core.end_term())
        assert not self.calls, f"calls left waiting by the old term: {self.calls}"
        old = self.core.state
        # (every record the I/O layer wrote: each segment's, and each node's own entry)
        ids = [i for name in NODES for i in (f"{name}/dram0", node_entry(name))]
        kept = {i: old.durable_record(i) for i in ids}
        self.epoch += 1
        self.core = self.new_core(awaited=NODES)
        self.core.state.restore_tombstones({s: r for s, r in kept.items() if r is not None})
        self.clients_before_remounts = clients_acted
        self.reserved.clear()
        self.remounted = set()
        for node in self.nodes.values():
            node.stream, node.wire = None, []
        assert not self.core.accepting_clients(), "a new leader took clients before any remount"

    def waiting_to_remount(self) -> list[str]:
        return sorted(n for n in set(NODES) - self.remounted if not self.nodes[n].stalled)

    @precondition(lambda self: self.waiting_to_remount())
    @rule(data=st.data(), silent=st.sampled_from([0.0, 0.5, 2.0]), answer_lost=st.booleans())
    def node_remounts(self, data, silent, answer_lost) -> None:
        """A node mounts its segment at a new leader; ``answer_lost``: the answer, which
        says what to drop, does not reach it (its call timed out: it mounts again, a no-op,
        and keeps what it was told to drop, until the Forgets of it arrive)."""
        name = data.draw(st.sampled_from(self.waiting_to_remount()))
        node = self.nodes[name]
        stored = sorted(node.index.values(), key=lambda o: o.generation)
        dropped = self.report(name, stored, silent, data)
        call_id = next(self.call_ids)
        if answer_lost:
            again = self.core.mount_segment(call_id, self.segment(name), stored, True, silent)
            assert again.answers.pop(call_id) == [], "a mount again of the same segment"
            self.apply(again)
            dropped = set()
        for key, generation in [k for k in node.index if k[0] in dropped]:
            del node.index[key, generation]
        fence = self.clock() - silent + self.CONFIG.write_timeout + FENCE_MARGIN
        self.fences[f"{name}/dram0"] = fence
        self.remounted.add(name)
        self.connect(node)
        if self.remounted == set(NODES):
            assert self.core.accepting_clients(), "every node remounted: clients are welcome"
            self.check_nothing_lost_nothing_back()

    def report(self, name: str, stored: list[StoredObject], silent: float, data) -> set[str]:
        """The node's report at a mount: in one call, or now and then in parts (newest first,
        as a node holding more than one call carries sends it), heartbeating between them
        now and then; the keys the master did not adopt."""
        newest_first = sorted(stored, key=lambda o: o.generation, reverse=True)
        cuts = data.draw(st.sampled_from([0, 0, 1, 2]), label="cut into parts")
        at = sorted(data.draw(st.lists(st.integers(0, len(stored)), min_size=cuts, max_size=cuts)))
        ends = zip([0, *at], [*at, len(stored)], strict=True)
        parts = [newest_first[a:b] for a, b in ends]
        dropped: set[str] = set()
        for n, part in enumerate(parts):
            more, call_id = n + 1 < len(parts), next(self.call_ids)
            if n == 0:
                effects = self.core.mount_segment(
                    call_id, self.segment(name), part, True, silent, more
                )
            else:
                effects = self.core.report_more(call_id, self.segment(name), part, more)
            answer = effects.answers.pop(call_id)
            assert answer is not None, f"part {n + 1} of {name}'s report refused"
            dropped.update(answer)
            self.apply(effects)
            if more and data.draw(st.booleans(), label="a heartbeat between parts"):
                self.apply(self.core.heartbeat(next(self.call_ids), name, [f"{name}/dram0"]))
        return dropped

    def remount(self, node: SimNode, silent: float, answer_lost: bool = False) -> None:
        """A node declared dead mounts its segment again with what it holds, drops what the
        master refuses (unless that answer is lost), and opens a new stream."""
        call_id = next(self.call_ids)
        stored = sorted(node.index.values(), key=lambda o: o.generation)
        effects = self.core.mount_segment(call_id, self.segment(node.name), stored, True, silent)
        answer = effects.answers.pop(call_id)
        dropped = set() if answer_lost else set(answer)
        self.apply(effects)
        for key in [k for k in node.index if k[0] in dropped]:
            del node.index[key]
        fence = self.clock() - silent + self.CONFIG.write_timeout + FENCE_MARGIN
        self.fences[f"{node.name}/dram0"] = fence
        self.connect(node)
        self.last_heard[node.name] = self.clock()

    def check_nothing_lost_nothing_back(self) -> None:
        state = self.core.state
        published = {} if self.clients_before_remounts else self.published
        for key, generation in published.items():
            record = state.objects.get(key)
            if record is None and self.evicted(key, generation):
                continue  # (the new leader found its segments past their high watermark)
            assert record is not None and record.generation >= generation, (
                f"published {key!r} (generation {generation}) lost in the failover; "
                f"its story: {state.story(key)}"
            )
        self.check_nothing_removed_back()

    def evicted(self, key: str, generation: int) -> bool:
        """Whether the leader evicted that generation of ``key``: a cache's right, which
        the master model checks the rules of (test_master_model.py), not a loss."""
        return any(
            event.event == "evicted" and event.details.get("put_id") == generation
            for event in self.core.state.story(key)
        )

    def check_nothing_removed_back(self) -> None:
        state = self.core.state
        for key, generation in self.removed.items():
            record = state.objects.get(key)
            assert record is None or record.generation != generation, (
                f"{key!r}, whose removal its nodes confirmed, came back after the failover"
            )

    # ------------------------------------------------------------------ invariants

    @invariant()
    def held_calls_are_answered_in_time(self) -> None:
        now = self.clock()
        for call in self.calls.values():
            limit = COMMAND_TIMEOUT if call.kind == "put_end" else FORGET_WAIT
            assert now < call.started + limit + max(STEPS), f"{call} still waits at {now}"

    @invariant()
    def the_state_is_valid(self) -> None:
        self.core.state.validate()

    @invariant()
    def the_rebuild_window_turns_clients_away_until_the_nodes_remounted(self) -> None:
        if self.remounted == set(NODES):
            assert self.core.accepting_clients()

    def teardown(self) -> None:
        self.settle()

    def settle(self) -> None:
        """Every node resumes, remounts and connects and runs everything sent to it; time
        passes beyond every wait: nothing may be left undelivered, unanswered or waiting."""
        for node in self.nodes.values():
            if node.stalled:
                self.node_resumes(0)
        for name in sorted(set(NODES) - self.remounted):
            self.node_remounts_now(name)
        for node in self.nodes.values():
            if node.lost_answer and node.stream is not None:
                self.stream_breaks(node.name)  # the broken stream is noticed at last
        for node in self.nodes.values():
            if node.stream is None:
                self.connect(node)
        for _ in range(3):
            for _ in range(200):
                busy = [n for n in self.nodes.values() if n.wire]
                if not busy:
                    break
                for node in busy:
                    command = node.wire.pop(0)
                    node.run(command)
                    self.apply(self.core.node_answered(node.name, command.command_id, True))
            self.clock.advance(COMMAND_TIMEOUT + FORGET_WAIT)
            for name in NODES:
                self.apply(self.core.heartbeat(next(self.call_ids), name, [f"{name}/dram0"]))
            self.apply(self.core.timers())
        assert not self.calls, f"calls still waiting after everything settled: {self.calls}"
        for name in NODES:
            assert self.core.delivery.unanswered(name) == [], f"{name}: unanswered commands"
            assert self.core.delivery.unsent(name) == [], f"{name}: commands never sent"
        assert len(self.core.barrier) == 0, "Forgets still hold writers back"
        assert not self.core._held_by, "Forgets answered, yet calls still noted as held by them"
        assert not self.core._trims and not self.core._trimmed, "trimmed replicas never forgotten"
        assert not self.core.state._quarantine, "space still quarantined once every node answered"

    def node_remounts_now(self, name: str) -> None:
        node = self.nodes[name]
        call_id = next(self.call_ids)
        stored = sorted(node.index.values(), key=lambda o: o.generation)
        effects = self.core.mount_segment(call_id, self.segment(name), stored, True, 0.0)
        dropped = set(effects.answers.pop(call_id))
        self.apply(effects)
        for key in [k for k in node.index if k[0] in dropped]:
            del node.index[key]
        self.remounted.add(name)


class SecureCoreModel(CoreModel):
    CONFIG = SECURE_CONFIG


# A fresh seed per run, as the other two models draw (tests/unit/model_seeds.py).
SETTINGS = settings(
    max_examples=100,
    stateful_step_count=60,
    derandomize=False,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
)


def test_master_core_model():
    run_seeded(CoreModel, SETTINGS)


def test_master_core_model_secure_with_rereplication():
    run_seeded(SecureCoreModel, SETTINGS)
