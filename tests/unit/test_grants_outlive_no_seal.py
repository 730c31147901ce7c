"""No capability outlives the seal of the Forget that ended its object.

A storage node keeps a Forget's seal until the master's grants for the segment end, as the
Forget says (storage_node/checked_seals.py). A GetReplicas answer held behind a tombstone
write is sent, and its grants signed, after the core answered; a Forget of the same object
may go out meanwhile. The grants' expiry is fixed, and noted, when the core answers
(``CoreDriver.call``'s prepare): before, a grant signed later, with an expiry counted from
then, outlived a seal of 10 s, and the space went to another tenant's object while the
stale grant could still read it.
"""

from __future__ import annotations

import dataclasses

from state_helpers import FakeClock, KiB, segment_info

from kvpool.master.access import key_prefix
from kvpool.master.capability_keys import MasterKeys, load_or_create
from kvpool.master.config import MasterConfig
from kvpool.master.core import MasterCore
from kvpool.master.driver import CoreDriver, Pending
from kvpool.master.handlers import MasterHandlers
from kvpool.master.records import Commit, PersistCommand, PutOptions
from kvpool.master.state import MasterState
from kvpool.proto import master_pb2 as pb
from kvpool.security import capabilities as caps
from kvpool.security.identity import Identity, Role
from kvpool.storage_node.checked_seals import SEAL_MARGIN, Seals

SKEW_MS = 1000
TENANT_A = Identity(name="a", role=Role.CLIENT, tenant="a")


class TombstoneWriteUnderWay:
    """A record writer whose write is still under way: answers wait for it."""

    busy = True

    def __init__(self) -> None:
        self.done: list = []

    def write(self, records, done) -> None:
        self.done.append(done)


class Master:
    """The master's layers in one process (core, driver, handlers), a node's command stream
    recorded, one published object "X" of tenant A on a segment served over the checked
    stream, and no grant of its put running any more."""

    def __init__(self, tmp_path) -> None:
        self.clock = clock = FakeClock()
        self.wall_offset_ms = 0  # (the master's wall clock, stepped by tests)
        config = MasterConfig(capability_skew=SKEW_MS / 1000, high_watermark=1.0)
        self.state = state = MasterState(config, clock=clock)
        self.core = core = MasterCore(state, forget_wait=1.0, command_timeout=5.0)
        self.driver = driver = CoreDriver(core)
        self.handlers = handlers = MasterHandlers(driver)
        handlers.capability_keys = MasterKeys(load_or_create(tmp_path / "keys.json"), 0.0)
        handlers.wall_ms = lambda: int(clock() * 1000) + self.wall_offset_ms
        driver.grants_end_ms = handlers.grants_end_ms
        self.info = info = dataclasses.replace(
            segment_info("n1", 64 * KiB), checked_address="127.0.0.1:7000"
        )
        core.mount_segment(0, info, [], False, 0.0)
        self.sent: list[pb.NodeCommand] = []
        driver.node_connected("n1", "process", self.sent.append, lambda: None)
        key = key_prefix(TENANT_A) + "X"
        [slot] = core.put_start(1, "c", [key], [4 * KiB], PutOptions(replicas=1)).answers[1]
        effects = core.put_end(2, [Commit(key, slot.put_id, (True,))])
        [persist] = [c for c in effects.transmit if isinstance(c, PersistCommand)]
        core.node_answered("n1", persist.command_id, True)
        for beat in range(30):  # (no grant of the put runs any more; the node is heard)
            clock.advance(1)
            core.heartbeat(100 + beat, "n1", [info.segment_id])
            core.tick()

    def remove(self, key: str = "X") -> pb.Forget:
        """Tenant A removes ``key`` by force: the Forget its node gets."""
        self.sent.clear()
        self.handlers.Remove(pb.RemoveRequest(client_id="c", keys=[key], force=True), TENANT_A)
        [forget] = [m.forget for m in self.sent if m.HasField("forget")]
        return forget


def answered_once_written(held: Pending, writing: TombstoneWriteUnderWay):
    """The tombstone write under way ends: the answer held behind it, now sent."""
    for done in writing.done:
        done(True)
    answered: list = []
    held.then(lambda response, refused: answered.append((response, refused)))
    [(response, refused)] = answered
    assert refused is None
    return response


def test_a_grant_signed_after_its_objects_forget_is_still_refused_until_it_expires(tmp_path):
    master = Master(tmp_path)
    clock, handlers, driver, info = master.clock, master.handlers, master.driver, master.info
    driver.durable = writing = TombstoneWriteUnderWay()
    request = pb.GetReplicasRequest(client_id="c", keys=["X"], lease_ms=600_000)
    held = handlers.GetReplicas(request, TENANT_A)
    assert isinstance(held, Pending), "the answer waits for the tombstone write"
    forget = master.remove()
    response = answered_once_written(held, writing)
    grant = caps.parse(response.objects[0].replicas[0].capability)
    assert forget.grants_end_ms >= grant.expiry_ms + SKEW_MS, "the Forget knew of the grant"

    # the node seals as the Forget says, and refuses the grant until it has expired
    node_now = [clock()]
    seals = Seals(lambda: node_now[0])
    objects = [(o.offset, o.generation) for o in forget.objects]
    seals.forget(info.segment_id, objects, grants_end_ms=forget.grants_end_ms)
    digest = caps.segment_digest(info.segment_id)
    node_now[0] = (grant.expiry_ms + SKEW_MS) / 1000  # (honoured until expiry + allowance)
    seals.forget(info.segment_id, [])
    assert seals.sealed(digest, grant.offset, grant.grant_id, write=False)
    node_now[0] += SEAL_MARGIN + 1
    seals.forget(info.segment_id, [])
    assert len(seals) == 0


def test_a_step_of_the_masters_wall_clock_back_shortens_no_seal(tmp_path):
    master = Master(tmp_path)
    request = pb.GetReplicasRequest(client_id="c", keys=["X"], lease_ms=60_000)
    response = master.handlers.GetReplicas(request, TENANT_A)
    grant = caps.parse(response.objects[0].replicas[0].capability)
    master.wall_offset_ms = -120_000  # (an NTP step, a VM resumed)
    forget = master.remove()
    assert forget.grants_end_ms >= grant.expiry_ms + SKEW_MS


def test_a_write_grant_signed_after_its_reservations_forget_is_counted_too(tmp_path):
    master = Master(tmp_path)
    master.driver.durable = writing = TombstoneWriteUnderWay()
    request = pb.PutStartRequest(client_id="c", keys=["Y"], sizes=[4 * KiB])
    held = master.handlers.PutStart(request, TENANT_A)
    assert isinstance(held, Pending), "the answer waits for the tombstone write"
    forget = master.remove("Y")
    response = answered_once_written(held, writing)
    grant = caps.parse(response.slots[0].replicas[0].capability)
    assert forget.grants_end_ms >= grant.expiry_ms + SKEW_MS, "the Forget knew of the grant"
