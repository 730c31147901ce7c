"""Model check of re-replication in the master's core (``master/state.py``, replication.py).

The two model tests beside this one (test_master_model.py, test_master_core_model.py) run
with re-replication off: their predictions of every command a node gets assume that no
object is ever copied between nodes. This one turns it on and drives ``MasterState`` (fake
clock, seeded placement) through random sequences of what re-replication must survive, on a
small cluster of storage nodes with one segment each and an index of what they recorded (one
entry per key, as a node keeps it; kept across a node's death, as a persistent segment's):

- clients put objects with one to three replicas, commit them at once, read and remove them;
- nodes run the commands the master sent, in order, each one succeeding or failing: Persist
  records objects, Forget drops the generation it names, Copy reads the object from its source
  node (it fails when that node is dead or no longer holds it) and records it;
- nodes die (a commands' stream breaks: what the master waits for expires), so that objects
  fall below their replica count and copies start, complete or fail; a dead node comes back
  with what it recorded once the master declared it dead, bringing surplus replicas that the
  master trims;
- time passes (heartbeats of the live nodes, the master's tick, rate and retry timers);
- the master fails over: a new term starts from an empty index and every live node remounts
  with what it recorded, the count each object should have included.

Invariants, after every step:

1. the core's own invariants hold (``MasterState.validate``);
2. a replica is readable only once its node recorded it: every replica of a published object
   lies where its node's index lists that generation (a copy's target never before the node
   answered the copy);
3. never fewer than one replica while one exists: an object published and not removed, that a
   live node recorded (and has not been told to forget), is published with a replica;
4. counts converge: once every node ran what it was sent and time passed beyond the node TTL
   and every retry (``settle``, at the end of every example, then again once every dead node
   came back with what it recorded), each object lies on as many live nodes as its put got
   (fewer only when fewer nodes live), no more, across failovers.

Every run draws a fresh seed (``KVPOOL_MODEL_SEED`` replays one, printed with a failure, as
for test_master_model.py): runs together check more sequences than one run does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from model_seeds import run_seeded
from state_helpers import FakeClock, segment_info

from kvpool.common.status import KeyStatus
from kvpool.master.config import MasterConfig
from kvpool.master.records import (
    Commit,
    CopyCommand,
    ForgetCommand,
    NodeCommand,
    ObjectState,
    PersistCommand,
    PutOptions,
    StoredObject,
)
from kvpool.master.state import MasterState

CONFIG = MasterConfig(
    node_ttl=2.0,
    rereplication_rate=64 * 1024,
    rereplication_copies=2,
    lease_ttl=1.0,
    reclaim_delay=1.0,
)
NODES = ("n0", "n1", "n2", "n3")
KEYS = ("a", "b", "c", "d", "e", "f")
SEGMENT = 64 * 1024  # (six keys of at most 4 KiB, three replicas each: never evicted)
CRC = 0xC0FFEE
STEPS = (0.1, 0.5, 1.0, 2.5)


@dataclass
class SimNode:
    name: str
    alive: bool = True
    #: key -> the object as this node recorded it (kept across its death: a persistent segment).
    index: dict[str, StoredObject] = field(default_factory=dict)
    #: Commands sent to this node's process, not yet run.
    pending: list[NodeCommand] = field(default_factory=list)

    def record(self, item: StoredObject) -> None:
        """As a node's index does: never over a newer generation (object_index.py)."""
        held = self.index.get(item.key)
        if held is None or item.generation >= held.generation:
            self.index[item.key] = item

    def told_to_forget(self, key: str, generation: int) -> bool:
        """A Forget of this generation waits in the node's queue."""
        return any(
            isinstance(command, ForgetCommand)
            and any(o.key == key and o.generation == generation for o in command.objects)
            for command in self.pending
        )

    def holds(self, key: str, generation: int, offset: int | None = None) -> bool:
        item = self.index.get(key)
        return (
            item is not None
            and item.generation == generation
            and (offset is None or item.offset == offset)
        )


@dataclass
class Expected:
    """An object the model knows published and not removed."""

    generation: int
    wanted: int  # the replicas its put got


class ReplicationModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.epoch = 1
        self.state = self.new_master()
        self.nodes = {name: SimNode(name) for name in NODES}
        self.expected: dict[str, Expected] = {}
        #: put id -> (key, replicas its put got), of commits not resolved yet.
        self.commits: dict[int, tuple[str, int]] = {}

    def new_master(self) -> MasterState:
        return MasterState(
            CONFIG, clock=self.clock, rng=random.Random(self.epoch), epoch=self.epoch
        )

    @initialize(sizes=st.lists(st.integers(1, 4096), min_size=1, max_size=4))
    def mount_every_node_and_put_some_objects(self, sizes) -> None:
        """(Objects with two replicas from the start: the rules find them to copy sooner.)"""
        for name in NODES:
            self.state.mount_segment(segment_info(name, SEGMENT))
        self.put(list(zip(KEYS, sizes, strict=False)), 2, record=True)

    # ------------------------------------------------------------------ the I/O layer's part

    def collect(self) -> None:
        """Hands what the master sent to the nodes' processes (a dead node's stream is broken:
        what the master waits for on it expires), and takes in the commits it resolved."""
        state = self.state
        while state.outbox:
            sent = list(state.outbox)
            state.outbox.clear()
            for command in sent:
                node = self.nodes[command.node_id]
                if node.alive:
                    node.pending.append(command)
                elif isinstance(command, PersistCommand | CopyCommand):
                    state.command_expired(command.command_id)
        for result in state.resolved:
            key, wanted = self.commits.pop(result.put_id)
            if result.status is KeyStatus.OK:
                self.expected[key] = Expected(result.put_id, wanted)
        state.resolved.clear()

    def live_holders(self, key: str) -> set[str]:
        """The live nodes that recorded the object and were not told to forget it (a
        surplus replica the master trimmed: its Forget may still wait in the node's queue
        when the replicas it kept are lost)."""
        generation = self.expected[key].generation
        return {
            n.name
            for n in self.nodes.values()
            if n.alive and n.holds(key, generation) and not n.told_to_forget(key, generation)
        }

    def remount(self, node: SimNode, silent: float) -> None:
        stored = sorted(node.index.values(), key=lambda o: o.generation)
        dropped = self.state.mount_segment(
            segment_info(node.name, SEGMENT), stored, remount=True, silent=silent
        )
        for key in dropped:
            node.index.pop(key, None)  # (the node forgets what the master did not adopt)
        self.collect()

    # ------------------------------------------------------------------ clients

    @rule(
        batch=st.lists(
            st.tuples(st.sampled_from(KEYS), st.integers(1, 4096)),
            min_size=1,
            max_size=3,
            unique_by=lambda t: t[0],
        ),
        replicas=st.sampled_from([1, 2, 2, 3]),
        record=st.sampled_from([False, True, True]),
    )
    def put(self, batch, replicas, record) -> None:
        """Puts and commits; ``record``: the nodes run their Persists at once."""
        keys = [k for k, _ in batch]
        slots = self.state.put_start(
            "c", keys, [s for _, s in batch], PutOptions(replicas=replicas)
        )
        commits = []
        for key, slot in zip(keys, slots, strict=True):
            if slot.status is KeyStatus.OK:
                self.commits[slot.put_id] = (key, len(slot.replicas))
                commits.append(Commit(key, slot.put_id, (True,) * len(slot.replicas), CRC))
        if commits:
            self.state.put_end(commits)
        self.collect()
        if record:
            for node in self.nodes.values():
                while node.pending:
                    self.run(node, node.pending.pop(0), True)
                    self.collect()

    @rule(key=st.sampled_from(KEYS), force=st.booleans())
    def remove(self, key, force) -> None:
        [status] = self.state.remove([key], force)
        if status is KeyStatus.OK:
            self.expected.pop(key, None)
        self.collect()

    @rule(key=st.sampled_from(KEYS))
    def read(self, key) -> None:
        [location], _ = self.state.get_replicas([key], 0.5)
        if key in self.expected and self.live_holders(key):
            assert location.status is KeyStatus.OK, f"{key!r} unreadable: {location}"
        for replica in location.replicas:
            node = self.nodes[replica.segment.node_id]
            offset = replica.address - replica.segment.base_address
            assert node.holds(key, self.state.objects[key].generation, offset), (
                f"{key!r} read from {node.name}+{offset}, which has not recorded it"
            )
        self.collect()

    # ------------------------------------------------------------------ nodes

    @precondition(lambda self: any(n.pending for n in self.nodes.values()))
    @rule(data=st.data())
    def node_runs_commands(self, data) -> None:
        name = data.draw(st.sampled_from(sorted(n for n in NODES if self.nodes[n].pending)))
        node = self.nodes[name]
        for _ in range(data.draw(st.integers(1, 3))):
            if not node.pending:
                break
            self.run(node, node.pending.pop(0), data.draw(st.sampled_from([True] * 4 + [False])))
        self.collect()

    def run(self, node: SimNode, command: NodeCommand, ok: bool) -> None:
        state = self.state
        if isinstance(command, ForgetCommand):
            for item in command.objects:
                if node.holds(item.key, item.generation, item.offset):
                    del node.index[item.key]
            state.forget_answered(command.command_id)  # (as the I/O layer relays the answer)
        elif isinstance(command, PersistCommand):
            if ok:
                for item in command.objects:
                    node.record(item)
            state.command_done(command.command_id, ok, [CRC] * len(command.objects) if ok else [])
        elif isinstance(command, CopyCommand):
            source = command.source
            if command.source_segment is not None:  # from another node, over the network
                peer = self.nodes[command.source_segment.node_id]
                ok = ok and peer.alive and peer.holds(source.key, source.generation, source.offset)
            if ok:
                node.record(command.target)
            event("copy recorded" if ok else "copy failed")
            state.command_done(command.command_id, ok, [CRC] if ok else [])

    @precondition(lambda self: sum(n.alive for n in self.nodes.values()) >= 3)
    @rule(name=st.sampled_from(NODES), declared=st.booleans())
    def node_dies(self, name, declared) -> None:
        """A node dies; ``declared``: time passes until the master declares it dead."""
        node = self.nodes[name]
        if not node.alive:
            return
        node.alive = False
        for command in node.pending:
            if isinstance(command, PersistCommand | CopyCommand):
                self.state.command_expired(command.command_id)
        node.pending = []
        self.collect()
        if any(len(n.pending) for n in self.nodes.values()):
            event("a node died with commands pending elsewhere")
        if declared:
            self.pass_time(CONFIG.node_ttl + 0.5)

    @precondition(
        lambda self: any(
            not n.alive and n.name not in self.state.nodes for n in self.nodes.values()
        )
    )
    @rule(data=st.data(), silent=st.sampled_from([0.0, 1.0, 5.0]))
    def node_comes_back(self, data, silent) -> None:
        """A node the master declared dead restarts with its persistent segment."""
        name = data.draw(
            st.sampled_from(
                sorted(n for n in NODES if not self.nodes[n].alive and n not in self.state.nodes)
            )
        )
        node = self.nodes[name]
        node.alive = True
        self.remount(node, silent)

    # ------------------------------------------------------------------ time and terms

    @rule(step=st.sampled_from(STEPS))
    def time_passes(self, step) -> None:
        self.pass_time(step)

    def pass_time(self, step: float) -> None:
        self.clock.advance(step)
        for node in self.nodes.values():
            if node.alive and self.state.heartbeat(node.name, [f"{node.name}/dram0"]):
                self.remount(node, step)  # the master lost it: it asks for a remount
        trimmed = self.state.counters.replicas_trimmed
        self.state.tick()
        if self.state.snapshot().under_replicated:
            event("objects under-replicated")
        if self.state.counters.replicas_trimmed > trimmed:
            event("surplus trimmed")
        self.collect()

    @rule(chance=st.integers(0, 3))
    def master_fails_over(self, chance) -> None:
        if chance:
            return  # (rarer than other events)
        self.epoch += 1
        self.state = self.new_master()
        self.commits.clear()
        for node in self.nodes.values():
            node.pending = []  # its stream to the old master broke
        for node in self.nodes.values():
            if node.alive:
                self.remount(node, 0.5)
        if any(len(r.replicas) < r.wanted for r in self.state.objects.values()):
            event("failover: an object adopted below its count")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def the_state_is_valid(self) -> None:
        self.state.validate()

    @invariant()
    def replicas_are_readable_only_where_recorded(self) -> None:
        segments = self.state.segments
        for key, record in self.state.objects.items():
            if record.state is not ObjectState.PUBLISHED:
                continue
            for replica in record.replicas:
                assert replica is not None
                node = self.nodes[segments[replica.segment_id].node_id]
                assert node.holds(key, record.generation, replica.offset), (
                    f"{key!r} (generation {record.generation}) is readable on {node.name}+"
                    f"{replica.offset}, which has not recorded it: {node.index.get(key)}"
                )

    @invariant()
    def an_object_a_live_node_holds_keeps_a_replica(self) -> None:
        for key in list(self.expected):
            if not self.live_holders(key):
                # every node that recorded it died (or forgot it): it may be lost
                del self.expected[key]
                continue
            record = self.state.objects.get(key)
            generation = self.expected[key].generation
            assert record is not None and record.generation == generation, (
                f"{key!r} (generation {generation}) lost while {self.live_holders(key)} hold it"
            )
            assert record.state is ObjectState.PUBLISHED and record.replicas, record

    def teardown(self) -> None:
        self.settle()
        for node in self.nodes.values():  # the dead come back: their surplus goes
            if not node.alive:
                self.pass_time(CONFIG.node_ttl + 0.5)  # (declared dead first)
                node.alive = True
                self.remount(node, 0.0)
        self.settle()

    def settle(self) -> None:
        """Every live node runs what it was sent, successfully; time passes beyond the node
        TTL and every retry: each object lies on as many live nodes as its put got."""
        quiet = 0
        for _ in range(120):
            busy = False
            for node in self.nodes.values():
                while node.pending:
                    busy = True
                    self.run(node, node.pending.pop(0), True)
                    self.collect()
            self.pass_time(0.5)
            moving = any(r.moving for r in self.state.objects.values())
            quiet = 0 if busy or moving else quiet + 1
            if quiet >= 12:  # (beyond the node TTL and a retry, nothing happened)
                break
        assert quiet >= 12, "re-replication did not settle"
        self.an_object_a_live_node_holds_keeps_a_replica()
        live = sum(n.alive for n in self.nodes.values())
        segments = self.state.segments
        for key, expected in self.expected.items():
            record = self.state.objects[key]
            nodes = [segments[r.segment_id].node_id for r in record.replicas if r is not None]
            assert len(nodes) == len(set(nodes)), f"{key!r} twice on a node: {nodes}"
            assert len(nodes) == min(expected.wanted, live), (
                f"{key!r} wants {expected.wanted} replicas, {live} nodes live, on {nodes} "
                f"(the master wants {record.wanted})"
            )
            assert all(self.nodes[n].alive for n in nodes), nodes
        assert self.state.snapshot().under_replicated == sum(
            1
            for record in self.state.objects.values()
            if record.state is ObjectState.PUBLISHED and len(record.replicas) < record.wanted
        )


SETTINGS = settings(
    max_examples=200,
    stateful_step_count=60,
    derandomize=False,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
)


def test_master_replication_model():
    run_seeded(ReplicationModel, SETTINGS)
