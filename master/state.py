"""The master's metadata core: a synchronous state machine with an injected clock.

No gRPC, threads, sleeps or wall-clock reads live here: each public method is one event (a
node mounts a segment, a client starts a put, a node acknowledges a command, time passes),
applies the rules of the object life cycle and returns its result as plain data. Commands for
storage nodes collect in ``outbox`` and finished commits in ``resolved``; the gRPC service in
``service.py`` sends the first and answers the clients of the second. This is what lets the
tests drive every rule deterministically with a fake clock.

Life cycle of an object::

    put_start ──> RESERVED ──put_end──> COMMITTED ──nodes record it──> PUBLISHED
                     │ put_revoke, timeout,         │ every replica's node     │ remove,
                     │ writer declared dead,        │ failed or died           │ eviction,
                     v replicas lost                v                          v node loss
                   gone (space freed, or quarantined while a writer may still be copying)

Every change of an object's state, its creation and end included, goes through
``_transition``, which checks it against the table of legal transitions (transitions.py) and
notes it in the key's story (story.py): ``story(key)`` tells what happened to a key, and
``validate()`` checks that its indexes agree with each other (invariants.py).

Storage nodes are the source of truth for what they hold: an object is published only once
every node holding a replica has recorded it (durably, on a persistent segment), so a node that
remounts after a restart of itself or of the master can report it, and the master re-adopts it.

The rules that keep bytes safe:

* Space is never reused while a reader may still be copying out of it (its lease) or a writer
  that lost its reservation may still be copying into it (``reclaim_delay`` after the
  reservation ends). Such buffers wait in ``_deferred`` until their release time.
* Nor while a node may still be copying into it: the target of a copy cancelled in flight
  (its object removed, its source withdrawn) stays allocated until the node answers; if the
  I/O layer gives up on the answer instead, for ``reclaim_delay`` more. A Persist or Copy
  given up on is followed by a Forget, so that a node recording it late drops the entry again
  (commands run in order on a node) and never reports it on a remount.
* A leased object is never removed (unless forced, and then its space still waits for the
  lease), never evicted. Unpublished objects are never evicted.
* Eviction is least-recently-used; soft-pinned objects go only after all unpinned ones,
  hard-pinned objects never. A DRAM replica is demoted to NVMe on the same node, rather than
  dropped, when that node has NVMe room.
* With quotas in force (``set_quotas``, quotas.py), a put or lease that would take its tenant
  over a quota is refused (QUOTA_EXCEEDED), and eviction is fair: a put evicts only its own
  tenant's objects and those of tenants above their guaranteed share of the tier; the
  watermark takes those first, then falls back to plain LRU. Each tenant's usage is kept up
  to date at every change (``_transition``, ``_own``/``_disown``, leases), never scanned.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
import random
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from kvpool.common.keys import STORED_KEY_BYTES, key_problem, plainly_valid
from kvpool.common.sizes import format_size
from kvpool.common.status import (
    OWN_RESERVATION,
    OWN_RESERVATION_END,
    WRITER_HOLDS_RANGE,
    KeyStatus,
    Pin,
    Tier,
)
from kvpool.master.allocator import Allocator
from kvpool.master.config import MasterConfig
from kvpool.master.invariants import check_invariants
from kvpool.master.key_index import KeyIndex
from kvpool.master.lru import LruIndex
from kvpool.master.placement import TierPool
from kvpool.master.quarantine import Quarantine
from kvpool.master.quotas import Quotas, TenantUsage, default_share, refusal
from kvpool.master.records import (
    NO_SEGMENTS,
    ClusterSnapshot,
    Commit,
    CommitResult,
    CopyCommand,
    Counters,
    DrainProgress,
    ForgetCommand,
    KeyPage,
    Location,
    Move,
    NodeCommand,
    NodeRecord,
    ObjectInfo,
    ObjectRecord,
    ObjectState,
    PersistCommand,
    PlacedReplica,
    PrefixRemoval,
    PrepareCommand,
    PutOptions,
    PutSlot,
    Replica,
    SegmentInfo,
    SegmentRecord,
    SegmentUsage,
    StoredObject,
    TickReport,
    UnreadableReplica,
    make,
)
from kvpool.master.replication import ReplicationQueue
from kvpool.master.story import StoryEvent, StoryLog
from kvpool.master.tombstones import ANY as ANY_PLACE
from kvpool.master.tombstones import MAX_AGE as TOMBSTONE_MAX_AGE
from kvpool.master.tombstones import NODE_PREFIX, DurableRecord, Tombstones
from kvpool.master.transitions import (
    COMMITTED,
    GONE,
    LEGAL_BY_ID,
    PUBLISHED,
    RESERVED,
    IllegalTransition,
)
from kvpool.security.identity import split_key, tenant_of

Clock = Callable[[], float]

#: The tiers an object that asks for none may go to, in order.
_ANY_TIER = (Tier.DRAM, Tier.NVME)
#: Enum members the per-key paths name, by plain names (as transitions.py's states): reading
#: a member off its Enum class is slow on Python 3.11, and a put named about ten of them.
_OK, _SOFT, _DRAM, _NVME, _ANY = KeyStatus.OK, Pin.SOFT, Tier.DRAM, Tier.NVME, Tier.UNSPECIFIED
#: The objects of a tenant that holds none.
_NO_OBJECTS: Mapping[str, ObjectRecord] = MappingProxyType({})
#: Generations a node may report lie below this: put ids go on from the largest adopted, and
#: must stay within the wire's 64 bits for as many puts as any cluster makes. (A generation of
#: a later term than this master's is taken: a master whose clock went back starts a smaller
#: epoch, and the objects its predecessor wrote are still good.)
GENERATIONS_END = (1 << 64) - (1 << 40)
#: The most keys one ListKeys answer holds, whatever the caller asks (the rest: the next
#: page): the listing runs on the master's event loop, between every other call.
MAX_LIST_PAGE = 10_000
#: The most published objects one RemovePrefix call removes (the rest: the next call, from
#: where this one stopped): a removal runs on the master's event loop too, and costs more per
#: key than a listing (each removed replica's space is freed and its node told).
MAX_REMOVAL_PAGE = 4096
#: How many epochs ahead of this master's a reported generation's may be: a lone master's
#: epoch is its start time in seconds, and its clock may have gone back (a day here).
EPOCHS_AHEAD = 86_400
#: Seconds added to the write timeout when fencing. The fence counts from the node's last
#: contact with a master, and that master may have granted writes there until its next
#: heartbeat could have come (a node heartbeats every second by default); half a second more
#: for clock rates and network delays.
FENCE_MARGIN = 1.5
#: Ended leases a lease refused for its tenant's quota first counts out, at most (they may
#: still be counted as held until a tick gets to them).
LEASE_SWEEP = 1024


#: Segments one node may have mounted at once (a node's tiers and paths: a handful; the
#: bound keeps a broken or hostile node from growing the master's tables without end).
MAX_NODE_SEGMENTS = 64
#: Seconds a node that left a command unanswered past its wait gets no new objects (unless
#: no other node could take them), or until it answers one: without it, every put placed
#: there would wait out the command timeout and fail, for as long as the node stays hung.
SILENT_NODE_PAUSE = 30.0
#: Seconds past a reservation's write window (its creation plus ``write_timeout``) before its
#: late Forget goes (``_release_reservation``): the window is the writer's, timed from before
#: its PutStart was sent, so it ends before the master's; this only covers two clocks' rates.
WRITER_WINDOW_MARGIN = 0.5
#: Nodes remembered (the latest) to have left a drain with objects lost (``left_with_losses``).
MAX_LEFT_WITH_LOSSES = 1024
#: Nodes named, at most, where every node went silent (``all_silent``).
MAX_SILENT_NAMED = 5
#: Committing objects whose node's failure to record them is kept for their answer, at most.
MAX_PERSIST_ERRORS = 4096
#: The most of a node's error message passed on to a writer.
MAX_ERROR_CHARS = 200
#: Objects whose last copy failed remembered with its source (``_copy_failed_from``), at most.
MAX_COPY_FAILURES_KEPT = 65536
#: Seconds an NVMe segment whose node failed a demotion into it takes no more demotions (its
#: disk fails writes, or its file was cut short): the watermark evicts instead, rather than
#: trying the same copy again at every tick.
DEMOTION_PAUSE = 10.0
#: Unreadable replicas one heartbeat may report, at most (the rest: the next ones).
MAX_UNREADABLE_REPORTS = 256
#: Seconds late a tick may come without counting as the master's own silence: ordinary
#: scheduling on a busy loop (a later tick forgives, see ``tick``'s ``late_by``).
OWN_SILENCE_MIN = 0.5
#: With quotas in force, one tenant holds at most this fraction (1/N) of the master's object
#: table as reservations (``_reservations_refusal``): far above what puts under way need
#: (a batch's keys, for the moments of its copy), far below a table full of them.
RESERVATIONS_SHARE = 8
#: ... and at least this many, whatever the table (a small one is a test's or a demo's).
RESERVATIONS_MIN = 64


def _exists(record: ObjectRecord, client_id: str, now: float, reservation_timeout: float) -> str:
    """Why a put of ``record``'s key is refused: the object exists or is being written; by
    this same client, most likely a put of it whose answer this client did not get (its
    call timed out), which no other put holds and which ends by itself."""
    if record.state is ObjectState.PUBLISHED:
        return f"object {record.key!r} exists"
    if not client_id or record.client_id != client_id:  # (no id: no telling callers apart)
        return f"object {record.key!r} is being written"
    if record.state is ObjectState.COMMITTED:  # (its PutEnd's answer lost, say)
        return (
            f"object {record.key!r}{OWN_RESERVATION}, committed and waiting for its storage "
            "nodes to record it: it is published within moments (then it exists), or, "
            f"should its nodes fail, the key is free again: {OWN_RESERVATION_END}"
        )
    left = max(0.0, record.created_at + reservation_timeout - now)
    return (
        f"object {record.key!r}{OWN_RESERVATION}, whose answer this client did not get "
        "(its call timed out, or it is still running in another thread): that "
        f"reservation ends by itself within {left:.0f} s unless it is committed "
        f"(--reservation-timeout): {OWN_RESERVATION_END}"
    )


class MasterState:
    def __init__(
        self,
        config: MasterConfig | None = None,
        *,
        clock: Clock,
        rng: random.Random | None = None,
        epoch: int = 0,
    ) -> None:
        """``epoch`` orders this master's writes after those of earlier masters (it becomes
        the top 32 bits of every put id, i.e. of every object's generation)."""
        self.config = config or MasterConfig()
        self.clock = clock
        self.rng = rng or random.Random()
        #: When this master's term began (its state is made at its election): an earlier
        #: master may have granted writers space until then, which this one cannot know.
        self.term_started = clock()
        self.nodes: dict[str, NodeRecord] = {}
        self.segments: dict[str, SegmentRecord] = {}
        self.objects: dict[str, ObjectRecord] = {}
        #: The same objects by tenant and key as the tenant's clients name it (``split_key``):
        #: a client's lookup finds its keys without rebuilding each behind its tenant's prefix.
        #: Kept with ``objects`` in ``_transition``; tenants holding nothing are dropped.
        self._tenant_objects: dict[str, dict[str, ObjectRecord]] = {}
        self.counters = Counters()
        #: client id -> last time it was heard from (while it holds reservations).
        self.clients: dict[str, float] = {}
        #: When the master last forgave its own silence (``tick``'s ``late_by``).
        self._forgiven_at: float | None = None
        #: Commands for storage nodes, to be sent by the I/O layer (which empties it).
        self.outbox: list[NodeCommand] = []
        #: PutEnds that were waiting for nodes and now have an answer (emptied by the I/O layer).
        self.resolved: list[CommitResult] = []
        #: key -> (put id, why) of a committing object a node failed to record, until its
        #: commit is answered; bounded (``MAX_PERSIST_ERRORS``): it only adds to an answer.
        self._persist_errors: dict[str, tuple[int, str]] = {}
        self._published_keys = KeyIndex()
        self._lru = LruIndex()
        #: Segments let go of (their node declared dead, unmounted, replaced) while writers
        #: this master granted space in them may still copy: segment id -> the last grant.
        #: Kept a write timeout, so that a remount in that time fences their space.
        self._dropped_grants: dict[str, float] = {}
        #: segment id -> until when (this state's clock) a capability this master signed for
        #: a range of it may run (the handlers note each). The node's seals, which end a
        #: capability early, live in its process: a segment mounted again by a new process
        #: under the same id (NVMe, --dram-shm) takes no new object until they have run out,
        #: or a reader of a removed object could read what is put there next. Past ones go
        #: at each tick.
        self.capabilities_until: dict[str, float] = {}
        #: segment id -> when it went away (dropped, or restored from an earlier leader's
        #: record), oldest first, until it mounts again: its tombstones go at
        #: ``tombstones.MAX_AGE``.
        self._away_since: dict[str, float] = {}
        #: Reservations by creation time (oldest first): timeouts pop from the front.
        self._reservations: OrderedDict[str, ObjectRecord] = OrderedDict()
        self._reservations_of: dict[str, set[str]] = {}
        #: command id -> (segment, objects) of a Persist or Copy command not yet answered.
        self._awaiting: dict[int, tuple[str, tuple[ObjectRecord, ...]]] = {}
        #: Persist command id -> what it told the node to record (for a late answer).
        self._persisting: dict[int, tuple[StoredObject, ...]] = {}
        #: Copy command id -> its target's offset, while awaited (a late write's place, at
        #: a remount, after the copy itself was cancelled: ``_late_writes``).
        self._copy_places: dict[int, int] = {}
        #: (segment, key, generation) -> how many Persists and Copies of it there are awaited
        #: (``_written_there``), kept with ``_awaiting``.
        self._awaited_writes: dict[tuple[str, str, int], int] = {}
        #: (release_at, seq, segment, offset): buffers waiting to be freed. The record itself,
        #: not its id, so that a buffer of a dropped and remounted segment is never freed twice.
        self._deferred: list[tuple[float, int, SegmentRecord, int]] = []
        #: (due, seq, segment, record, offset): Forgets of ended reservations on segments
        #: that clients on their node's host write themselves, sent as their space is freed,
        #: once the writer's window is over (``_release_reservation``).
        self._late_forgets: list[tuple[float, int, SegmentRecord, ObjectRecord, int]] = []
        #: Sequence numbers of ``_deferred`` entries that are copy targets a same-host writer
        #: held (``_move_done``): left alone a while, though the node wrote nothing there.
        self._resting: set[int] = set()
        #: While a PutStart runs: what comes free in each tier, for its NO_SPACE messages.
        self._coming_free_by_tier: dict[tuple[Tier, str], str] | None = None
        #: command id -> (segment, offset, object, not before): targets of copies cancelled
        #: while their node may still be writing them; freed once it answers.
        self._parked: dict[int, tuple[SegmentRecord, int, ObjectRecord, float]] = {}
        #: (time, seq, object) of soft pins and leases that may end then (checked when due).
        self._pin_ends: list[tuple[float, int, ObjectRecord]] = []
        self._lease_ends: list[tuple[float, int, ObjectRecord]] = []
        #: tier -> the bytes in use an eviction pass over the tier's pool brings it back to,
        #: while one is under way (as SegmentRecord.evict_to for one segment).
        self._pool_evict_to: dict[Tier, float] = {}
        #: Space a node may still list under objects whose Forgets it left unanswered too long
        #: (quarantine.py): no buffer freed there is reused until it answers.
        self._quarantine = Quarantine()
        #: What remounting segments may report but must not bring back (tombstones.py).
        self._tombstones = Tombstones()
        #: Per tenant (``tenant_of`` its keys): what its objects hold now, kept up to date at
        #: each change (``_transition``, ``_own``/``_disown``, leases): no scans. Tenants
        #: holding nothing are dropped.
        self._usage: dict[str, TenantUsage] = {}
        #: The quotas in force (``set_quotas``); None: none, and eviction in plain LRU order.
        self.quotas: Quotas | None = None
        #: Whether some tenant is held to a quota of objects, bytes or leases (else the
        #: checks are skipped on the hot paths).
        self._put_quotas = self._lease_quotas = False
        #: (tenant, quota) -> keys refused for it (puts and leases).
        self.quota_refusals: Counter[tuple[str, str]] = Counter()
        #: Re-replication (``config.rereplication_rate``; replication.py): objects that lie
        #: on fewer nodes than they should, surplus replicas, copies in flight.
        self._replication = ReplicationQueue(
            self.config.rereplication_rate, self.config.rereplication_copies, clock()
        )
        #: node id -> until when it counts as silent: it left a command unanswered past its
        #: wait (a hung disk, say, while its heartbeats go on). Such a node gets new objects
        #: only when no other node has room, and no copies, until then or until it answers.
        self._silent_until: dict[str, float] = {}
        #: node id -> objects lost when it left draining, its drain deadline passed (for
        #: ``kvpool drain`` to tell, rather than "drained and left"); the latest
        #: ``MAX_LEFT_WITH_LOSSES`` nodes, forgotten when the node mounts again.
        self.left_with_losses: dict[str, int] = {}
        #: When the last node this master had went silent (declared dead), the ids of those
        #: that went then (at most ``MAX_SILENT_NAMED``) and how many; None once a node
        #: mounts. A master cut off from every node (a partition around it) cannot tell
        #: that from every node dying: it answers clients UNAVAILABLE for a while
        #: (core.py's ``client_refusal``), and names them where nothing can be placed.
        self.all_silent: tuple[float, tuple[str, ...], int] | None = None
        #: key -> the source replica its last copy between nodes failed to read from: the
        #: next copy reads another where it has one (``_start_replica_copy``). The latest
        #: ``MAX_COPY_FAILURES_KEPT``; dropped once a copy of the key succeeds.
        self._copy_failed_from: dict[str, Replica] = {}
        #: segment id -> until when it takes no demotion (``DEMOTION_PAUSE``); at most one
        #: entry per NVMe segment, dropped once past.
        self._demotions_paused: dict[str, float] = {}
        #: Nodes draining now (placement skips them; their objects are copied away).
        self._draining = 0
        self._seq = itertools.count()
        self._put_ids = itertools.count((epoch << 32) + 1)
        #: The first put id this master gave out (None: none yet); the ones it gave out are
        #: that and later ones of its epoch. (A lone master restarted within the second its
        #: predecessor started in has that one's epoch; the predecessor gave out no put id,
        #: as its clients waited out that second, but it may have adopted generations.)
        self._own_floor: int | None = None
        #: The master's term (capabilities carry it; nodes refuse older ones).
        self.epoch = epoch

        self._command_ids = itertools.count(1)
        #: What happened to each key lately (``story``), noted through
        #: ``_note((key, time, event, value...))`` (one C call: the log folds its notes in
        #: when read, and at each put batch and tick).
        self._story = StoryLog(self.config.story_events_per_key, self.config.story_events)
        self._note = self._story.note if self._story.capacity else _ignore
        if self.config.validate_each_event:
            for method in EVENTS:
                setattr(self, method, _validated(getattr(self, method), self.validate))

    # ------------------------------------------------------------------ node side

    def mount_segment(
        self,
        info: SegmentInfo,
        stored: Sequence[StoredObject] = (),
        *,
        remount: bool = False,
        silent: float = 0.0,
        more: bool = False,
    ) -> list[str]:
        """A node offers a segment, with the objects it already holds (after a restart).
        ``remount``: the node process mounted it before (at this master or another), so
        writers may still be copying into space this master never reserved. They got their
        reservations before the node last heard from a master, ``silent`` seconds ago, so
        the segment's free space is fenced until a write timeout (plus a margin) after that.

        Mounting the same segment again is a no-op. A changed segment under a known id (the
        node restarted) replaces the old one. Reported objects are adopted as published
        (and leased for one lease TTL, so that reads begun before a restart can finish);
        returns the keys that were not adopted (the node should forget them): overlapping a
        newer object, or superseded by a newer write of the same key.

        ``more``: this is the first part of a report in parts (``report_more`` takes the
        rest); the segment takes nothing new until the last part, and what the tombstones
        refused of it here they refuse of every part (``Tombstones.mounted``).
        """
        now = self.clock()
        node = self.nodes.get(info.node_id)
        if node is None:
            node = self.nodes[info.node_id] = NodeRecord(info.node_id, info.host, now)
            self.all_silent = None
            self.left_with_losses.pop(info.node_id, None)  # (back: a new story)
            for key in self._replication.under:  # a node to copy them to, maybe
                self._replication.look_at(key)
        node.last_seen = now
        existing = self.segments.get(info.segment_id)
        if existing is not None:
            if existing.info == info:
                if more or existing.reporting is not None:
                    # A report in parts begun again, or one cut short and now sent whole
                    # (fewer objects since): what it brings is taken as a later part's is.
                    return self.report_more(info, stored, more=more) or []
                return []
            self._drop_segments([existing.segment_id])
        segment = SegmentRecord(info, Allocator(info.size, self.config.alignment))
        granted_at = self._dropped_grants.pop(info.segment_id, None)
        capabilities_end = self.capabilities_until.get(info.segment_id, 0.0)
        if capabilities_end > now and not remount:
            # (a new process: its seals are gone, and capabilities signed for the earlier one
            # would reach whatever is put in the space they name; see capabilities_until)
            segment.fenced_until = capabilities_end + FENCE_MARGIN
        if remount:
            # Writers granted space before the node last heard from a master, and those this
            # master granted itself until it let the segment go (declared its node dead)...
            latest = now - silent if granted_at is None else max(now - silent, granted_at)
            if _writers_unchecked(info, self.config):
                # ...and those an earlier master granted until this term began (it may have
                # lived on after the node last heard from it), where the node cannot refuse
                # them: writers without a capability, whose term it would check.
                latest = max(latest, self.term_started)
            # (a node honours a write grant its clock allowance past the window, and this
            # master's own, granted until it let the segment go, were never sealed: the
            # segment was dropped, its objects not forgotten. An earlier master's grants are
            # refused by their term once this master's keys reach the node.)
            allowance = (self.config.capability_skew or 0.0) if granted_at is not None else 0.0
            segment.fenced_until = latest + self.config.write_timeout + allowance + FENCE_MARGIN
        self.segments[info.segment_id] = segment
        node.segment_ids.add(info.segment_id)
        self._away_since.pop(info.segment_id, None)
        refused = self._adopt_newest_first(segment, stored, now, more)
        given_up = self._tombstones.take_given_up(info.segment_id)
        # (a node process mounting a segment for the first time runs nothing an earlier one
        # was sent: only a remount may be followed by late writes)
        late = self._late_writes(info.segment_id, given_up) if remount else []
        self._tombstones.mounted(info.segment_id, late, in_parts=more)
        dropped = self._forget_all_refused(segment, refused)
        if more:
            self._await_parts(segment)
        elif info.incarnation:  # (after the whole report: judged on what the master knew)
            self._drop_earlier_processes(node, info.incarnation)
        return dropped

    def report_more(
        self, info: SegmentInfo, stored: Sequence[StoredObject], *, more: bool
    ) -> list[str] | None:
        """A later part of a segment's report in parts (``mount_segment`` with ``more`` took
        the first): its objects are adopted as the first part's were (a part sent again is
        taken again: what it adopted before stays, unchanged). The last (not ``more``) lets
        the segment take new objects again. Returns the keys not adopted, or None when the
        segment is not mounted as ``info`` describes (mount it first)."""
        segment = self.segments.get(info.segment_id)
        if segment is None or segment.info != info:
            return None
        now = self.clock()
        node = self.nodes.get(info.node_id)
        if node is not None:
            node.last_seen = now
        refused = self._adopt_newest_first(segment, stored, now, more)
        dropped = self._forget_all_refused(segment, refused)
        if not more and segment.reporting is not None:
            segment.fenced_until, segment.reporting = segment.reporting, None
            self._tombstones.report_over(info.segment_id)
        elif more:
            self._await_parts(segment)
        if not more and node is not None and info.incarnation:
            self._drop_earlier_processes(node, info.incarnation)
        return dropped

    def _adopt_newest_first(
        self,
        segment: SegmentRecord,
        stored: Sequence[StoredObject],
        now: float,
        more: bool = False,
    ) -> list[StoredObject]:
        """Adopts what a node reports ``segment`` holds, newest first (where two overlap, the
        newer keeps the bytes); the objects not adopted. Replicas of objects this master
        knows, and that were read (or put) here, join the segment's LRU once the whole
        report is in (``more``: parts follow), in the order they were last used: newest
        first, each as the most recent, the segment would evict its newest first."""
        relisted = segment.relisted
        refused = [
            item
            for item in sorted(stored, key=lambda s: s.generation, reverse=True)
            if not self._adopt(segment, item, now, relisted)
        ]
        if relisted and not more:
            relisted.sort(key=lambda record: record.last_access)
            segment_id = segment.info.segment_id
            for record in relisted:
                if record.state is PUBLISHED and any(
                    r is not None and r.segment_id == segment_id for r in record.replicas
                ):  # (still here: not removed, evicted or moved while the report went on)
                    segment.lru.add(record.key, record.pin)
            relisted.clear()
        return refused

    def _forget_all_refused(
        self, segment: SegmentRecord, refused: Sequence[StoredObject]
    ) -> list[str]:
        """Sends each reported object not adopted a Forget (``_forget_refused``); their keys,
        for the answer."""
        for item in refused:
            if _well_formed(item):
                self._forget_refused(segment, item)
        return [item.key for item in refused]

    def reporting(self) -> bool:
        """Whether a node is still reporting a segment in parts (a rebuild is not over)."""
        return any(segment.reporting is not None for segment in self.segments.values())

    @staticmethod
    def _await_parts(segment: SegmentRecord) -> None:
        """Nothing new goes in ``segment`` until its report's last part."""
        if segment.reporting is None:
            segment.reporting = segment.fenced_until
        segment.fenced_until = math.inf

    def _forget_refused(self, segment: SegmentRecord, item: StoredObject) -> None:
        """A reported object the mount did not adopt: the answer tells the node to drop it,
        but an answer can be lost (the node's call timed out, a partition began), and the
        node's next report would bring it back once this mount's entries are gone: after a
        death or at a new leader, a removed object listed again. So it also gets a Forget,
        refused at any later mount until the node answers it, and kept in the segment's
        durable record until then (for a new leader)."""
        self._tombstones.overdue(self._forget_stored(segment, item, exact=True))

    def _late_writes(
        self, segment_id: str, given_up: dict[str, int]
    ) -> list[tuple[str, int, int, bool]]:
        """(key, generation, offset, whether that object lives) of each entry a Persist or
        Copy sent to ``segment_id`` before this mount would record, still unanswered or
        ``given_up`` while the segment was away: a node paused with them queued may carry
        them out after its report (tombstones.py keeps them out). The offset is
        ``tombstones.ANY`` where it is not known here any more (a given-up write). An object
        lives on if its generation does, in the record it had then or in another (lost with
        its segment, then adopted from a report). A scan of the commands in flight, at a
        mount only."""
        writes: list[tuple[str, int, int]] = []
        for command_id, (target, records) in self._awaiting.items():
            if target != segment_id:
                continue
            persisted = self._persisting.get(command_id)
            if persisted is not None:  # (a Persist names each object's place)
                writes += ((item.key, item.generation, item.offset) for item in persisted)
                continue
            place = self._copy_places.get(command_id, ANY_PLACE)  # (a Copy: one object)
            writes += ((record.key, record.generation, place) for record in records)
        writes += ((key, generation, ANY_PLACE) for key, generation in given_up.items())
        objects = self.objects
        return [
            (
                key,
                generation,
                offset,
                (held := objects.get(key)) is not None and held.generation == generation,
            )
            for key, generation, offset in writes
        ]

    def mount_problem(self, info: SegmentInfo) -> str | None:
        """Why ``info`` may not be mounted, or None. A segment id belongs to the node that
        mounted it; memory one mounted segment describes (the same worker's address range,
        or the same shared-memory mapping) is not mounted again under another id: the master
        would place new objects over the ones already there."""
        if info.segment_id.startswith(NODE_PREFIX):
            return f"segment ids beginning with {NODE_PREFIX!r} are reserved: give another one"
        existing = self.segments.get(info.segment_id)
        if existing is not None and existing.node_id != info.node_id:
            return (
                f"segment id {info.segment_id!r} is mounted by node {existing.node_id!r}: "
                "segment ids are unique in a cluster; give this segment another one"
            )
        node = self.nodes.get(info.node_id)
        if existing is None and node is not None and len(node.segment_ids) >= MAX_NODE_SEGMENTS:
            return (
                f"node {info.node_id!r} has {len(node.segment_ids)} segments mounted, the most "
                "a node may: unmount some, or give fewer, larger ones"
            )
        end = info.base_address + info.size
        for other in self.segments.values():
            held = other.info
            if held.segment_id == info.segment_id:
                continue
            same_worker = held.worker_address == info.worker_address
            if same_worker and held.node_id != info.node_id:
                return (
                    f"segment {info.segment_id!r} gives the UCX worker address of node "
                    f"{held.node_id!r}'s segment {held.segment_id!r}: a node mounts only "
                    "memory it registered itself"
                )
            overlaps = held.base_address < end and info.base_address < held.base_address + held.size
            if (same_worker and overlaps) or (
                info.shared_memory and held.shared_memory == info.shared_memory
            ):
                return (
                    f"segment {info.segment_id!r} describes memory that segment "
                    f"{held.segment_id!r} of node {held.node_id!r} already holds: unmount "
                    "that one first, or mount this memory under its id"
                )
        return None

    def unmount_segment(self, node_id: str, segment_id: str) -> tuple[int, float]:
        """A node withdraws a segment (graceful drain).

        Its objects are removed at once so no new reader finds them. Returns how many objects
        lost their last replica, and how many seconds the node must keep the memory for
        readers that still hold leases on what was there.
        """
        segment = self.segments.get(segment_id)
        if segment is None or segment.node_id != node_id:
            return 0, 0.0
        now = self.clock()
        drain_until = now
        for key in segment.owners.values():
            drain_until = max(drain_until, self.objects[key].lease_until)
        for release_at, sequence, deferred, _ in self._deferred:
            if deferred is segment and sequence not in self._resting:
                drain_until = max(drain_until, release_at)
        for parked, _, _, not_before in self._parked.values():
            if parked is segment:
                drain_until = max(drain_until, not_before)
        node = self.nodes.get(node_id)
        draining = node is not None and node.draining
        lost = self._drop_segments([segment_id])
        if draining and lost:  # (its drain deadline passed before all was copied away)
            self.remember_loss(node_id, lost)
        if node is not None and not node.segment_ids:
            self._node_gone(node)
        return lost, drain_until - now

    def _drop_earlier_processes(
        self, node: NodeRecord, incarnation: str, listed: Collection[str] | None = None
    ) -> None:
        """Process ``incarnation`` of ``node`` mounts (``listed`` None) or heartbeats
        (``listed``: every segment it has): the segments an earlier process mounted that this
        one does not have go, as a death drops them. At a mount those that do not persist
        (DRAM went with that process); at a heartbeat those it does not list (restarted
        without its ``--nvme``, or its disk would not open; persistent segments it has keep
        their ids, and its mount of them replaces them). Dropped now, not when the node goes
        silent: the new process keeps the node alive, and under the node's id placement
        would keep choosing memory nobody serves (best effort puts with fewer copies), count
        copies that are gone as replicas, and send their Forgets to a process that never had
        them."""
        gone = [
            segment_id
            for segment_id in node.segment_ids
            if (earlier := self.segments[segment_id].info).incarnation
            and earlier.incarnation != incarnation
            and (not earlier.persistent if listed is None else segment_id not in listed)
        ]
        if gone:
            self._drop_segments(gone)

    def heartbeat(
        self,
        node_id: str,
        segment_ids: Iterable[str],
        incarnation: str = "",
        unreadable: Sequence[UnreadableReplica] = (),
    ) -> list[str]:
        """Records that a node is alive; returns the segments it must mount again.

        ``segment_ids`` are every segment the node process has (mounted or not yet), and
        ``incarnation`` names the process: a segment an earlier process of the node mounted
        that this one does not have (restarted without its ``--nvme``, or its disk would not
        open) is gone, and dropped as a death drops it. Without this the new process keeps
        the node alive and the master keeps placing objects in a segment nobody serves.

        ``unreadable``: replicas in the node's segments its disk failed to read (a reader
        got DISK_ERROR): see ``_unreadable``."""
        node = self.nodes.get(node_id)
        listed = list(segment_ids)
        if node is not None:
            node.last_seen = self.clock()
            if incarnation:
                self._drop_earlier_processes(node, incarnation, set(listed))
            for item in unreadable[:MAX_UNREADABLE_REPORTS]:
                self._unreadable(node, item)
        known = node.segment_ids if node is not None else set()
        missing = [s for s in listed if s not in known]
        if (
            node is not None
            and not missing
            and self._tombstones.awaits(node_id)
            and all(self.segments[s].reporting is None for s in known)
        ):
            self._tombstones.heard(node_id)  # (every segment of it mounted and reported)
        return missing

    def _unreadable(self, node: NodeRecord, item: UnreadableReplica) -> None:
        """A replica of ``node`` its disk failed to read: left listed, every reader would try
        it first and fail, and re-replication would count it as a copy. An object with other
        replicas loses this one (and gets a copy elsewhere, when re-replication is on); one
        with no other replica is lost, as with its node (a reader gets NOT_FOUND and puts it
        again, rather than DISK_ERROR for good). Only a published object of that generation
        with a replica at that place counts (the report may be late), and none being copied
        (the copy may read this replica: reported again, it goes once the copy ended)."""
        segment = self.segments.get(item.segment_id)
        if segment is None or segment.node_id != node.node_id:
            return
        record = self.objects.get(item.key)
        replica = Replica(item.segment_id, item.offset)
        if (
            record is None
            or record.generation != item.generation
            or record.state is not PUBLISHED
            or record.moving
            or replica not in record.replicas
        ):
            return
        now = self.clock()
        if sum(r is not None for r in record.replicas) > 1:
            self._drop_bad_replica(record, replica, now, "replica_unreadable")
            return
        self.counters.replicas_unreadable += 1
        entry = (record.key, now, "unreadable", record.put_id, replica)
        self._remove(record, now, entry, lost=True)

    def _drop_bad_replica(
        self, record: ObjectRecord, replica: Replica, now: float, event: str
    ) -> None:
        """A replica that cannot serve the object (its disk failed to read it, or its bytes
        failed the checksum) goes, and the object gets a copy elsewhere; ``event`` names why
        in the key's story. Counted as unreadable."""
        self.counters.replicas_unreadable += 1
        self._release_replica(record, replica, now)
        self._note((record.key, now, event, record.put_id, replica))
        self._replication_changed(record)

    def nodes_unheard(self, node_ids: Iterable[str]) -> None:
        """A new leader takes clients before these nodes remounted (its rebuild window
        passed): what ends meanwhile must not come back with them (tombstones.py)."""
        self._tombstones.unheard(node_ids)

    def awaiting(self, command_id: int) -> bool:
        """Whether a Persist or Copy command still waits for its node's answer."""
        return command_id in self._awaiting

    def command_done(
        self,
        command_id: int,
        ok: bool,
        crc32c: Sequence[int] = (),
        *,
        source_corrupt: bool = False,
        error: str = "",
    ) -> None:
        """A node answered a Persist or Copy command (``ok`` False: it failed and wrote
        nothing, for ``error``; ``source_corrupt``: a copy's source bytes failed the
        object's checksum). Finished commits land in ``resolved``."""
        self._answered(
            command_id, ok, crc32c, expired=False, source_corrupt=source_corrupt, error=error
        )

    def command_expired(self, command_id: int) -> None:
        """The I/O layer gave up waiting for a node's answer. The command counts as failed, but
        the node may still be carrying it out: a copy's target is not reused for
        ``reclaim_delay``."""
        self._answered(command_id, False, (), expired=True)

    def _answered(
        self,
        command_id: int,
        ok: bool,
        crc32c: Sequence[int],
        expired: bool,
        source_corrupt: bool = False,
        error: str = "",
    ) -> None:
        segment_id, records = self._unawait(command_id)
        if expired and records:
            segment = self.segments.get(segment_id)
            if segment is None:
                for record in records:  # (no Forget can follow them: tombstones.py)
                    self._tombstones.given_up(segment_id, record.key, record.generation)
            else:
                self._silent(segment.node_id)
        persisted = self._persisting.pop(command_id, ())
        parked = self._parked.pop(command_id, None)
        if parked is not None:
            segment, offset, record, not_before = parked
            self._abandon_copy(segment, record, offset, ok, expired, not_before)
        committed = COMMITTED
        for i, record in enumerate(records):
            if record.moving and command_id in record.moving:
                crc = crc32c[0] if crc32c else None
                how = "expired" if expired else "corrupt" if source_corrupt else "answered"
                if not ok and WRITER_HOLDS_RANGE in error:
                    how = "held"  # (its target: neither the disk nor the source failed)
                self._move_done(record, command_id, ok, crc, how)
            elif record.state is committed and segment_id in record.unacked:
                if not ok and not expired and self._persist_pending(record, segment_id):
                    continue  # a retried commit's Persist failed; the other one decides
                if record.crc32c is None and i < len(crc32c):
                    record.crc32c = crc32c[i]  # the node's own checksum of what it holds
                if expired:  # the node may record it late: it must not keep that entry
                    self._send_forget(
                        self.segments[segment_id], record, self._stored(record, segment_id).offset
                    )
                if not ok:
                    now = self.clock()
                    self._note(
                        (record.key, now, "persist_failed", record.put_id, segment_id, expired)
                    )
                    self._persist_failed(record, segment_id, expired, error)
                self._persist_done(record, segment_id, ok)
            elif (ok or expired) and i < len(persisted):
                self._forget_unheld(segment_id, record, persisted[i])

    def _persist_failed(
        self, record: ObjectRecord, segment_id: str, expired: bool, error: str
    ) -> None:
        """Keeps why a node did not record ``record``, for its commit's answer."""
        segment = self.segments.get(segment_id)
        node = segment.node_id if segment is not None else segment_id
        if expired:
            why = f"storage node {node!r} did not answer in time"
        else:  # (a node's words, shown to a writer: bounded, and printable only)
            said = "".join(c if c.isprintable() else "?" for c in error[:MAX_ERROR_CHARS])
            why = f"storage node {node!r} could not record it: {said or '?'}"
        errors = self._persist_errors
        held = errors.get(record.key)
        if held is not None and held[0] == record.put_id:
            why = f"{held[1]}; {why}"[: 2 * MAX_ERROR_CHARS]
        elif len(errors) >= MAX_PERSIST_ERRORS:
            del errors[next(iter(errors))]
        errors[record.key] = (record.put_id, why)

    def _why_not_recorded(self, record: ObjectRecord) -> str:
        """Takes what ``_persist_failed`` kept for ``record``'s commit ('' if nothing)."""
        held = self._persist_errors.get(record.key)
        if held is None or held[0] != record.put_id:
            return ""
        del self._persist_errors[record.key]
        return held[1]

    def _persist_pending(self, record: ObjectRecord, segment_id: str) -> bool:
        """Whether another Persist of ``record`` to ``segment_id`` still waits for its answer
        (a writer retried its PutEnd): if one fails, the node may have recorded the object
        through the other, so the replica's space must not go back before that one answers.
        (A scan, on failures only.)"""
        return any(
            segment == segment_id and any(r is record for r in records)
            for segment, records in self._awaiting.values()
        )

    def _forget_unheld(self, segment_id: str, record: ObjectRecord, item: StoredObject) -> None:
        """A Persist answered (or given up on) for a replica the master does not hold: the
        object ended meanwhile, or another Persist of the same commit failed first and its
        space went back. The node recorded it (or may yet): it must forget it, else a remount
        reports it (over whatever lies there by then). A Forget names place and generation,
        so it spares a newer object the node recorded there since."""
        segment = self.segments.get(segment_id)
        if segment is None:
            return
        current = self.objects.get(record.key)  # (maybe adopted anew since, same generation)
        held = (
            current is not None
            and current.generation == item.generation
            and any(
                r is not None and r.segment_id == segment_id and r.offset == item.offset
                for r in current.replicas
            )
        )
        if not held:
            self._send_forget(segment, record, item.offset)

    def drain(self, node_id: str) -> DrainProgress | None:
        """Drains a node: nothing new is placed there from now on (puts, copies), and each
        of its objects gets a replica on another node (at the re-replication rate) if it
        has fewer elsewhere than it should (``ObjectRecord.wanted``, at most the other
        nodes). Draining again only reports progress. None for a node not known; a progress
        that is not ``draining`` when no other node takes objects (the drain is refused: it
        could copy nothing away)."""
        node = self.nodes.get(node_id)
        if node is None:
            return None
        if not node.draining:
            if not any(not n.draining and n is not node for n in self.nodes.values()):
                return DrainProgress(False, 0, 0, 0)
            node.draining = True
            self._draining += 1
            self._note_drained(node)
        return self.drain_progress(node_id)

    @property
    def draining_nodes(self) -> int:
        return self._draining

    def drain_progress(self, node_id: str) -> DrainProgress | None:
        """What a draining node still holds that has too few replicas elsewhere (objects
        being written count too: they are copied once published). Reads every object of the
        node: asked once per heartbeat of a draining node, and by ``kvpool drain``."""
        node = self.nodes.get(node_id)
        if node is None:
            return None
        others = sum(1 for n in self.nodes.values() if not n.draining and n is not node)
        if not node.draining:
            return DrainProgress(False, 0, 0, others)
        left = left_bytes = 0
        for key in self._keys_on(node):
            record = self.objects[key]
            if record.state is ObjectState.PUBLISHED:
                # (at least one: the last replica is never drained away, whatever is left)
                need = max(1, min(record.wanted, others))
                if len(self._healthy_nodes(record)) >= need:
                    continue
            left += 1
            left_bytes += record.size
        return DrainProgress(True, left, left_bytes, others)

    def remember_loss(self, node_id: str, lost: int) -> None:
        """A draining node left (at its deadline) or died with ``lost`` objects only it held."""
        left = self.left_with_losses
        left[node_id] = left.pop(node_id, 0) + lost
        while len(left) > MAX_LEFT_WITH_LOSSES:
            del left[next(iter(left))]

    def _keys_on(self, node: NodeRecord) -> set[str]:
        keys: set[str] = set()
        for segment_id in node.segment_ids:
            keys.update(self.segments[segment_id].owners.values())
        return keys

    def _note_drained(self, node: NodeRecord) -> None:
        for key in self._keys_on(node):
            record = self.objects[key]
            self._replication_changed(record)

    def _node_gone(self, node: NodeRecord) -> None:
        """Forgets a node that has no segment left (it died, or withdrew them all)."""
        if node.draining:
            self._draining -= 1
        del self.nodes[node.node_id]
        if self._silent_until:  # (what it left unanswered goes with it: core.tick)
            self._silent_until.pop(node.node_id, None)

    # ------------------------------------------------------------------ client side

    def client_heartbeat(self, client_id: str) -> None:
        """A writer is alive. Only writers holding reservations are tracked, and only by an
        id: the empty one is every caller's (whose reservations end by their timeout)."""
        if client_id and client_id in self._reservations_of:
            self.clients[client_id] = self.clock()

    def put_start(
        self,
        client_id: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        options: PutOptions | int | None = None,
    ) -> list[PutSlot]:
        """Reserves one buffer per replica, on distinct nodes, for each key. ``options`` may
        be just a replica count."""
        if not isinstance(options, PutOptions):
            options = PutOptions(replicas=options or 0)
        wanted = options.replicas or self.config.default_replicas
        if not 1 <= wanted <= self.config.max_replicas:
            message = f"replicas must be between 1 and {self.config.max_replicas}, got {wanted}"
            return [PutSlot(KeyStatus.INVALID_ARGUMENT, message=message) for _ in keys]
        self._story.fold()  # (the last batch's notes: keeps the pending ones few)
        now = self.clock()
        # (keys as the master holds them: behind their tenant's prefix)
        checked = plainly_valid(keys, STORED_KEY_BYTES)  # the common case, seen in one pass
        pools: dict[Tier, TierPool] = {}
        self._coming_free_by_tier = {}
        try:
            slots = [
                self._put_start_one(client_id, key, size, wanted, options, now, pools, checked)
                for key, size in zip(keys, sizes, strict=True)
            ]
        finally:
            self._coming_free_by_tier = None
        if client_id and client_id in self._reservations_of:
            self.clients[client_id] = now
        return slots

    def put_end(self, commits: Sequence[Commit]) -> list[KeyStatus | None]:
        """Commits writes. Each object whose writer completed at least one replica waits for
        its nodes to record it: its entry is None, and its answer comes through
        ``resolved`` once they have (or through this list when nothing needs waiting)."""
        statuses: list[KeyStatus | None] = []
        persists: dict[str, list[ObjectRecord]] = {}
        now = self.clock()
        for commit in commits:
            status = self._put_end_one(commit, now)
            statuses.append(status)
            if status is None:
                record = self.objects[commit.key]
                for segment_id in record.unacked:
                    batch = persists.get(segment_id)
                    if batch is None:
                        batch = persists[segment_id] = []
                    batch.append(record)
        for segment_id, records in persists.items():
            segment = self.segments[segment_id]
            command_id = next(self._command_ids)
            objects = tuple(self._stored(r, segment_id) for r in records)
            self.outbox.append(PersistCommand(command_id, segment.node_id, segment_id, objects))
            self._await(command_id, segment_id, tuple(records))
            self._persisting[command_id] = objects
        return statuses

    def still_reserved(self, key: str, put_id: int) -> bool:
        """Whether ``put_id``'s reservation of ``key`` stands (not committed, revoked,
        removed, timed out or lost with its node)."""
        record = self.objects.get(key)
        return record is not None and record.put_id == put_id and record.state is RESERVED

    def put_revoke(self, keys: Sequence[str], put_ids: Sequence[int]) -> list[KeyStatus]:
        """A writer gives up its reservations; their space returns at once (it stopped writing)."""
        statuses = []
        now = self.clock()
        for key, put_id in zip(keys, put_ids, strict=True):
            record = self.objects.get(key)
            if (
                record is None
                or record.put_id != put_id
                or record.state is not ObjectState.RESERVED
            ):
                statuses.append(KeyStatus.STALE_PUT)
                continue
            self._forget(record, (record.key, now, "revoked", put_id))
            self._forget_grants(record, record.replicas)  # (its writer may not have stopped)
            self._release(record.replicas, self._reuse_after(record, now))
            self.counters.puts_revoked += 1
            statuses.append(KeyStatus.OK)
        return statuses

    def get_replicas(
        self, keys: Sequence[str], lease_ttl: float = 0.0, client_id: str = ""
    ) -> tuple[list[Location], float]:
        """Where each published object lives; grants (or extends) a read lease on each, held
        by ``client_id`` (see ``release_leases``)."""
        ttl = self._lease_ttl(lease_ttl)
        now = self.clock()
        locations: list[Location] = []
        append, find, lease, placed = locations.append, self.objects.get, self._lease, self._placed
        promote = self._maybe_promote if self.config.promote_on_hit else None
        hits = 0
        for key in keys:
            record = find(key)
            if record is None or record.state is not PUBLISHED:
                self.counters.misses += 1
                status = KeyStatus.NOT_FOUND if record is None else KeyStatus.NOT_READY
                append(Location(status))
                continue
            if self._lease_quotas and not record.lease_open and self._lease_refused(record, now):
                append(Location(KeyStatus.QUOTA_EXCEEDED))
                continue
            hits += 1
            lease(record, now, ttl, client_id)
            append(
                make(
                    Location,
                    (
                        _OK,
                        record.size,
                        placed(record),
                        record.crc32c,
                        record.put_id,
                    ),  # (generation)
                )
            )
            if promote is not None:
                promote(record)
        self.counters.hits += hits
        return locations, ttl

    def exists(
        self,
        keys: Sequence[str],
        lease_ttl: float = 0.0,
        *,
        grant_lease: bool = True,
        client_id: str = "",
        tenant: str | None = None,
    ) -> list[KeyStatus]:
        """Whether each key is published; grants a lease on those that are, unless told not to.
        ``keys`` are the master's own (each behind its tenant's prefix), or with ``tenant``
        those of that tenant as its clients name them."""
        find = self._finder(tenant)
        published, ok, not_found = PUBLISHED, _OK, KeyStatus.NOT_FOUND
        if not grant_lease:  # (a pure check, in one comprehension)
            not_ready = KeyStatus.NOT_READY
            return [
                not_found if r is None else ok if r.state is published else not_ready
                for r in map(find, keys)
            ]
        ttl = self._lease_ttl(lease_ttl)
        now = self.clock()
        statuses: list[KeyStatus] = []
        append, lease = statuses.append, self._lease
        for key in keys:
            record = find(key)
            if record is None:
                append(not_found)
            elif record.state is published:
                if grant_lease:
                    if (
                        self._lease_quotas
                        and not record.lease_open
                        and self._lease_refused(record, now)
                    ):
                        append(KeyStatus.QUOTA_EXCEEDED)
                        continue
                    lease(record, now, ttl, client_id)
                append(ok)
            else:
                append(KeyStatus.NOT_READY)
        return statuses

    def _finder(self, tenant: str | None) -> Callable[[str], ObjectRecord | None]:
        """Looks up an object by the master's key, or with ``tenant`` by that tenant's key."""
        if tenant is None:
            return self.objects.get
        return self._tenant_objects.get(tenant, _NO_OBJECTS).get

    def release_leases(self, client_id: str, keys: Sequence[str]) -> int:
        """A reader is done with these objects (it closed, or its process is exiting): a lease
        it holds ends now, unless another reader leased the object since (their leases are
        never cut short). Returns how many leases ended."""
        if not client_id:
            return 0
        released = 0
        find = self.objects.get
        now = self.clock()
        for key in keys:
            record = find(key)
            if record is not None and record.lease_client == client_id:
                record.lease_until = record.others_until
                record.lease_client = ""
                released += 1
                if record.lease_open and record.lease_until <= now:
                    # It ends now: its tenant's leases quota counts it out now, not when the
                    # lease would have run out (its entry in _lease_ends is skipped then).
                    record.lease_open = False
                    self.counters.lease_expiries += 1
                    self._lease_ended(record)
        return released

    def quarantine(self, forget: ForgetCommand, *, node_silent: bool = True) -> None:
        """A node has not answered ``forget`` in time (the I/O layer gave up waiting, not on
        the command), or could not carry it out for a same-host writer's lock (not
        ``node_silent``: the node answers its commands): the space it names stays out of use
        until ``forget_answered``, so that writers go elsewhere instead of waiting."""
        self._tombstones.overdue(forget.command_id)
        segment = self.segments.get(forget.segment_id)
        if segment is None or segment.node_id != forget.node_id:
            return
        if node_silent:
            self._silent(forget.node_id)
        rounded = segment.allocator.rounded
        ranges = [(o.offset, o.offset + rounded(max(o.size, 1))) for o in forget.objects]
        self._quarantine.add(forget.command_id, segment, ranges)

    def _silent(self, node_id: str) -> None:
        self._silent_until[node_id] = self.clock() + SILENT_NODE_PAUSE

    def node_answered(self, node_id: str) -> None:
        """The node answered a command: it takes new objects again, if it had gone silent."""
        if self._silent_until:
            self._silent_until.pop(node_id, None)

    def _silent_nodes(self, now: float) -> frozenset[str]:
        """The nodes gone silent on their commands lately (``SILENT_NODE_PAUSE``)."""
        silent = self._silent_until
        if not silent:
            return frozenset()
        for node_id in [n for n, until in silent.items() if until <= now]:
            del silent[node_id]
        return frozenset(silent)

    def forgets_merged(self, absorbed: dict[int, int]) -> None:
        """Forgets went out merged (id -> the id of the Forget they joined)."""
        for command_id, into in absorbed.items():
            self._tombstones.merged(command_id, into)

    def forget_overdue(self, command_id: int) -> None:
        """A Forget whose removal is answered without the node's answer (the master waited
        long enough, or the node was declared dead): a new leader must know of it too."""
        self._tombstones.overdue(command_id)

    @property
    def durable_changed(self) -> bool:
        """Whether ``durable_changes`` has something (asked after every event)."""
        return self._tombstones.changed

    def durable_changes(self) -> set[str]:
        """Segments whose durable tombstone record changed since the last call."""
        return self._tombstones.take_changed()

    def durable_record(self, segment_id: str) -> DurableRecord | None:
        """The segment's durable tombstone record now (None: nothing to keep)."""
        return self._tombstones.record(segment_id)

    def restore_tombstones(self, records: Mapping[str, DurableRecord]) -> None:
        """Records an earlier leader kept (a new term, before any mount)."""
        now = self.clock()
        for segment_id, record in records.items():
            self._tombstones.restore(segment_id, record)
            if not segment_id.startswith(NODE_PREFIX):  # (a node's own goes once it is heard)
                self._away_since.setdefault(segment_id, now)

    def forget_answered(self, command_id: int) -> None:
        """A node answered a Forget: space quarantined for it returns to use, and a remount
        may report the object no more."""
        self._tombstones.answered(command_id)
        if self._quarantine:
            self._quarantine.release(command_id)

    def remove(self, keys: Sequence[str], force: bool = False) -> list[KeyStatus]:
        """Removes published objects. A leased object is kept unless ``force``; even then its
        space is not reused before the lease ends. An unpublished one only goes by force."""
        now = self.clock()
        statuses = []
        for key in keys:
            record = self.objects.get(key)
            status = self._removal_status(record, now, force)
            if status is _OK:
                assert record is not None
                self._remove(
                    record, now, (record.key, now, "removed", record.put_id, record.state, force)
                )
            elif record is None:  # (lost with its nodes, or on a node not heard from yet)
                self._tombstones.ended_unknown(key, self._issued_so_far())
            statuses.append(status)
        return statuses

    def remove_prefix(
        self, prefix: str, force: bool = False, start_after: str = "", most: int = 0
    ) -> PrefixRemoval:
        """Removes the objects whose key starts with ``prefix`` ("" removes all), under the
        same rules as ``remove``, one page at a time: at most ``most`` published keys after
        ``start_after`` (``MAX_REMOVAL_PAGE`` at most, so that one call holds the event loop
        no longer than a batch does). Says how many were removed, why others were kept, and
        the key to go on after ("" when this was the last page, which also takes the
        objects being written)."""
        now = self.clock()
        most = min(most or MAX_REMOVAL_PAGE, MAX_REMOVAL_PAGE)
        lower = max(prefix, start_after)
        include_lower = not start_after or lower != start_after  # start_after is exclusive
        published = list(
            itertools.islice(
                itertools.takewhile(
                    lambda k: k.startswith(prefix),
                    self._published_keys.irange(minimum=lower, inclusive=(include_lower, True)),
                ),
                most,
            )
        )
        more = len(published) == most and self._has_key_after(published[-1], prefix)
        unpublished: list[str] = []
        if not more:
            tenant = tenant_of(prefix)
            # (a tenant's call looks at that tenant's objects only, not at every tenant's)
            candidates = (
                self._tenant_objects.get(tenant, _NO_OBJECTS).values()
                if tenant
                else self.objects.values()
            )
            unpublished = [
                r.key
                for r in candidates
                if r.state is not ObjectState.PUBLISHED and r.key.startswith(prefix)
            ]
            # what this master cannot list must not come back either: objects lost with
            # their nodes, and whatever nodes not heard from since the election hold
            issued = self._issued_so_far()
            for key in self._tombstones.lost_keys(prefix):
                if key not in self.objects:
                    self._tombstones.ended_unknown(key, issued)
            # (under this prefix only: a tenant's removal of its own keys must not cost
            # another tenant what those nodes bring back)
            self._tombstones.distrust_unheard(prefix, issued)
        removed = leased = not_ready = 0
        for key in published + unpublished:
            record = self.objects[key]
            status = self._removal_status(record, now, force)
            if status is KeyStatus.OK:
                self._remove(
                    record, now, (record.key, now, "removed", record.put_id, record.state, force)
                )
                removed += 1
            elif status is KeyStatus.HAS_LEASE:
                leased += 1
            else:
                not_ready += 1
        return PrefixRemoval(removed, leased, not_ready, published[-1] if more else "")

    def stat(self, key: str) -> ObjectInfo:
        record = self.objects.get(key)
        if record is None:
            return ObjectInfo(KeyStatus.NOT_FOUND)
        now = self.clock()
        return ObjectInfo(
            status=KeyStatus.OK,
            size=record.size,
            state=record.state.value,
            replicas=self._placed(record),
            lease_remaining=max(0.0, record.lease_until - now),
            pin=record.pin,
            pin_remaining=max(0.0, record.pin_until - now) if record.pin is Pin.SOFT else 0.0,
            crc32c=record.crc32c,
            age=now - record.created_at,
            idle=now - record.last_access,
        )

    def list_keys(self, prefix: str = "", limit: int = 0, start_after: str = "") -> KeyPage:
        """Published keys starting with ``prefix``, in order, after ``start_after``."""
        limit = min(limit or self.config.list_page_size, MAX_LIST_PAGE)
        lower = max(prefix, start_after)
        include_lower = not start_after or lower != start_after  # start_after is exclusive
        keys: list[str] = []
        for key in self._published_keys.irange(minimum=lower, inclusive=(include_lower, True)):
            if not key.startswith(prefix):
                break
            keys.append(key)
            if len(keys) == limit:
                break
        more = len(keys) == limit and self._has_key_after(keys[-1], prefix)
        return KeyPage(keys, [self.objects[k].size for k in keys], keys[-1] if more else "")

    def published_count(self, prefix: str) -> int:
        """Published objects whose key starts with ``prefix`` (a tenant's, by its prefix)."""
        return self._published_keys.count_prefix(prefix)

    # ------------------------------------------------------------------ tenants and quotas

    def set_quotas(self, quotas: Quotas | None) -> None:
        """Puts ``quotas`` in force (None: none) for what comes next: objects held beyond a
        lowered quota stay, and new ones are refused until the tenant is back under it. With
        quotas, eviction is fair: a put evicts only its own tenant's objects and those of
        tenants above their guaranteed share of the tier (see ``_evict_to_fit``)."""
        self.quotas = quotas
        self._put_quotas = quotas is not None and any(
            quotas.limits_any(name)
            for name in ("objects", "dram_bytes", "nvme_bytes", "reserved_bytes")
        )
        self._lease_quotas = quotas is not None and quotas.limits_any("leases")

    def usage(self, tenant: str) -> TenantUsage:
        """What ``tenant`` holds now (a copy)."""
        usage = self._usage.get(tenant)
        return TenantUsage() if usage is None else dataclasses.replace(usage)

    def tenant_usage(self) -> dict[str, TenantUsage]:
        """What each tenant holding something holds now (copies: for metrics)."""
        return {  # (each field named: dataclasses.replace costs several times as much)
            tenant: TenantUsage(
                u.objects, u.reserved_bytes, u.dram_bytes, u.nvme_bytes, u.leases, u.reservations
            )
            for tenant, u in self._usage.items()
        }

    def snapshot(self) -> ClusterSnapshot:
        usages = [
            SegmentUsage(
                s.info,
                s.allocator.capacity,
                s.allocator.used,
                len(s.owners),
                s.allocator.largest_free,
            )
            for s in self.segments.values()
        ]
        replication = self._replication
        return ClusterSnapshot(
            usages,
            len(self._published_keys),
            len(self.objects) - len(self._published_keys),
            len(self.nodes),
            len(replication.under),
            len(replication.in_flight),
            self._draining,
            len(self._silent_nodes(self.clock())),
        )

    # ------------------------------------------------------------------ debugging

    def story(self, key: str) -> list[StoryEvent]:
        """What happened to ``key`` lately, oldest first: each object under it reserved,
        committed, published, moved, removed, evicted, lost... (reads are not noted). Empty
        when nothing is known, or no longer (the log keeps a bounded number of events)."""
        return self._story.story(key)

    def validate(self) -> None:
        """Checks the core's own invariants (invariants.py); raises InvariantViolation,
        naming the one broken, when the core is inconsistent."""
        check_invariants(self)

    # ------------------------------------------------------------------ time

    def tick(self, step: int | None = None, *, late_by: float = 0.0) -> TickReport:
        """Applies everything that is due: timeouts, dead nodes and clients, deferred frees,
        ended pins and leases, and eviction (or demotion) above the high watermark.

        ``late_by``: how much later than planned this tick comes (``forgive_own_silence``
        holds the rule). Past ``OWN_SILENCE_MIN``
        that is the master's own silence (its process was stopped, its host paused, its loop
        blocked): it heard nothing meanwhile, and the heartbeats of that time may still wait
        unread in its sockets. That time does not count against any node's or writer's
        silence: a master paused past the node TTL would otherwise declare every node dead
        as it resumes, and lose every object it held. At most once per node TTL of the
        master's own running time: a loop late at every tick (saturated rather than stopped)
        would otherwise forgive a dead node's silence for as long as it stays late.

        ``step`` bounds the objects one call goes through in the jobs that come in bulk
        (None: no bound): buffers whose frees are due, leases that ended, and an eviction
        pass. Thousands of small objects cost milliseconds, and the master answers nothing
        meanwhile; in steps, calls are answered between them. What a call leaves over
        (``unfinished``) goes on at the next: an eviction pass down to the low mark, even
        once below the high watermark."""
        if step is not None and step < 1:
            raise ValueError(f"step must be at least 1, got {step}")
        self._story.fold()
        now = self.clock()
        report = TickReport()
        budget = None if step is None else [step]
        if late_by:
            report.silence_forgiven = self.forgive_own_silence(late_by)
        self._reclaim_reservations(now, report)
        self._bury_dead_clients(now, report)
        self._bury_dead_nodes(now, report)
        if self._away_since:
            self._age_out_tombstones(now)
        if self.capabilities_until:
            for segment_id, until in list(self.capabilities_until.items()):
                if until <= now:
                    del self.capabilities_until[segment_id]
        if self._dropped_grants:
            write_timeout = self.config.write_timeout
            for segment_id, granted_at in list(self._dropped_grants.items()):
                if granted_at + write_timeout <= now:
                    del self._dropped_grants[segment_id]
        if self._late_forgets:
            self._send_late_forgets(now)
        self._release_deferred(now, report, budget)
        self._end_soft_pins(now)
        self._count_ended_leases(now, budget)
        if budget is None or budget[0] > 0:
            report.objects_evicted = self._evict_above_watermark(now, budget, report)
        if self.config.max_objects is not None and (budget is None or budget[0] > 0):
            report.objects_evicted += self._trim_table(now, budget)
        if self._replication.enabled:
            self._rereplicate(now, budget)
        report.unfinished = budget is not None and budget[0] <= 0
        return report

    # ------------------------------------------------------------------ internals: life cycle

    def _transition(
        self, record: ObjectRecord, to: ObjectState | None, entry: tuple[Any, ...]
    ) -> None:
        """Every change of an object's state, its creation (from GONE) and end (to GONE)
        included: checked against the table of legal transitions (transitions.py), and noted
        in the key's story as ``entry`` (key, time, event, details...)."""
        key = record.key
        current = self.objects.get(key)
        before: ObjectState | None
        if current is record:
            before = record.state
        elif current is None or to is GONE:
            before = GONE  # a new object, or one that has already ended
        else:
            raise IllegalTransition(key, current.state, to, "another object holds the key")
        if to not in LEGAL_BY_ID[id(before)]:
            raise IllegalTransition(key, before, to)
        # (COMMITTED -> PUBLISHED, every put's last, changes no usage: no tenant looked up)
        if before is not COMMITTED or to is not PUBLISHED:
            tenant, bare = split_key(key)  # (one partition: usage and objects by tenant)
            usage = self._usage_for(tenant)
            if before is GONE:
                usage.objects += 1
            elif before is RESERVED:
                usage.reserved_bytes -= self._need(record.size)
                usage.reservations -= 1
            if to is GONE:
                del self.objects[key]
                if self._copy_failed_from:
                    self._copy_failed_from.pop(key, None)
                table = self._tenant_objects[tenant]
                del table[bare]
                if not table:
                    del self._tenant_objects[tenant]
                usage.objects -= 1
                if usage.empty():
                    del self._usage[tenant]
            else:
                if before is GONE:
                    self.objects[key] = record
                    filed = self._tenant_objects.get(tenant)
                    if filed is None:
                        filed = self._tenant_objects[tenant] = {}
                    filed[bare] = record
                if to is RESERVED:
                    usage.reserved_bytes += self._need(record.size)
                    usage.reservations += 1
        if to is not GONE:
            record.state = to
        self._note(entry)

    def _usage_of(self, key: str) -> TenantUsage:
        """The usage of the tenant of ``key``, made when it held nothing."""
        return self._usage_for(tenant_of(key))

    def _usage_for(self, tenant: str) -> TenantUsage:
        """The usage of ``tenant``, made when it held nothing."""
        usage = self._usage.get(tenant)
        if usage is None:
            usage = self._usage[tenant] = TenantUsage()
        return usage

    def _own(self, segment: SegmentRecord, offset: int, key: str) -> None:
        """A buffer (allocated) at ``offset`` becomes ``key``'s: a replica, or a copy's
        target. Its tenant's bytes in the segment's tier count it from now."""
        segment.owners[offset] = key
        usage = self._usage_of(key)
        if segment.info.tier is _NVME:
            usage.nvme_bytes += segment.allocator.size_of(offset)
        else:
            usage.dram_bytes += segment.allocator.size_of(offset)

    def _disown(self, segment: SegmentRecord, offset: int) -> None:
        """The buffer at ``offset`` (still allocated) belongs to no object any more, if it
        did: its tenant's bytes no longer count it."""
        key = segment.owners.pop(offset, None)
        if key is None:
            return
        tenant = tenant_of(key)
        usage = self._usage[tenant]
        if segment.info.tier is _NVME:
            usage.nvme_bytes -= segment.allocator.size_of(offset)
        else:
            usage.dram_bytes -= segment.allocator.size_of(offset)
        if usage.empty():
            del self._usage[tenant]

    def _lease_ended(self, record: ObjectRecord) -> None:
        """A live object's lease no longer counts (``lease_open`` went False, or the object
        ends with it open)."""
        tenant = tenant_of(record.key)
        usage = self._usage[tenant]
        usage.leases -= 1
        if usage.empty():
            del self._usage[tenant]

    # ------------------------------------------------------------------ internals: puts

    def _put_start_one(
        self,
        client_id: str,
        key: str,
        size: int,
        wanted: int,
        options: PutOptions,
        now: float,
        pools: dict[Tier, TierPool] | None = None,
        checked: bool = False,
    ) -> PutSlot:
        """``pools``: the segments each tier offers, found once per call (see ``_pool``);
        ``checked``: the key is known to be valid."""
        if not checked:
            problem = key_problem(key, STORED_KEY_BYTES)
            if problem is not None:
                return PutSlot(KeyStatus.INVALID_KEY, message=problem)
        if size < 0:
            return PutSlot(
                KeyStatus.INVALID_ARGUMENT, message=f"size must not be negative, got {size}"
            )
        existing = self.objects.get(key)
        if existing is not None:
            return PutSlot(
                KeyStatus.ALREADY_EXISTS,
                message=_exists(existing, client_id, now, self.config.reservation_timeout),
            )
        over_nvme = False
        if self._put_quotas:
            refused = self._put_refusal(key, size, wanted, options.tier)
            if refused is not None:
                return PutSlot(KeyStatus.QUOTA_EXCEEDED, message=refused)
            if options.tier is _ANY and not self._within_bytes(key, size, wanted, _NVME):
                options = dataclasses.replace(options, tier=_DRAM)  # (NVMe: over its quota)
                over_nvme = True
        cap = self.config.max_objects
        if cap is not None and self.quotas is not None:
            refused = self._reservations_refusal(key, cap)
            if refused is not None:
                return PutSlot(KeyStatus.QUOTA_EXCEEDED, message=refused)
        table_full = cap is not None and len(self.objects) >= cap
        if table_full and not self._room_in_table(now, key):
            return PutSlot(
                KeyStatus.NO_SPACE,
                message=f"the master holds its most objects ({cap}, --max-objects) and may "
                "evict none of them (leased, being written or moving, or, with quotas, other "
                "tenants' within their share of the table): retry shortly, remove objects, or "
                "give the master more memory and a higher --max-objects",
            )
        replicas = self._place(key, size, wanted, options, now, pools)
        if not replicas:
            tenant = tenant_of(key)  # (another tenant's node restarting is none of its business)
            fenced = [
                s.fenced_until
                for s in self.segments.values()
                if s.fenced_until > now and _admits(s, tenant)
            ]
            if fenced and max(fenced) == math.inf:
                return PutSlot(
                    KeyStatus.FENCED,
                    message="a storage node is still reporting what its segment holds: retry "
                    "shortly",
                )
            if fenced:
                return PutSlot(
                    KeyStatus.FENCED,
                    message=f"space is fenced after a master change or a node restart for "
                    f"{max(fenced) - now:.1f} s more (old writers may still be copying, or "
                    "capabilities signed for the node's earlier process still run): retry "
                    "shortly",
                )
            if over_nvme:  # (NVMe, where it would have gone, is over its quota)
                refused = self._put_refusal(key, size, wanted, _NVME)
                return PutSlot(KeyStatus.QUOTA_EXCEEDED, message=refused or "")
            return PutSlot(
                KeyStatus.NO_SPACE,
                message=self._no_space_message(size, options.tier, tenant_of(key)),
            )
        if table_full and cap is not None and len(self.objects) >= cap:
            # (only now: a put refused for space must not have cost an object; and placing
            # it may have evicted for space already)
            self._evict_for_table(len(self.objects) - 1, now, tenant_of(key), None)
        put_id = next(self._put_ids)
        if self._own_floor is None:
            self._own_floor = put_id
        record = ObjectRecord(
            key,
            size,
            RESERVED,
            put_id,
            client_id,
            now,
            list(replicas),
            last_access=now,
            pin=options.pin,
            wanted=len(replicas),
        )
        if options.pin is _SOFT:
            record.pin_until = now + (options.pin_ttl or self.config.soft_pin_ttl)
        entry = (key, now, "reserved", record.put_id, client_id, replicas)
        self._transition(record, RESERVED, entry)
        self._reservations[key] = record
        held = self._reservations_of.get(client_id)
        if held is None:  # (no set made per key only to be dropped)
            held = self._reservations_of[client_id] = set()
        held.add(key)
        self.counters.puts_started += 1
        for replica in replicas:
            segment = self.segments[replica.segment_id]
            if (
                segment.info.tier is _NVME
                and size
                and not segment.info.space_reserved
                and replica.segment_id not in options.self_written
            ):
                self.outbox.append(
                    PrepareCommand(
                        next(self._command_ids),
                        segment.node_id,
                        segment.segment_id,
                        replica.offset,
                        size,
                    )
                )
        return make(PutSlot, (_OK, record.put_id, self._placed(record), ""))

    def _reservations_refusal(self, key: str, cap: int) -> str | None:
        """Why a put of ``key`` would take its tenant past the reservations one tenant may
        hold (``RESERVATIONS_SHARE`` of the master's table of ``cap`` objects), or None.
        Reservations are never evicted (their writers are copying into them): without this
        bound, one tenant's flood of them (renewed, never committed) could fill the table,
        and every other tenant's puts would find no room until they ended."""
        tenant = tenant_of(key)
        usage = self._usage.get(tenant)
        most = max(RESERVATIONS_MIN, cap // RESERVATIONS_SHARE)
        if usage is None or usage.reservations < most:
            return None
        self.quota_refusals[tenant, "reservations"] += 1
        return (
            f"tenant {tenant!r} holds {usage.reservations} reservations, the most one tenant "
            f"may hold (1/{RESERVATIONS_SHARE} of the master's table of {cap} objects, "
            f"--max-objects, and at least {RESERVATIONS_MIN}): commit or revoke the puts under "
            "way first"
        )

    def _put_refusal(self, key: str, size: int, wanted: int, tier: Tier) -> str | None:
        """Why a put of ``key`` would take its tenant over a quota (objects, reserved bytes,
        bytes of the tier it asks for: DRAM when it asks for none), or None."""
        assert self.quotas is not None
        tenant = tenant_of(key)
        quota = self.quotas.of(tenant)
        usage = self._usage.get(tenant) or TenantUsage()
        if quota.objects is not None and usage.objects >= quota.objects:
            return self._refused(tenant, "objects", quota.objects, usage.objects)
        reserved = quota.reserved_bytes
        if reserved is not None and usage.reserved_bytes + self._need(size) > reserved:
            need = self._need(size)
            return self._refused(tenant, "reserved_bytes", reserved, usage.reserved_bytes, need)
        if tier is Tier.UNSPECIFIED:
            tier = Tier.DRAM  # (and NVMe, its fallback, only within quota: _put_start_one)
        if not self._within_bytes(key, size, wanted, tier):
            limit = quota.bytes_limit(tier)
            assert limit is not None
            name = "nvme_bytes" if tier is Tier.NVME else "dram_bytes"
            held = usage.bytes_in(tier)
            return self._refused(tenant, name, limit, held, self._need(size) * wanted)
        return None

    def _need(self, size: int) -> int:
        """The bytes a buffer of ``size`` takes (as the allocator rounds each one)."""
        alignment = self.config.alignment
        return (max(size, 1) + alignment - 1) & ~(alignment - 1)

    def _within_bytes(self, key: str, size: int, replicas: int, tier: Tier) -> bool:
        """Whether ``replicas`` more buffers of ``size`` in ``tier`` keep ``key``'s tenant
        within its quota of that tier's bytes (True without quotas)."""
        if self.quotas is None:
            return True
        tenant = tenant_of(key)
        limit = self.quotas.of(tenant).bytes_limit(tier)
        if limit is None:
            return True
        usage = self._usage.get(tenant)
        held = usage.bytes_in(tier) if usage is not None else 0
        return held + self._need(size) * replicas <= limit

    def _refused(self, tenant: str, quota: str, limit: int, held: int, asked: int = 1) -> str:
        self.quota_refusals[tenant, quota] += 1
        return refusal(tenant, quota, limit, held, asked)

    def lease_refusal(self, tenant: str) -> str:
        """Why a lease of ``tenant``'s was refused (QUOTA_EXCEEDED), for the caller: its
        quota of leases, the limit and how many it holds now."""
        limit = self.quotas.of(tenant).leases if self.quotas is not None else None
        if limit is None:
            return ""  # (the quota was lifted meanwhile)
        usage = self._usage.get(tenant)
        return refusal(tenant, "leases", limit, usage.leases if usage is not None else 0)

    def _lease_refused(self, record: ObjectRecord, now: float) -> bool:
        """Whether a new lease on ``record`` (it holds none) would take its tenant over its
        quota of leases. Leases that ended but are not counted out yet are first."""
        assert self.quotas is not None
        tenant = tenant_of(record.key)
        limit = self.quotas.of(tenant).leases
        if limit is None:
            return False
        usage = self._usage.get(tenant)
        if usage is None or usage.leases < limit:
            return False
        self._count_ended_leases(now, [LEASE_SWEEP])
        usage = self._usage.get(tenant)
        if usage is None or usage.leases < limit:
            return False
        self.quota_refusals[tenant, "leases"] += 1
        return True

    def _put_end_one(self, commit: Commit, now: float) -> KeyStatus | None:
        record = self.objects.get(commit.key)
        if record is None or record.put_id != commit.put_id:
            return KeyStatus.STALE_PUT
        state = record.state
        if state is PUBLISHED:
            return KeyStatus.OK  # a retried commit
        if state is COMMITTED:
            return None  # a retried commit: it still waits for its nodes
        replicas = record.replicas
        if len(commit.replica_ok) != len(replicas):
            return KeyStatus.INVALID_ARGUMENT
        if all(commit.replica_ok) and None not in replicas:  # (the usual case: all written)
            kept, unwritten = replicas, 0
        else:
            kept = []
            failed: list[Replica | None] = []
            for replica, ok in zip(replicas, commit.replica_ok, strict=True):
                (kept if ok and replica is not None else failed).append(replica)
            self._forget_grants(record, failed)
            self._release(failed, self._reuse_after(record, now))
            unwritten = len(failed)
        self._end_reservation(record)
        if not kept:
            self._transition(record, GONE, (record.key, now, "write_failed", record.put_id))
            return KeyStatus.NO_REPLICA
        record.replicas = kept
        self._transition(
            record, COMMITTED, (record.key, now, "committed", record.put_id, unwritten)
        )
        record.crc32c = commit.crc32c
        record.unacked = frozenset([r.segment_id for r in kept if r is not None])
        return None

    def _persist_done(self, record: ObjectRecord, segment_id: str, ok: bool) -> None:
        """A node recorded (or failed to record) a committed object's replica; once every
        node has answered, the object is published with the replicas that were recorded."""
        _acknowledged(record, segment_id)
        if not ok:
            self._drop_replica(record, segment_id)
        if not record.unacked:
            self._finish_commit(record)

    def _finish_commit(self, record: ObjectRecord) -> None:
        # On every put of every object: written without generators.
        if self.objects.get(record.key) is not record:
            return  # removed (by force) or lost while committing: already answered
        replicas = record.replicas
        if None in replicas:  # (a replica lost meanwhile; else the list is kept as it is)
            replicas = [r for r in replicas if r is not None]
        now = self.clock()
        why = self._why_not_recorded(record) if self._persist_errors else ""
        if not replicas:
            self._transition(record, GONE, (record.key, now, "not_recorded", record.put_id))
            no_replica = CommitResult(record.key, record.put_id, KeyStatus.NO_REPLICA, why)
            self.resolved.append(no_replica)
            return
        record.replicas = replicas
        entry = (record.key, now, "published", record.put_id, tuple(replicas))
        self._transition(record, PUBLISHED, entry)
        self._tombstones.superseded(record.key, record.put_id)  # (its generation)
        record.last_access = now
        self._index_published(record)
        if record.pin is _SOFT:
            heapq.heappush(self._pin_ends, (record.pin_until, next(self._seq), record))
        self.counters.puts_published += 1
        self.resolved.append(make(CommitResult, (record.key, record.put_id, _OK, "")))
        if self._draining or len(replicas) != record.wanted:  # (a replica not written, ...)
            self._replication_changed(record)

    def _stored(self, record: ObjectRecord, segment_id: str) -> StoredObject:
        for replica in record.replicas:
            if replica is not None and replica.segment_id == segment_id:
                generation = record.put_id  # (``ObjectRecord.generation``, not its property)
                return make(
                    StoredObject,
                    (
                        record.key,
                        replica.offset,
                        record.size,
                        generation,
                        record.crc32c,
                        record.wanted,
                        False,
                    ),
                )
        raise KeyError(f"{record.key!r} has no replica in segment {segment_id!r}")

    # ------------------------------------------------------------------ placement

    def _place(
        self,
        key: str,
        size: int,
        wanted: int,
        options: PutOptions,
        now: float,
        pools: dict[Tier, TierPool] | None = None,
    ) -> list[Replica]:
        """Buffers for a new object in the tier asked for. ``UNSPECIFIED`` (any) tries DRAM,
        then NVMe, and evicts from DRAM only when neither has room."""
        tiers = _ANY_TIER if options.tier is _ANY else (options.tier,)
        hosts = options.preferred_hosts
        if self._silent_until and (silent := self._silent_nodes(now)):
            # Nodes silent on their commands take an object only when no other node has
            # room for it (the rest of this): a put placed there would time out.
            avoid = options.avoid_nodes | silent
            for tier in tiers:
                replicas = self._allocate(key, size, wanted, now, hosts, tier, pools, avoid)
                if replicas:
                    return replicas
        for tier in tiers:
            replicas = self._allocate(
                key, size, wanted, now, hosts, tier, pools, options.avoid_nodes
            )
            if replicas:
                return replicas
        for tier in tiers:
            self._evict_to_fit(size, tier, now, tenant_of(key))
            if pools is not None:
                pools.pop(tier, None)  # space came free: a pool's ranking would be stale
            replicas = self._allocate(
                key, size, wanted, now, hosts, tier, pools, options.avoid_nodes
            )
            if replicas:
                return replicas
        return []

    def _pool(self, tier: Tier, tenant: str) -> TierPool:
        """The nodes with segments of ``tier`` that take writes of ``tenant``'s objects now,
        each with those segments (in a deterministic order). Placing a batch's objects
        changes only free space, not this, so a PutStart (one tenant's) finds it once."""
        now = self.clock()
        entries = []
        for node in self.nodes.values():
            if node.draining:
                continue  # (it takes nothing new)
            ids = node.segment_ids
            segments = [
                segment
                for segment in map(self.segments.__getitem__, sorted(ids) if len(ids) > 1 else ids)
                if segment.info.tier is tier
                and segment.fenced_until <= now
                and _admits(segment, tenant)
            ]
            if segments:
                entries.append((node, segments))
        return TierPool(entries)

    def _allocate(
        self,
        key: str,
        size: int,
        wanted: int,
        now: float,
        preferred_hosts: Sequence[str] = (),
        tier: Tier = Tier.DRAM,
        pools: dict[Tier, TierPool] | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> list[Replica]:
        """One buffer on each of up to ``wanted`` distinct nodes, in segments of ``tier``
        (chosen as master/placement.py says). ``pools`` caches ``_pool`` across one call's
        objects."""
        pool = pools.get(tier) if pools is not None else None
        if pool is None:
            pool = self._pool(tier, tenant_of(key))
            if pools is not None:
                pools[tier] = pool
        most_free = self.config.placement == "most-free"
        replicas = []
        for segment in pool.choose(size, wanted, preferred_hosts, self.rng, most_free, avoid):
            offset = segment.allocator.allocate(size)
            assert offset is not None, "placement said it fits"
            self._own(segment, offset, key)
            segment.granted_at = now
            replicas.append(make(Replica, (segment.segment_id, offset)))
        return replicas

    def silence_message(self) -> str:
        """Why no node serves, once every node this master had went silent (``all_silent``)."""
        assert self.all_silent is not None
        since, names, count = self.all_silent
        ago = max(0.0, self.clock() - since)
        named = ", ".join(names) + (f" and {count - len(names)} more" if count > len(names) else "")
        return (
            f"the master hears from no storage node: the last ({named}) were declared dead "
            f"{ago:.0f} s ago, after {self.config.node_ttl:g} s without a heartbeat. They may "
            "be down, or this master cut off from them: check that `kvpool node` runs on "
            "their hosts and can reach this master (their logs say why not)"
        )

    def _no_space_message(self, size: int, tier: Tier = Tier.UNSPECIFIED, tenant: str = "") -> str:
        """Why nothing could be placed, in the terms of the segments that may hold the
        tenant's objects (of others, it says nothing: not even how much they hold)."""
        segments = [
            s for s in self.segments.values() if tier is Tier.UNSPECIFIED or s.info.tier is tier
        ]
        where = "" if tier is Tier.UNSPECIFIED else f" in the {tier.name} tier"
        admitting = [s for s in segments if _admits(s, tenant)]
        if segments and not admitting:
            return (
                f"no storage node{where} takes tenant {tenant!r}'s objects: each serves "
                "another tenant only (`kvpool node --tenant`). Start a node for this tenant "
                "(--tenant " + repr(tenant) + "), or one without --tenant"
            )
        segments = admitting
        if not segments and not self.segments and self.all_silent is not None:
            return self.silence_message()
        if not segments and tier is Tier.NVME:
            return (
                f"no storage node has mounted a segment{where} yet: start one with "
                "`kvpool node --master HOST:PORT --nvme PATH --nvme-size 200GiB` (`kvpool up "
                "--nvme-size 1GiB` locally), or put without tier='nvme'"
            )
        if not segments:
            return (
                f"no storage node has mounted a segment{where} yet: start one with "
                "`kvpool node --master HOST:PORT --dram 4GiB` (or --nvme PATH --nvme-size SIZE)"
            )
        largest = max(s.allocator.largest_free for s in segments)
        free = sum(s.allocator.free_bytes for s in segments)
        capacity = sum(s.allocator.capacity for s in segments)
        return (
            f"no segment{where} can hold {format_size(size)} ({size} bytes), even after evicting "
            f"what may be evicted: the largest free extent is {format_size(largest)} ({largest} "
            f"bytes); {format_size(free)} free of {format_size(capacity)} in "
            f"{len(segments)} segments.{self._coming_free_in(tier, tenant, segments)} Remove "
            "objects, add "
            "storage nodes, or store smaller objects."
        )

    def _coming_free_in(self, tier: Tier, tenant: str, segments: list[SegmentRecord]) -> str:
        """``_coming_free`` of a tier's segments, found once per PutStart: it walks every
        buffer waiting, and a batch of keys that all find no space would walk them once per
        key (a tenant's batch of refused keys held the master's loop for seconds)."""
        cache = self._coming_free_by_tier
        if cache is None:
            return self._coming_free(segments)
        found = cache.get((tier, tenant))
        if found is None:
            found = cache[tier, tenant] = self._coming_free(segments)
        return found

    def _coming_free(self, segments: list[SegmentRecord]) -> str:
        """For a NO_SPACE message: the space of objects gone from ``segments`` that is not
        free yet (readers' leases on them still run, or a reclaim delay), and when the last
        of it is; "" when there is none. Walks the buffers waiting: on a refusal only."""
        among = {id(segment) for segment in segments}
        held, until = 0, 0.0
        for release_at, _, segment, offset in self._deferred:
            if id(segment) in among and self.segments.get(segment.segment_id) is segment:
                held += segment.allocator.size_of(offset)
                until = max(until, release_at)
        if not held:
            return ""
        return (
            f" {format_size(held)} more comes free within {max(0.0, until - self.clock()):.1f} s"
            " (objects removed while readers held leases on them, reservations whose writers"
            " may still copy): retry then."
        )

    # ------------------------------------------------------------------ internals: reads

    def _lease(self, record: ObjectRecord, now: float, ttl: float, client_id: str = "") -> None:
        # On every read of every key: written for speed (no helper calls on the common path).
        until = now + ttl
        if client_id != record.lease_client:  # every lease so far now counts as another's
            if record.lease_until > record.others_until:
                record.others_until = record.lease_until
            record.lease_client = client_id
        if not record.lease_open:
            record.lease_open = True
            heapq.heappush(self._lease_ends, (until, next(self._seq), record))
            self._usage_of(record.key).leases += 1
        elif record.lease_until <= now:
            self.counters.lease_expiries += 1  # the last lease ran out before this one
            heapq.heappush(self._lease_ends, (until, next(self._seq), record))
        if until > record.lease_until:
            record.lease_until = until
        record.last_access = now
        key = record.key
        self._lru.touch(key)
        segments = self.segments
        for replica in record.replicas:
            if replica is not None:
                segments[replica.segment_id].lru.touch(key)

    def _lease_ttl(self, requested: float) -> float:
        if requested <= 0:
            return self.config.lease_ttl
        return min(requested, self.config.max_lease_ttl)

    def _placed(self, record: ObjectRecord) -> tuple[PlacedReplica, ...]:
        segments = self.segments
        placed = []
        for replica in record.replicas:
            if replica is not None:
                info = segments[replica.segment_id].info
                placed.append(make(PlacedReplica, (info, info.base_address + replica.offset)))
        return tuple(placed)

    # ------------------------------------------------------------------ internals: adoption

    def _adopt(
        self, segment: SegmentRecord, item: StoredObject, now: float, relisted: list[ObjectRecord]
    ) -> bool:
        """Takes an object a node reports into the index; False when it must be dropped. What
        a node reports is checked as a new put would be: a node's index is input, not truth
        (it may be damaged, or the node foreign). A replica of an object used here goes into
        ``relisted``, for the caller to index in the segment's LRU."""
        if not _well_formed(item) or not _admits(segment, tenant_of(item.key)):
            return False
        if item.generation >> 32 > self.epoch + EPOCHS_AHEAD:
            return False  # of a term no master can have had yet: put ids would run out
        existing = self.objects.get(item.key)
        known = existing is not None and existing.generation == item.generation
        replica = Replica(segment.segment_id, item.offset)
        if known and existing is not None and replica in existing.replicas:
            return True  # (a part of a report sent again: adopted then)
        if (
            item.unconfirmed
            and not known
            and not self._tombstones.went_away(segment.segment_id, item.key, item.generation)
        ):
            return False  # its removal may be what the node's damaged log lost
        if self._tombstones.refuses(
            segment.segment_id, item.key, item.generation, known, segment.node_id, item.offset
        ):
            return False  # removed while its node was away, or its Forget unanswered
        if existing is not None:
            if existing.state is not ObjectState.PUBLISHED:
                return False  # a new write of the key is under way
            if existing.generation > item.generation:
                return False  # an older copy
            if existing.generation == item.generation and existing.size != item.size:
                return False  # not a copy of this object
            if existing.generation < item.generation:  # superseded by a newer write
                if not existing.adopted or self.issued_here(item.generation):
                    # an object this master published itself is newer than any put another
                    # master made (keys are written once: a later put of the key went
                    # through this master), and a put this master made it never published
                    # over the object it knows: a node reporting either is mistaken, or
                    # lying (it would take over a key it was never given, with a
                    # generation of a term ahead, say)
                    return False
                self._remove(
                    existing,
                    now,
                    (existing.key, now, "superseded", existing.put_id, item.generation),
                )
                existing = None
        if not segment.allocator.allocate_at(item.offset, item.size):
            return False  # overlaps a newer object
        self._own(segment, item.offset, item.key)
        self.counters.objects_adopted += 1
        if existing is not None:
            existing.replicas.append(replica)
            if existing.adopted and existing.last_access < existing.created_at:
                segment.lru.add_oldest(item.key, existing.pin)  # (read by no one since)
            else:
                relisted.append(existing)  # (indexed by when it was last used)
            if existing.lease_open and existing.lease_until <= now:
                # A lease that ran out and no tick has counted yet (its budget ran out):
                # it ends here. The hold below (reads begun before a restart finish) is no
                # lease of its own; extended, the old one would be counted as the next.
                existing.lease_open = False
                self.counters.lease_expiries += 1
                self._lease_ended(existing)
            existing.lease_until = max(existing.lease_until, now + self.config.lease_ttl)
            self._note((item.key, now, "replica_adopted", existing.put_id, replica))
            if existing.adopted:  # known from reports only: the most any asks, else as
                # many as report it (a node of an older kvpool records no count)
                reported = self._reported_replicas(item) or len(self._nodes_of(existing))
                existing.wanted = max(existing.wanted, reported)
            self._replication_changed(existing)  # a surplus if it was copied meanwhile
            return True
        record = ObjectRecord(
            item.key,
            item.size,
            ObjectState.PUBLISHED,
            item.generation,
            "",
            now,
            [replica],
            lease_until=now + self.config.lease_ttl,  # reads begun before a restart finish
            # (just before it was taken back: a read since, even now, is later)
            last_access=math.nextafter(now, -math.inf),
            crc32c=item.crc32c,
            wanted=self._reported_replicas(item) or 1,
            adopted=True,
        )
        self._transition(record, PUBLISHED, (record.key, now, "adopted", item.generation, replica))
        self._index_published(record, taken_back=True)
        if record.wanted > 1 and self._replication.enabled:
            # the nodes of its other replicas may not have mounted yet (a failover): it is
            # looked at once they had the time to, and copied if they did not
            self._replication.look_again(record.key, now, self.config.node_ttl)
        self._put_ids = itertools.count(max(next(self._put_ids), item.generation + 1))
        return True

    def issued_here(self, generation: int) -> bool:
        """Whether ``generation`` is a put id this master gave out (or one its epoch gives
        out later): no report supersedes a published object with one."""
        floor = self._own_floor
        return floor is not None and generation >= floor and generation >> 32 == self.epoch

    def _reported_replicas(self, item: StoredObject) -> int:
        """The replica count a node recorded with an object (its put's), at most the most a
        put may ask of this master; 0: not recorded."""
        return min(item.replicas, self.config.max_replicas) if item.replicas > 0 else 0

    # ------------------------------------------------------------------ internals: moves

    def _maybe_promote(self, record: ObjectRecord) -> None:
        """Copies an object held only on NVMe into DRAM on the same node, if DRAM has room
        below its watermark (never evicting for it)."""
        if record.moving:
            return
        segments = self.segments
        for replica in record.replicas:
            if replica is not None and segments[replica.segment_id].info.tier is _DRAM:
                return  # the common case, on every hit: written without a generator
        source = record.replicas[0]
        assert source is not None
        node = self.nodes.get(self.segments[source.segment_id].node_id)
        if node is None or node.draining:
            return
        if self._put_quotas and not self._within_bytes(record.key, record.size, 1, _DRAM):
            return  # (its tenant's DRAM quota is reached: read from NVMe)
        for segment_id in sorted(node.segment_ids):  # deterministic order
            target = self.segments[segment_id]
            allocator = target.allocator
            need = allocator.rounded(record.size)
            if (
                target.info.tier is Tier.DRAM
                and target.fenced_until <= self.clock()  # an old writer may copy in there
                and allocator.largest_free >= need
                and allocator.used + need <= self.config.high_watermark * allocator.capacity
                and not self._refused_at_remount(target, record)
            ):
                self._start_move(record, source, target, demotion=False)
                return

    def _try_demote(self, record: ObjectRecord, source: Replica) -> bool:
        """Starts moving a DRAM replica to NVMe on the same node, if that has room."""
        node = self.nodes.get(self.segments[source.segment_id].node_id)
        if node is None or record.moving or node.draining:
            return False
        if self._put_quotas and not self._within_bytes(record.key, record.size, 1, _NVME):
            return False  # (evicted instead: its tenant's NVMe quota is reached)
        paused = self._demotions_paused
        for segment_id in sorted(node.segment_ids):  # deterministic order
            if paused and segment_id in paused:
                if paused[segment_id] > self.clock():
                    continue  # (its node failed a demotion there lately)
                del paused[segment_id]
            target = self.segments[segment_id]
            if (
                target.info.tier is Tier.NVME
                and target.fenced_until <= self.clock()  # an old writer may copy in there
                and target.allocator.largest_free >= target.allocator.rounded(record.size)
                and not self._refused_at_remount(target, record)
            ):
                self._start_move(record, source, target, demotion=True)
                return True
        return False

    def _refused_at_remount(self, segment: SegmentRecord, record: ObjectRecord) -> bool:
        """Whether the segment's next mount would refuse a copy of ``record`` there, or
        might once a write of it still awaited there is answered (``_written_there``): an
        unanswered Forget of the same generation on it (an earlier copy there given up, say),
        or a late write of it kept out. Those could refuse the place it lands on (a Forget's
        place is free again before the node answers; a durable record, which a new leader
        holds to, names no place at all), and the node would be told to forget the copy: the
        object, if that was its last replica, lost. No copy goes there until the node has
        answered (or the segment has been reconciled)."""
        if self._awaited_writes and self._written_there(segment.segment_id, record):
            return True
        if not len(self._tombstones):
            return False  # (the common case)
        return self._tombstones.refuses(
            segment.segment_id, record.key, record.generation, True, segment.node_id
        )

    def _await(self, command_id: int, segment_id: str, records: tuple[ObjectRecord, ...]) -> None:
        """Notes a Persist or Copy to ``segment_id`` of ``records`` as awaited."""
        self._awaiting[command_id] = (segment_id, records)
        writes = self._awaited_writes
        for record in records:
            place = (segment_id, record.key, record.generation)
            writes[place] = writes.get(place, 0) + 1

    def _unawait(self, command_id: int) -> tuple[str, tuple[ObjectRecord, ...]]:
        """Takes a Persist or Copy off the awaited ones (``_await``'s other half): its
        segment and objects, ("", ()) for one not awaited."""
        segment_id, records = self._awaiting.pop(command_id, ("", ()))
        self._copy_places.pop(command_id, None)
        writes = self._awaited_writes
        for record in records:
            place = (segment_id, record.key, record.generation)
            left = writes[place] - 1
            if left:
                writes[place] = left
            else:
                del writes[place]
        return segment_id, records

    def _written_there(self, segment_id: str, record: ObjectRecord) -> bool:
        """Whether a Persist or Copy of ``record``'s generation to ``segment_id`` is still
        awaited (a copy cancelled meanwhile included: its target waits for the answer). Its
        answer may yet send a Forget of that place, refused at remounts until answered, and
        a new leader refuses every place of the generation its durable record names: a copy
        placed there meanwhile would go with it."""
        return (segment_id, record.key, record.generation) in self._awaited_writes

    def _start_move(
        self, record: ObjectRecord, source: Replica, target: SegmentRecord, *, demotion: bool
    ) -> None:
        offset = target.allocator.allocate(record.size)
        assert offset is not None
        self._own(target, offset, record.key)
        destination = Replica(target.segment_id, offset)
        command_id = next(self._command_ids)
        record.moving[command_id] = Move(source, destination, demotion)
        if demotion:
            self.segments[source.segment_id].leaving += target.allocator.rounded(record.size)
        event = "demoting" if demotion else "promoting"
        self._note((record.key, self.clock(), event, record.put_id, source, destination))
        self._await(command_id, target.segment_id, (record,))
        self._copy_places[command_id] = offset
        self.outbox.append(
            CopyCommand(
                command_id,
                target.node_id,
                source.segment_id,
                self._stored(record, source.segment_id),
                target.segment_id,
                StoredObject(
                    record.key, offset, record.size, record.generation, record.crc32c, record.wanted
                ),
            )
        )

    def _move_done(
        self, record: ObjectRecord, command_id: int, ok: bool, crc32c: int | None, how: str
    ) -> None:
        """A copy ended: ``how`` is "answered" (by its node), "corrupt" (answered: the
        source's bytes failed the object's checksum), "held" (answered: a same-host writer
        still holds the target's range, which its failed Forget quarantines: no pause of
        demotions, no blame on the source), "expired" (the I/O layer gave up on the answer)
        or "cancelled" (a segment of its went away while it ran)."""
        move = record.moving.pop(command_id)
        self._replication.ended(command_id)
        source_segment = self.segments.get(move.source.segment_id)
        if move.demotion and source_segment is not None:
            source_segment.leaving -= source_segment.allocator.rounded(record.size)
        target = self.segments.get(move.target.segment_id)
        alive = self.objects.get(record.key) is record and move.source in record.replicas
        now = self.clock()
        if not ok or not alive or target is None:
            if not ok:
                why = {"answered": "failed", "corrupt": "source corrupt"}.get(how, how)
            else:
                why = "target segment gone" if target is None else "object or source gone"
            self._note((record.key, now, "move_failed", record.put_id, move.target, why))
            if move.demotion and not ok and how == "answered" and target is not None:
                self._demotions_paused[target.segment_id] = now + DEMOTION_PAUSE
            if move.replication and self.objects.get(record.key) is record:
                self._replication.look_again(record.key, now)
                if not ok and how in ("answered", "corrupt"):
                    failed = self._copy_failed_from
                    failed.pop(record.key, None)
                    failed[record.key] = move.source
                    if len(failed) > MAX_COPY_FAILURES_KEPT:
                        del failed[next(iter(failed))]
                if how == "corrupt" and alive:
                    self._drop_corrupt_source(record, move.source, now)
            if target is not None:
                self._disown(target, move.target.offset)
                if how == "cancelled":  # its node may still be writing there
                    self._parked[command_id] = (target, move.target.offset, record, 0.0)
                    return
                # (a held target gets no Forget: the node wrote nothing there, and a Forget
                # would note a tombstone of the object on its segment, refusing its good copy
                # there at a remount. Its range is not reused for a while either: the failed
                # Forget of the range, which quarantines it, may be gone (a remount) or not
                # have come, and a copy placed there again at every tick would hold the node's
                # commands up a tenth of a second each, for as long as the writer is stopped)
                if how == "held":  # (no drain waits for it: nothing is there)
                    rest = now + max(self.config.reclaim_delay, DEMOTION_PAUSE)
                    self._release([move.target], rest, target, resting=True)
                    return
                self._abandon_copy(target, record, move.target.offset, ok, how == "expired")
            return
        # (a copy's checksum is of whatever its source held: an object its writer gave none
        # keeps none, so that verify=True says it cannot check it rather than vouch for it)
        record.replicas.append(move.target)
        target.lru.add(record.key, record.pin)
        if move.replication:
            self._copy_failed_from.pop(record.key, None)
            self._note((record.key, now, "replicated", record.put_id, move.target))
            self.counters.replicas_copied += 1
            self.counters.bytes_copied += record.size
            self._replication_changed(record)
            return
        event = "demoted" if move.demotion else "promoted"
        self._note((record.key, now, event, record.put_id, move.target))
        if move.demotion:
            self._release_replica(record, move.source, now)
            self.counters.demotions += 1
        else:
            self.counters.promotions += 1

    def _drop_corrupt_source(self, record: ObjectRecord, source: Replica, now: float) -> None:
        """A copy's target found ``source``'s bytes failing the object's checksum: the replica
        goes where the object has another (readers would get wrong bytes from it, and copies
        would fail on it), and the object gets a copy elsewhere. Its only replica stays (the
        word of one node, the target, is not enough to end an object), as does one another
        copy may be reading."""
        if record.state is not PUBLISHED or record.moving:
            return
        if sum(r is not None for r in record.replicas) < 2:
            return
        self._drop_bad_replica(record, source, now, "replica_corrupt")

    def _abandon_copy(
        self,
        segment: SegmentRecord,
        record: ObjectRecord,
        offset: int,
        ok: bool,
        expired: bool,
        not_before: float = 0.0,
    ) -> None:
        """Gives up the target of a copy nobody wants any more, no longer owned by its object,
        once the node answered (``ok``: it recorded the copy) or the I/O layer gave up on the
        answer (``expired``: the node may yet record it, and may still be writing there). A
        node that recorded (or may record) the copy is told to forget it; the space returns
        at ``not_before``, or ``reclaim_delay`` from now when expired."""
        if (ok or expired) and self.segments.get(segment.segment_id) is segment:
            self._send_forget(segment, record, offset)
        if expired:
            not_before = max(not_before, self.clock() + self.config.reclaim_delay)
        self._release([Replica(segment.segment_id, offset)], not_before, segment)

    # ------------------------------------------------------------------ internals: re-replication

    def _nodes_of(self, record: ObjectRecord) -> set[str]:
        segments = self.segments
        return {segments[r.segment_id].node_id for r in record.replicas if r is not None}

    def _healthy_nodes(self, record: ObjectRecord) -> set[str]:
        """The nodes holding a replica of ``record`` that are not draining."""
        nodes = self._nodes_of(record)
        if self._draining:
            nodes = {n for n in nodes if not self.nodes[n].draining}
        return nodes

    def _replication_changed(self, record: ObjectRecord) -> None:
        """A published object's replicas changed (one lost, adopted, copied, its node
        draining): re-replication looks at it at the next tick if it lies on fewer nodes
        than it should, or on more."""
        replication = self._replication
        if not replication.enabled or record.state is not ObjectState.PUBLISHED:
            return
        healthy = len(self._healthy_nodes(record))
        if healthy < record.wanted:
            replication.under.add(record.key)
            replication.look_at(record.key)
        else:
            replication.under.discard(record.key)
            if healthy > record.wanted:
                replication.look_at(record.key)

    def _rereplicate(self, now: float, budget: list[int] | None) -> None:
        """Starts copies for the objects on too few nodes (as many as the rate and the
        copies in flight allow), and trims surplus replicas (one node's at a time, none
        while a copy of the object is in flight). Each key looked at takes one of
        ``budget``; keys left over wait for the next tick."""
        replication = self._replication
        replication.due(now)
        live = len(self.nodes) - self._draining
        while True:
            key = replication.next_key()
            if key is None:
                return
            if _spent(budget):
                replication.put_back(key)
                return
            record = self.objects.get(key)
            if record is None or record.state is not ObjectState.PUBLISHED:
                continue  # (looked at again once published)
            healthy = self._healthy_nodes(record)
            copying = sum(1 for move in record.moving.values() if move.replication)
            if len(healthy) + copying < record.wanted:
                replication.under.add(key)
                holders = self._nodes_of(record) | {
                    self.segments[m.target.segment_id].node_id for m in record.moving.values()
                }
                if live <= len(holders - self._draining_ids()):
                    continue  # no other node: looked at again when one mounts
                if not replication.may_start(now):
                    replication.put_back(key)
                    return
                if not self._start_replica_copy(record, healthy, holders, now):
                    replication.look_again(key, now)  # no room now
                elif len(healthy) + copying + 1 < record.wanted:
                    replication.look_at(key)  # more to come
                continue
            if len(healthy) >= record.wanted:
                replication.under.discard(key)
            if len(healthy) > record.wanted and not record.moving:
                self._trim(record, healthy, now)

    def _draining_ids(self) -> set[str]:
        if not self._draining:
            return set()
        return {node_id for node_id, node in self.nodes.items() if node.draining}

    def _start_replica_copy(
        self, record: ObjectRecord, healthy: set[str], holders: set[str], now: float
    ) -> bool:
        """Copies ``record`` to a node that holds none of it and takes new objects, into a
        segment with room below the high watermark (of its source's tier, else the other);
        False when there is none. The copy reads a replica on a node that is not draining,
        if there is one, but not the one the last copy of it failed to read from where it
        has another (its bytes may not match the object's checksum: the same copy would fail
        for ever, while a draining node holding a good one leaves with it)."""
        replicas = [r for r in record.replicas if r is not None]
        failed = self._copy_failed_from.get(record.key)
        if failed is not None and len(replicas) > 1:  # (another source, a draining one too)
            replicas = [r for r in replicas if r != failed] or replicas
        source = next(
            (r for r in replicas if self.segments[r.segment_id].node_id in healthy), replicas[0]
        )
        source_segment = self.segments[source.segment_id]
        first = source_segment.info.tier
        target = None
        for tier in (first, Tier.NVME if first is Tier.DRAM else Tier.DRAM):
            target = self._replica_target(record, tier, holders, now)
            if target is not None:
                break
        if target is None:
            return False
        offset = target.allocator.allocate(record.size)
        assert offset is not None, "the target has room"
        self._own(target, offset, record.key)
        destination = Replica(target.segment_id, offset)
        command_id = next(self._command_ids)
        record.moving[command_id] = Move(source, destination, False, replication=True)
        self._note((record.key, now, "replicating", record.put_id, source, destination))
        self._await(command_id, target.segment_id, (record,))
        self._copy_places[command_id] = offset
        self.outbox.append(
            CopyCommand(
                command_id,
                target.node_id,
                source.segment_id,
                self._stored(record, source.segment_id),
                target.segment_id,
                StoredObject(
                    record.key, offset, record.size, record.generation, record.crc32c, record.wanted
                ),
                source_segment.info,
            )
        )
        self._replication.started(command_id, record.size, now)
        return True

    def _replica_target(
        self, record: ObjectRecord, tier: Tier, holders: set[str], now: float
    ) -> SegmentRecord | None:
        """The segment of ``tier`` that may hold ``record`` with the most room on a node
        outside ``holders`` that takes new objects, whose use stays below the high watermark
        with its size more (a copy never makes eviction take other objects), and whose next
        mount would not refuse it (``_refused_at_remount``)."""
        size = record.size
        high, tenant = self.config.high_watermark, tenant_of(record.key)
        silent = self._silent_nodes(now)
        best: SegmentRecord | None = None
        best_free = -1.0
        for node in self.nodes.values():
            if node.draining or node.node_id in holders or node.node_id in silent:
                continue
            for segment_id in sorted(node.segment_ids):
                segment = self.segments[segment_id]
                allocator = segment.allocator
                if (
                    segment.info.tier is not tier
                    or segment.fenced_until > now
                    or not _admits(segment, tenant)
                ):
                    continue
                need = allocator.rounded(size)
                if (
                    allocator.largest_free < need
                    or allocator.used + need > high * allocator.capacity
                    or self._refused_at_remount(segment, record)
                ):
                    continue
                free = 1.0 - allocator.used / allocator.capacity
                if free > best_free:
                    best, best_free = segment, free
        return best

    def _trim(self, record: ObjectRecord, healthy: set[str], now: float) -> None:
        """Drops the replicas of one node of an object on more nodes than it should be: the
        node of its latest replica (one that came back after its objects were copied
        elsewhere). Readers holding leases keep the bytes until their leases end."""
        segments = self.segments
        victim = next(
            segments[r.segment_id].node_id
            for r in reversed(record.replicas)
            if r is not None and segments[r.segment_id].node_id in healthy
        )
        for replica in [
            r for r in record.replicas if r is not None and segments[r.segment_id].node_id == victim
        ]:
            self._release_replica(record, replica, now)
            self._note((record.key, now, "replica_trimmed", record.put_id, replica))
            self.counters.replicas_trimmed += 1
        self._replication_changed(record)

    # ------------------------------------------------------------------ internals: removal

    def _removal_status(self, record: ObjectRecord | None, now: float, force: bool) -> KeyStatus:
        if record is None:
            return KeyStatus.NOT_FOUND
        if record.state is not PUBLISHED and not force:
            return KeyStatus.NOT_READY
        if record.lease_until > now and not force:
            return KeyStatus.HAS_LEASE
        return _OK

    def _remove(
        self, record: ObjectRecord, now: float, entry: tuple[Any, ...], *, lost: bool = False
    ) -> None:
        """``entry``: why, for the key's story; ``lost``: counted as lost, not removed."""
        if record.state is COMMITTED:
            self.resolved.append(CommitResult(record.key, record.put_id, KeyStatus.STALE_PUT))
        self._forget(record, entry)
        if record.state is RESERVED:
            self._forget_grants(record, record.replicas)
            self._release_reservation(record, now)  # its writer may still be copying
        else:
            release_at = self._reuse_after(record, now)  # its readers may still be copying
            self._send_forgets(record)  # nodes may have recorded it (or be about to)
            self._release(record.replicas, release_at)
        if self._parked and record.state is not RESERVED:
            for parked_in, offset, parked, _ in list(self._parked.values()):
                if parked is record and self.segments.get(parked_in.segment_id) is parked_in:
                    # a copy cancelled earlier (its source went) that its node may record
                    # yet: forgotten now, so that the removal waits for it too
                    self._send_forget(parked_in, record, offset)
        for command_id, move in record.moving.items():  # copies in flight: cancelled
            self._replication.ended(command_id)
            target = self.segments.get(move.target.segment_id)
            if target is not None:  # its node may record the copy before it hears of this
                self._send_forget(target, record, move.target.offset)
                # The target waits for the node's answer (it may still be writing there).
                self._disown(target, move.target.offset)
                self._parked[command_id] = (target, move.target.offset, record, release_at)
            source = self.segments.get(move.source.segment_id)
            if move.demotion and source is not None:
                source.leaving -= source.allocator.rounded(record.size)
        # Late answers to its Copy and Persist commands must change nothing (its space may
        # already belong to another object).
        record.moving.clear()
        record.unacked = NO_SEGMENTS
        if lost:
            self.counters.objects_lost += 1
        else:
            self.counters.objects_removed += 1

    def _release_replica(self, record: ObjectRecord, replica: Replica, now: float) -> None:
        """Takes one replica away from a published object that keeps others."""
        record.replicas.remove(replica)
        segment = self.segments.get(replica.segment_id)
        if segment is not None:
            segment.lru.discard(record.key)
            self._send_forget(segment, record, replica.offset)
        self._release([replica], self._reuse_after(record, now))

    def _drop_replica(self, record: ObjectRecord, segment_id: str) -> None:
        """A committed object's replica in ``segment_id`` failed to be recorded."""
        for i, replica in enumerate(record.replicas):
            if replica is not None and replica.segment_id == segment_id:
                record.replicas[i] = None
                self._forget_grants(record, [replica])
                self._release([replica], self._reuse_after(record, self.clock()))

    def grants_end(self, segment_id: str) -> float:
        """Until when (this master's clock) its node may still honour a capability this
        master granted for space of ``segment_id``, the clock allowance included (the
        latest in ``capabilities_until``). A Forget carries it, so that its node keeps the
        seal of the forgotten objects' grants that long and no longer
        (storage_node/checked_seals.py). Earlier masters' grants need none: they name an
        earlier term, which the node refuses once this master's keys reached it, and they
        did before its first command (the mount's answer carries them)."""
        now = self.clock()
        if self.config.capability_skew is None:
            return now  # (this master grants no capabilities)
        return max(now, self.capabilities_until.get(segment_id, 0.0))

    def _send_forgets(self, record: ObjectRecord) -> None:
        for replica in record.replicas:
            segment = self.segments.get(replica.segment_id) if replica else None
            if segment is not None and replica is not None:
                self._send_forget(segment, record, replica.offset)

    def _send_forget(self, segment: SegmentRecord, record: ObjectRecord, offset: int) -> None:
        # (named as its Persist named it; the node matches place and generation only)
        stored = StoredObject(
            record.key, offset, record.size, record.generation, replicas=record.wanted
        )
        self._forget_stored(segment, stored)

    def _forget_stored(
        self, segment: SegmentRecord, stored: StoredObject, exact: bool = False
    ) -> int:
        """Sends a Forget of ``stored`` to its segment's node, refused at the segment's
        remounts until answered (``exact``: that generation only); returns its command id."""
        command_id = next(self._command_ids)
        self.outbox.append(
            ForgetCommand(command_id, segment.node_id, segment.segment_id, (stored,))
        )
        self._tombstones.sent(
            command_id, segment.segment_id, stored.key, stored.generation, exact, stored.offset
        )
        return command_id

    def _index_published(self, record: ObjectRecord, taken_back: bool = False) -> None:
        """Indexes a published object as the most recently used; one ``taken_back`` from a
        node's report as the least (``LruIndex.add_oldest``): as the most recent, the
        oldest object reported would have been the last evicted, the newest the first."""
        self._published_keys.add(record.key)
        if taken_back:
            self._lru.add_oldest(record.key, record.pin)
            for replica in record.replicas:
                if replica is not None:
                    self.segments[replica.segment_id].lru.add_oldest(record.key, record.pin)
            return
        self._lru.add(record.key, record.pin)
        for replica in record.replicas:
            if replica is not None:
                self.segments[replica.segment_id].lru.add(record.key, record.pin)

    def _forget(self, record: ObjectRecord, entry: tuple[Any, ...]) -> None:
        """Removes an object from every index (its buffers are the caller's business);
        ``entry``: why, for the key's story."""
        self._replication.forget(record.key)
        if entry[2] != "lost" and record.state is not RESERVED:  # (a lost object comes
            self._tombstones.ended(record.key, record.generation)  # back with its node)
        if record.lease_open:
            self._lease_ended(record)  # (a lease still running is counted when it ends)
            if record.lease_until <= self.clock():
                self.counters.lease_expiries += 1
                record.lease_open = False
        self._transition(record, GONE, entry)
        if self._persist_errors and record.state is ObjectState.COMMITTED:
            self._why_not_recorded(record)  # (its commit ends another way)
        if record.state is PUBLISHED:
            self._published_keys.remove(record.key)
            self._lru.discard(record.key)
            for replica in record.replicas:
                segment = self.segments.get(replica.segment_id) if replica else None
                if segment is not None:
                    segment.lru.discard(record.key)
        elif record.state is RESERVED:
            self._end_reservation(record)

    def _end_reservation(self, record: ObjectRecord) -> None:
        del self._reservations[record.key]
        keys = self._reservations_of[record.client_id]
        keys.discard(record.key)
        if not keys:
            del self._reservations_of[record.client_id]
            self.clients.pop(record.client_id, None)

    def _reuse_after(self, record: ObjectRecord, now: float) -> float:
        """When the space of ``record`` may go to another object: once its readers' leases
        have ended. Capabilities add nothing here: every grant made for it is ended by the
        Forget its nodes get when it goes (``_send_forgets``, and ``_forget_grants`` for an
        object never recorded): a node seals every grant for the range at a Forget and
        interrupts the transfers in flight under them before it answers
        (storage_node/checked_server.py, Seals), and no writer gets the space before that
        answer (the forget barrier, forget_barrier.py). A node that does not answer keeps
        the space out of use until it does (quarantine.py), which outlasts any grant's
        expiry."""
        return max(now, record.lease_until)

    def _forget_grants(self, record: ObjectRecord, replicas: Iterable[Replica | None]) -> None:
        """Sends a Forget for each of ``replicas`` (of an object its nodes never recorded: a
        reservation revoked, timed out or removed, a write that failed) lying on a segment
        whose node serves a checked stream: the node then refuses its writer's grant (which
        runs until ``write_timeout`` plus the clock allowance) and stops a transfer in
        flight under it, so that the space may be reused at the node's answer. Also on a
        segment that clients on its host may write themselves (``shared_memory``): the node
        answers once no such writer holds the range (storage_node/commands.py), so that a
        writer stopped mid-copy past the reclaim delay cannot land in the next object. Other
        nodes need none (nothing they hold names the object)."""
        grants = self.config.capability_skew is not None  # (else it grants no capabilities)
        for replica in replicas:
            if replica is None:
                continue
            segment = self.segments.get(replica.segment_id)
            if segment is not None and (
                (grants and segment.info.checked_address) or segment.info.shared_memory
            ):
                self._send_forget(segment, record, replica.offset)

    def _free(self, segment: SegmentRecord, offset: int) -> None:
        """Returns a buffer to its segment's allocator, unless it lies in quarantined space."""
        if self._quarantine and self._quarantine.claim(segment, offset):
            return
        segment.allocator.free(offset)

    def _release(
        self,
        buffers: Iterable[Replica | None],
        not_before: float,
        segment: SegmentRecord | None = None,
        *,
        resting: bool = False,
    ) -> None:
        """Frees buffers at ``not_before`` (now if that has passed). One still owned (a
        replica, not the target of an abandoned copy) leaves its segment's owners at once, so
        that no new reader finds it. Buffers of a segment that went away meanwhile are left
        alone; given ``segment``, the record they lie in, so are those of a segment remounted
        anew under the same id (the offset may be another object's there by now).
        ``resting``: held back though nothing lies there (``_resting``)."""
        now = self.clock()
        for buffer in buffers:
            if buffer is None:
                continue
            current = self.segments.get(buffer.segment_id)
            if current is None or (segment is not None and current is not segment):
                continue
            self._disown(current, buffer.offset)
            if not_before <= now:
                self._free(current, buffer.offset)
            else:
                sequence = next(self._seq)
                heapq.heappush(self._deferred, (not_before, sequence, current, buffer.offset))
                if resting:
                    self._resting.add(sequence)

    def space_of(self, segment: SegmentRecord) -> dict[str, Any]:
        """What a segment's bytes in use are taken by (an eviction pass logs it: evicting
        frees only the published part). Walks the segment's buffers: for logs, not calls."""
        size_of = segment.allocator.size_of
        by_state: dict[str, int] = {}
        for offset, key in segment.owners.items():
            record = self.objects.get(key)
            state = record.state.name.lower() if record is not None else "unknown"
            by_state[state] = by_state.get(state, 0) + size_of(offset)
        deferred = sum(size_of(o) for _, _, s, o in self._deferred if s is segment)
        parked = sum(size_of(o) for s, o, _, _ in self._parked.values() if s is segment)
        quarantined = sum(size_of(o) for s, o in self._quarantine.buffers() if s is segment)
        return {
            "segment": segment.segment_id,
            "capacity": segment.allocator.capacity,
            "used": segment.allocator.used,
            **by_state,
            "awaiting_release": deferred,  # removed, waiting for leases or reclaim
            "copy_targets": parked,
            "quarantined": quarantined,  # Forgets its node has not answered
            "leaving": segment.leaving,
        }

    def _drop_segments(self, segment_ids: Sequence[str]) -> int:
        """Forgets segments and every replica in them, all in one step: a commit that waited
        on one of them is answered by what the others leave, so it is never published on a
        replica that goes in the same step (nodes found dead by one tick). Returns the
        objects left with no replica."""
        now = self.clock()
        gone = set(segment_ids)
        held: dict[str, list[str]] = {}  # key -> the dropped segments that held its bytes
        away_since = self._away_since
        for segment_id in segment_ids:
            segment = self.segments.pop(segment_id)
            away_since.pop(segment_id, None)  # (oldest first: in the order they went)
            away_since[segment_id] = now
            if segment.granted_at + self.config.write_timeout > now:
                # (its writers may copy on: a remount of it is fenced until they are done)
                self._dropped_grants[segment_id] = segment.granted_at
            for key in set(segment.owners.values()):
                held.setdefault(key, []).append(segment_id)
            for offset in list(segment.owners):
                self._disown(segment, offset)
            if self._quarantine:
                self._quarantine.drop_segment(segment)
            node = self.nodes.get(segment.node_id)
            if node is not None:
                node.segment_ids.discard(segment_id)
        lost = 0
        for key, held_in in held.items():
            lost += self._replicas_dropped(self.objects[key], gone, held_in, now)
        self.counters.objects_lost += lost
        return lost

    def _replicas_dropped(
        self, record: ObjectRecord, gone: set[str], held_in: list[str], now: float
    ) -> int:
        """``record`` loses what it had in the segments ``gone`` (``held_in``: those that
        held its bytes); 1 when it is left with no replica (then forgotten), else 0."""
        key = record.key
        if record.state is PUBLISHED or record.state is COMMITTED:  # (its node may list it)
            for segment_id in held_in:
                self._tombstones.away(segment_id, key, record.generation)
        for command_id, move in list(record.moving.items()):
            if move.source.segment_id in gone or move.target.segment_id in gone:
                self._move_done(record, command_id, False, None, "cancelled")
        replicas = record.replicas
        record.replicas = [None if r is not None and r.segment_id in gone else r for r in replicas]
        losses = [(key, now, "replica_lost", record.put_id, s) for s in held_in]
        if record.state is ObjectState.COMMITTED and not gone.isdisjoint(record.unacked):
            waiting = record.unacked - gone
            record.unacked = waiting if waiting else NO_SEGMENTS
            if not waiting:
                for loss in losses:
                    self._note(loss)
                self._finish_commit(record)  # (NO_REPLICA when all it had went here)
                return 0 if self.objects.get(key) is record else 1
        if record.state is ObjectState.PUBLISHED:
            record.replicas = [r for r in record.replicas if r is not None]
        if self.objects.get(key) is record and not any(r is not None for r in record.replicas):
            if record.state is ObjectState.COMMITTED:
                why = self._why_not_recorded(record) if self._persist_errors else ""
                self.resolved.append(CommitResult(key, record.put_id, KeyStatus.NO_REPLICA, why))
            self._forget(record, (key, now, "lost", record.put_id, record.state, held_in[-1]))
            return 1
        if record.replicas != replicas:  # (not when only a copy's target was here)
            for loss in losses:
                self._note(loss)
            self._replication_changed(record)
        return 0

    def _issued_so_far(self) -> int:
        """The newest generation this master has issued or adopted (every later put's is
        larger)."""
        following = next(self._put_ids)
        self._put_ids = itertools.count(following)  # (drawn, and put back)
        return following - 1

    def _has_key_after(self, key: str, prefix: str) -> bool:
        for following in self._published_keys.irange(minimum=key, inclusive=(False, True)):
            return following.startswith(prefix)
        return False

    # ------------------------------------------------------------------ internals: time

    def _reclaim_reservations(self, now: float, report: TickReport) -> None:
        deadline = now - self.config.reservation_timeout
        while self._reservations:
            record = next(iter(self._reservations.values()))
            if record.created_at > deadline:
                break
            self._reclaim(record, now, "timed out")
            report.reservations_reclaimed.append(record.key)

    def _reclaim(self, record: ObjectRecord, now: float, why: str) -> None:
        """Ends a reservation whose writer may still be copying: the key is free at once, the
        space only after the reclaim delay."""
        self._forget(record, (record.key, now, "reclaimed", record.put_id, why))
        self._forget_grants(record, record.replicas)
        self._release_reservation(record, now)
        self.counters.reservations_reclaimed += 1

    def _release_reservation(self, record: ObjectRecord, now: float) -> None:
        """Frees the buffers of a reservation that ended without its writer's word (removed
        by force, reclaimed) after the reclaim delay: its writer may still be copying.

        Where clients on the node's host write the segment themselves (``shared_memory``),
        not before the writer's window is over either, and a Forget goes to the node then,
        just before the space is freed, so that the forget barrier holds the next writer of
        the range until the node answers. A writer locks a range before it checks its
        deadline and copies (transport/writer_locks.py), and the node answers only once no
        writer holds a lock on it (storage_node/commands.py): a writer that can still copy
        there once the window is over holds the lock then, however long it was stopped. (The
        Forget ``_forget_grants`` sent at once may have found no lock: the writer could
        still take one afterwards, within its window.)"""
        release_at = now + self.config.reclaim_delay
        segments = self.segments
        late = [
            (segment, replica.offset)
            for replica in record.replicas
            if replica is not None
            and (segment := segments.get(replica.segment_id)) is not None
            and segment.info.shared_memory
        ]
        if late:
            window_end = record.created_at + self.config.write_timeout + WRITER_WINDOW_MARGIN
            release_at = max(release_at, window_end)
            for segment, offset in late:
                if release_at <= now:
                    self._send_forget(segment, record, offset)
                else:
                    entry = (release_at, next(self._seq), segment, record, offset)
                    heapq.heappush(self._late_forgets, entry)
        self._release(record.replicas, release_at)

    def _send_late_forgets(self, now: float) -> None:
        """The Forgets of ``_release_reservation`` that are due, before the buffers they
        name are freed (``_release_deferred``, in the same tick)."""
        late = self._late_forgets
        while late and late[0][0] <= now:
            _, _, segment, record, offset = heapq.heappop(late)
            if self.segments.get(segment.segment_id) is segment:
                self._send_forget(segment, record, offset)

    def _age_out_tombstones(self, now: float) -> None:
        """Segments away for ``MAX_AGE`` lose their tombstones: their nodes were replaced
        (a DRAM segment's id never comes back)."""
        away_since = self._away_since
        expired = []
        for segment_id, since in away_since.items():  # (oldest first)
            if since + TOMBSTONE_MAX_AGE > now:
                break
            expired.append(segment_id)
        for segment_id in expired:
            del away_since[segment_id]
            self._tombstones.forget_segment(segment_id)

    def forgive_own_silence(self, late_by: float) -> float:
        """The rule of ``tick``'s ``late_by`` (a tick that much later than planned): past
        OWN_SILENCE_MIN, and at most once per node TTL of the master's own running time,
        every node and writer is taken as heard from that much later than it was (never past
        now). Returns the seconds forgiven (0: none); called by ``tick``, or first by the
        core, which moves its rebuild window on by as much."""
        now = self.clock()
        if late_by <= OWN_SILENCE_MIN or (
            self._forgiven_at is not None
            and now - late_by - self._forgiven_at < self.config.node_ttl
        ):
            return 0.0
        self._forgiven_at = now
        for node in self.nodes.values():
            node.last_seen = min(now, node.last_seen + late_by)
        clients = self.clients
        for client_id, seen in clients.items():
            clients[client_id] = min(now, seen + late_by)
        return late_by

    def _bury_dead_clients(self, now: float, report: TickReport) -> None:
        silent_since = now - self.config.client_ttl
        for client_id in [c for c, seen in self.clients.items() if seen < silent_since]:
            for key in list(self._reservations_of.get(client_id, ())):
                self._reclaim(self.objects[key], now, "writer silent")
                report.reservations_reclaimed.append(key)
            self.clients.pop(client_id, None)
            report.dead_clients.append(client_id)
            self.counters.clients_died += 1

    def _bury_dead_nodes(self, now: float, report: TickReport) -> None:
        silent_since = now - self.config.node_ttl
        dead = [n for n in self.nodes.values() if n.last_seen < silent_since]
        if not dead:
            return
        gone = {n.node_id for n in dead}
        # Draining nodes that died: what only they held is lost (for `kvpool drain` to say).
        losses = {
            n.node_id: sum(
                1 for key in self._keys_on(n) if self._nodes_of(self.objects[key]) <= gone
            )
            for n in dead
            if n.draining
        }
        # (all at once: a commit on two dead nodes is answered by neither)
        report.objects_lost += self._drop_segments([s for n in dead for s in n.segment_ids])
        for node_id, lost in losses.items():
            if lost:
                self.remember_loss(node_id, lost)
        for node in dead:
            report.dead_nodes.append(node.node_id)
            self._node_gone(node)
            self.counters.nodes_died += 1
        if not self.nodes:
            self.all_silent = (now, tuple(sorted(gone)[:MAX_SILENT_NAMED]), len(gone))

    def _release_deferred(self, now: float, report: TickReport, budget: list[int] | None) -> None:
        while self._deferred and self._deferred[0][0] <= now:
            if _spent(budget):
                return
            _, sequence, segment, offset = heapq.heappop(self._deferred)
            if self._resting:
                self._resting.discard(sequence)
            if self.segments.get(segment.segment_id) is segment:
                self._free(segment, offset)
                report.buffers_released += 1

    def _end_soft_pins(self, now: float) -> None:
        while self._pin_ends and self._pin_ends[0][0] <= now:
            _, _, record = heapq.heappop(self._pin_ends)
            if (
                self.objects.get(record.key) is not record
                or record.pin is not Pin.SOFT
                or record.pin_until > now
            ):
                continue
            record.pin = Pin.NONE
            self._note((record.key, now, "pin_ended", record.put_id))
            self._lru.unpin(record.key)
            for replica in record.replicas:
                if replica is not None:
                    self.segments[replica.segment_id].lru.unpin(record.key)

    def _count_ended_leases(self, now: float, budget: list[int] | None = None) -> None:
        while self._lease_ends and self._lease_ends[0][0] <= now:
            if _spent(budget):
                return
            _, _, record = heapq.heappop(self._lease_ends)
            if not record.lease_open:
                continue  # already counted (the object was read again, or removed)
            if record.lease_until > now:  # extended meanwhile: check again when it ends
                heapq.heappush(self._lease_ends, (record.lease_until, next(self._seq), record))
            else:
                record.lease_open = False
                self.counters.lease_expiries += 1
                if self.objects.get(record.key) is record:  # (else counted out as it ended)
                    self._lease_ended(record)

    # ------------------------------------------------------------------ internals: eviction

    def _evict_above_watermark(
        self, now: float, budget: list[int] | None = None, report: TickReport | None = None
    ) -> int:
        """Brings every segment, and each tier of the pool, back to ``eviction_ratio`` below
        the high watermark once it passed it. DRAM replicas are demoted to NVMe on their node
        where it has room; the rest are evicted. ``budget``: objects this call may still take
        (see ``tick``); a pass it cuts short keeps its target for the next call."""
        high = self.config.high_watermark
        low = high - self.config.eviction_ratio
        evicted = 0
        # DRAM first: its demotions may take NVMe segments (or the NVMe pool) past the mark.
        for tier in (Tier.DRAM, Tier.NVME):
            segments = [s for s in self.segments.values() if s.info.tier is tier]
            for segment in segments:
                allocator = segment.allocator
                if segment.evict_to is None:
                    if not allocator.capacity or (
                        allocator.used - segment.leaving <= high * allocator.capacity
                    ):
                        continue
                    segment.evict_to = low * allocator.capacity
                    if report is not None:
                        report.passes_started.append(self.space_of(segment))

                def done(s: SegmentRecord = segment) -> bool:
                    return s.allocator.used - s.leaving <= (s.evict_to or 0.0)

                if not done():  # (removals may have done a pass's work since its last step)
                    evicted += self._evict_down(segment.lru, now, done, segment, tier, budget)
                    if budget is not None and budget[0] <= 0:
                        return evicted  # cut short: the pass goes on at the next call
                segment.evict_to = None  # down to its mark, or nothing more may go
            capacity = sum(s.allocator.capacity for s in segments)
            target = self._pool_evict_to.get(tier)
            if target is None:
                if not capacity or self._tier_used(tier) <= high * capacity:
                    continue
                target = self._pool_evict_to[tier] = low * capacity
                if report is not None:
                    report.passes_started.append(
                        {"tier": tier.name, "capacity": capacity, "used": self._tier_used(tier)}
                    )

            def pool_done(t: Tier = tier, limit: float = target) -> bool:
                return self._tier_used(t) <= limit

            if not pool_done():
                evicted += self._evict_down(self._lru, now, pool_done, None, tier, budget)
                if budget is not None and budget[0] <= 0:
                    return evicted
            del self._pool_evict_to[tier]
        return evicted

    def _evict_down(
        self,
        index: LruIndex,
        now: float,
        done: Callable[[], bool],
        segment: SegmentRecord | None,
        tier: Tier,
        budget: list[int] | None,
    ) -> int:
        """A watermark pass (``_evict_from``). With quotas, objects of tenants above their
        share of the tier go first; only when none is left, the mark is not reached and no
        tenant is over its share any more do the others go, in LRU order: the watermark is
        kept whatever the shares (a full tier refuses every put), no tenant's put ever evicts
        them (``_evict_to_fit``), and no tenant's flood of reservations does either."""
        spare = self._spare(tier, None)
        if spare is None:
            return self._evict_from(index, now, done, segment, tier, budget=budget)
        evicted = self._evict_from(index, now, done, segment, tier, budget=budget, spare=spare)
        if done() or (budget is not None and budget[0] <= 0):
            return evicted
        rule = self._within_share(tier, None)
        if rule is not None and not all(rule[0](t) for t in rule[1]):
            # A tenant is still over its share, with nothing of it evictable now (its bytes
            # are reservations, leased or moving): those come free or become evictable soon.
            # Taking others' objects meanwhile would evict them for its flood: wait a tick.
            return evicted
        return evicted + self._evict_from(index, now, done, segment, tier, budget=budget)

    def _evict_to_fit(self, size: int, tier: Tier, now: float, tenant: str = "") -> None:
        """Evicts least recently used objects until some segment of ``tier`` has a free
        extent for ``size`` bytes (or nothing more may be evicted). No demotion here: the
        put needs the room now. With quotas, fairly: only objects of ``tenant`` (whose put
        it is) and of tenants above their guaranteed share of the tier may go. Only the
        segments that may hold ``tenant``'s objects count, for the room and for what is
        evicted: a segment of another tenant's node (``--tenant``) would give its tenant's
        objects up for a put that cannot go there."""
        segments = [s for s in self.segments.values() if s.info.tier is tier and _admits(s, tenant)]
        if not segments or max(s.allocator.capacity for s in segments) < size:
            return
        budget = [self.config.max_evictions_per_put]

        def fits() -> bool:
            budget[0] -= 1
            return budget[0] < 0 or any(
                s.allocator.largest_free >= s.allocator.rounded(size) for s in segments
            )

        if not fits():
            spare = self._spare(tier, tenant)
            self._evict_from(
                self._lru, now, fits, None, tier, demote=False, spare=spare, admitting=tenant
            )

    def _spare(self, tier: Tier, tenant: str | None) -> Callable[[str], bool] | None:
        """With quotas, which objects an eviction from ``tier`` must leave alone: those of
        every tenant (but ``tenant``, for whose put it is; None: the watermark's) holding no
        more of the tier than its guaranteed share. None without quotas: plain LRU."""
        rule = self._within_share(tier, tenant)
        if rule is None:
            return None
        within, _ = rule

        def spare(key: str) -> bool:
            owner = tenant_of(key)
            return owner != tenant and within(owner)

        return spare

    def _within_share(
        self, tier: Tier, tenant: str | None
    ) -> tuple[Callable[[str], bool], set[str]] | None:
        """With quotas: whether a tenant holds no more of ``tier`` than its guaranteed share,
        and the tenants holding something there (``tenant`` included). A tenant that
        guarantees none gets an equal split among them.

        For the watermark's pass (``tenant`` None) the split is of what the pass brings the
        tier down to (the low mark), not of its capacity: split of the capacity, tenants each
        within their share could still hold more than the mark together, and the pass would
        take the oldest objects, a tenant's within its share, for another's flood."""
        quotas = self.quotas
        if quotas is None:
            return None
        capacity = sum(
            s.allocator.capacity
            for s in self.segments.values()
            if (s.info.tier is Tier.NVME) is (tier is Tier.NVME)
        )
        if tenant is None:
            low = self.config.high_watermark - self.config.eviction_ratio
            capacity = int(capacity * low)
        usages = self._usage
        holders = {t for t, u in usages.items() if u.bytes_in(tier) > 0}
        if tenant is not None:
            holders.add(tenant)
        fallback = default_share(capacity, len(holders))
        shares: dict[str, int] = {}

        def within(owner: str) -> bool:
            share = shares.get(owner)
            if share is None:
                guaranteed = quotas.of(owner).guaranteed(tier)
                share = shares[owner] = fallback if guaranteed is None else guaranteed
            usage = usages.get(owner)
            return usage is None or usage.bytes_in(tier) <= share

        return within, holders

    def _evict_from(
        self,
        index: LruIndex,
        now: float,
        done: Callable[[], bool],
        segment: SegmentRecord | None,
        tier: Tier | None = None,
        *,
        demote: bool = True,
        budget: list[int] | None = None,
        spare: Callable[[str], bool] | None = None,
        admitting: str | None = None,
    ) -> int:
        """Takes replicas away in ``index`` order, skipping leased and moving objects, until
        ``done()``: from ``segment``, or (pool) from any segment of ``tier`` (that may hold
        tenant ``admitting``'s objects, where given). A replica with
        a twin elsewhere is just dropped; a sole DRAM replica is demoted when it can be;
        otherwise the object is evicted. Stops early once ``budget[0]`` (counted down per
        object taken) reaches 0. ``spare(key)``: True for an object to leave alone (its
        tenant is within its share), asked as it is found and again as its turn comes (each
        eviction may bring another tenant down to its share). Returns the objects evicted."""
        evicted = 0
        skipped: set[str] = set()
        while True:
            victims: list[tuple[ObjectRecord, Replica]] = []
            for key in index.candidates():
                if key in skipped:
                    continue
                record = self.objects[key]
                if record.lease_until > now or record.moving:
                    continue
                replica = self._replica_in(record, segment, tier, admitting)
                if replica is None or (spare is not None and spare(key)):
                    skipped.add(key)
                    continue
                victims.append((record, replica))
                if len(victims) == 64:
                    break
            if not victims:
                return evicted
            for record, replica in victims:
                if spare is not None and spare(record.key):
                    skipped.add(record.key)  # its tenant came down to its share meanwhile
                    continue
                if len(record.replicas) > 1:
                    self._release_replica(record, replica, now)
                    self._note((record.key, now, "replica_evicted", record.put_id, replica))
                    # (space wins over redundancy: re-replication does not put it back)
                    record.wanted = max(1, min(record.wanted, len(self._nodes_of(record))))
                    if self._replica_in(record, segment, tier, admitting) is None:
                        skipped.add(record.key)  # nothing more of it here to take
                elif not (
                    demote
                    and self.segments[replica.segment_id].info.tier is Tier.DRAM
                    and self._try_demote(record, replica)
                ):
                    self._evict_whole(record, now)
                    evicted += 1
                else:
                    skipped.add(record.key)
                if done():
                    return evicted
                if budget is not None:
                    budget[0] -= 1
                    if budget[0] <= 0:
                        return evicted

    def _evict_whole(self, record: ObjectRecord, now: float) -> None:
        """Evicts a published object: every replica forgotten at its node, its space freed."""
        entry = (record.key, now, "evicted", record.put_id, tuple(record.replicas))
        self._forget(record, entry)
        self._send_forgets(record)
        self._release(record.replicas, self._reuse_after(record, now))
        self.counters.evictions += 1

    def _room_in_table(self, now: float, key: str) -> bool:
        """Whether a put of ``key`` into a table holding ``max_objects`` or more may evict
        one published object for its room (``_evict_for_table``, which the put calls once it
        has its space). A table over the bound (a new leader adopts whatever the nodes hold)
        is brought down to it by ``tick``, in steps."""
        return (
            self._evict_for_table(len(self.objects) - 1, now, tenant_of(key), None, dry_run=True)
            > 0
        )

    def _trim_table(self, now: float, budget: list[int] | None) -> int:
        """Brings a table holding more than ``max_objects`` down to it (``tick``, in steps,
        each object looked at counted): in plain LRU order, whatever the tenants' shares,
        since the bound is the master's memory. Returns the objects evicted."""
        cap = self.config.max_objects
        if cap is None or len(self.objects) <= cap:
            return 0
        return self._evict_for_table(cap, now, None, budget)

    def _evict_for_table(
        self,
        goal: int,
        now: float,
        tenant: str | None,
        budget: list[int] | None,
        *,
        dry_run: bool = False,
    ) -> int:
        """Evicts published objects, whole, in LRU order until the table holds ``goal``,
        leaving leased and moving ones; at most ``max_evictions_per_put`` (looking at four
        times as many), and ``budget`` (a tick's: each object passed over or evicted).
        With quotas, for a put of ``tenant``'s (None: the tick's, plain LRU), fairly: another
        tenant's objects go only while it holds more than an equal split of the table.
        Returns the objects evicted (``dry_run``: 1 if one could be, evicting nothing)."""
        spare = self._spare_in_table(tenant) if tenant is not None else None
        left = self.config.max_evictions_per_put
        looked = 0  # (candidates looked at: a table of leased objects is not scanned whole)
        evicted = 0
        skipped: set[str] = set()
        while len(self.objects) > goal and left > 0:
            victims: list[ObjectRecord] = []
            wanted = min(64, left, len(self.objects) - goal)
            for candidate in self._lru.candidates():  # (not changed while iterating)
                if candidate in skipped:
                    continue
                looked += 1
                if looked > 4 * self.config.max_evictions_per_put:
                    break
                record = self.objects[candidate]
                if record.lease_until > now or record.moving or (spare and spare(candidate)):
                    skipped.add(candidate)
                    if _spent(budget):  # (one passed over costs a tick's step as one evicted)
                        break
                    continue
                if dry_run:
                    return 1
                victims.append(record)
                if len(victims) == wanted:
                    break
            if not victims:
                break
            for record in victims:
                if _spent(budget):
                    return evicted
                self._evict_whole(record, now)
                self.counters.evictions_for_table += 1
                evicted += 1
            left -= len(victims)
        return evicted

    def _spare_in_table(self, tenant: str) -> Callable[[str], bool] | None:
        """With quotas, which objects an eviction for room in the table must leave alone:
        those of every other tenant holding no more than an equal split of the table among
        the tenants holding something (by count: byte guarantees keep bytes, and a tenant
        of tiny objects within them could otherwise hold the whole table). None without
        quotas: plain LRU."""
        if self.quotas is None:
            return None
        usages = self._usage
        cap = self.config.max_objects or len(self.objects)
        # (tenants holding anything: O(1), where counting those with objects would be a scan)
        share = cap // max(1, len(usages) + (tenant not in usages))

        def spare(key: str) -> bool:
            owner = tenant_of(key)
            usage = usages.get(owner)
            return owner != tenant and (usage is None or usage.objects <= share)

        return spare

    def _replica_in(
        self,
        record: ObjectRecord,
        segment: SegmentRecord | None,
        tier: Tier | None,
        admitting: str | None = None,
    ) -> Replica | None:
        """``record``'s replica in ``segment``, or (None) in a segment of ``tier`` that may
        hold tenant ``admitting``'s objects (any, where None)."""
        for replica in record.replicas:
            if replica is None:
                continue
            if segment is not None:
                if replica.segment_id == segment.segment_id:
                    return replica
                continue
            holder = self.segments[replica.segment_id]
            if holder.info.tier is tier and (admitting is None or _admits(holder, admitting)):
                return replica
        return None

    def _tier_used(self, tier: Tier) -> int:
        return sum(
            s.allocator.used - s.leaving for s in self.segments.values() if s.info.tier is tier
        )


#: The public methods that apply an event (each may change the state), checked after each call
#: when ``validate_each_event`` is set.
EVENTS = (
    "mount_segment",
    "unmount_segment",
    "drain",
    "heartbeat",
    "command_done",
    "command_expired",
    "client_heartbeat",
    "put_start",
    "put_end",
    "put_revoke",
    "get_replicas",
    "exists",
    "release_leases",
    "quarantine",
    "forget_answered",
    "remove",
    "remove_prefix",
    "forgive_own_silence",
    "tick",
)


def _validated(method: Callable[..., Any], validate: Callable[[], None]) -> Callable[..., Any]:
    """``method``, followed by ``validate()``. Set on the instance only when asked for, so
    that the usual path pays nothing for the option."""

    @functools.wraps(method)
    def checked(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        validate()
        return result

    return checked


def _writers_unchecked(info: SegmentInfo, config: MasterConfig) -> bool:
    """Whether writers may copy into ``info``'s segment without a capability the node checks
    (whose term it would refuse once a newer master took over): this master grants none, the
    node serves no checked stream (UCX's one-sided writes), or clients on its host may map
    its memory and copy into it, or write its NVMe file, themselves (a secure master lets
    them only into the segments of a node given ``--tenant``, and only when
    ``--same-host-clients`` names them)."""
    if config.capability_skew is None or not info.checked_address:
        return True
    return bool(info.shared_memory) and bool(info.tenant)


def _well_formed(item: StoredObject) -> bool:
    """Whether a reported object could be one the master wrote (a node's index is input)."""
    return (
        0 < item.generation < GENERATIONS_END
        and item.size >= 0
        and key_problem(item.key, STORED_KEY_BYTES) is None
    )


def _admits(segment: SegmentRecord, tenant: str) -> bool:
    """Whether ``segment`` may hold ``tenant``'s objects: a segment of one tenant (the node's
    ``--tenant``) holds that tenant's objects only, so that mapping it shows no other's."""
    return not segment.info.tenant or segment.info.tenant == tenant


def _acknowledged(record: ObjectRecord, segment_id: str) -> None:
    """``segment_id``'s node no longer holds up ``record``'s publication."""
    unacked = record.unacked
    if segment_id in unacked:
        record.unacked = unacked - {segment_id} if len(unacked) > 1 else NO_SEGMENTS


def _ignore(note: tuple[Any, ...]) -> None:
    """Notes nothing (the story is off)."""


def _spent(budget: list[int] | None) -> bool:
    """Takes one object out of a tick's ``budget``; True when none was left (None: no
    bound)."""
    if budget is None:
        return False
    if budget[0] <= 0:
        return True
    budget[0] -= 1
    return False
