"""Leader election through an etcd lease, so that exactly one master serves a cluster.

A master campaigns by creating the cluster's leader key under a lease of ``ttl`` seconds
(an etcd transaction that succeeds only if the key does not exist). The winner keeps the
lease alive; the others poll the key, learn who leads (to point callers there) and campaign
again when it disappears. The etcd revision of the winning write is the new term's epoch:
larger than any earlier term's.

No split brain: a leader serves only while its lease is surely alive, i.e. until ``ttl``
after it last *sent* a successful renewal, minus a safety margin. When renewals fail (etcd
down, network cut) it stops serving before the lease can expire and another master be
elected, then campaigns again.

A standby can take over only while etcd answers it: ``in_touch`` says whether it did within
``contact_window`` seconds (the lease TTL, at least), and since when it has not (the masters'
``/readyz?role=any``, the readiness probe of several masters in the Helm chart). Nor does it
name a leader (``leader``: its /readyz, and the hint its refusals give nodes and clients) once
out of touch: the one it last read has stepped down by then, or leads out of its sight.

The storage nodes of the cluster are listed in etcd too (``registered_nodes``), so that a new
leader knows whom to wait for before it answers clients from an index rebuilt from the nodes,
and which nodes are away (declared dead, or gone after unmounting their segments): those may
come back holding objects removed meanwhile, and a new leader refuses what ends while they are
away (master/tombstones.py, "Nodes a new leader has not heard from") without waiting for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aetcd

from kvpool.common.aio import pause
from kvpool.common.leader_resolver import leader_key
from kvpool.common.log_throttle import LogThrottle
from kvpool.common.logging import get_logger
from kvpool.master.tombstones import MAX_AGE
from kvpool.security.etcd_tls import TlsEtcdClient
from kvpool.security.tls import TlsFiles

log = get_logger("kvpool.election")
#: Failed election rounds: a line or two per etcd endpoint a minute, with the count left out.
ETCD_FAILURE_LOGS = LogThrottle(burst=2, interval=60.0)

DEFAULT_TTL = 2
#: Lease TTLs a master that stepped down (``Election.step_down_reason``) waits before it
#: campaigns again: a standby, which asks every quarter TTL, takes the term first.
STEP_DOWN_PAUSE_TTLS = 2
ETCD_ERRORS = (aetcd.ClientError, ConnectionError, OSError, asyncio.TimeoutError)
#: The largest value the masters keep in etcd: what etcd takes in one request by default
#: (``--max-request-bytes``, 1.5 MiB); a tombstone piece is well under it (its keys at most
#: tombstones.RECORD_BYTES).
ETCD_VALUE_BYTES = 3 << 19
#: Keys and values one read of a range asks etcd for at most (tombstone_store.py pages its
#: reads by this many keys).
ETCD_PAGE_KEYS = 32
#: The largest answer the masters' etcd channel takes: a page of the largest values, and
#: room for their keys. gRPC's default, 4 MiB, is passed by a few large tombstone records
#: read at once: then no master could ever begin a term.
ETCD_RECEIVE_LIMIT = ETCD_PAGE_KEYS * ETCD_VALUE_BYTES + (4 << 20)

#: A node's registration in etcd: a node that serves (a new leader waits for it), or one that
#: went away (declared dead, or it unmounted all its segments) at a time, ``AWAY`` followed
#: by the Unix time in whole seconds, and ``LOST`` and a count where it left a drain with
#: objects it alone held (a new leader answers ``kvpool drain`` with DATA_LOSS for it).
LIVE = b""
AWAY = b"away:"
LOST = b":lost="


@dataclass(frozen=True, slots=True)
class ClusterNodes:
    """The storage nodes etcd lists for a new leader."""

    #: Nodes that were serving: waited for in the rebuild window.
    live: set[str] = field(default_factory=set)
    #: Nodes away (for less than tombstones.MAX_AGE): not waited for, but they may come
    #: back holding objects that end meanwhile.
    away: set[str] = field(default_factory=set)
    #: Nodes away that left a drain with objects lost (how many).
    lost: dict[str, int] = field(default_factory=dict)


class AlwaysLeader:
    """Leadership of a master running alone (no etcd)."""

    leader = ""

    def serving(self) -> bool:
        return True

    def node_seen(self, node_id: str) -> None:
        pass

    def node_gone(self, node_id: str, lost: int = 0, ago: float = 0.0) -> None:
        pass


class Election:
    def __init__(
        self,
        endpoints: Sequence[str],
        cluster: str,
        address: str,
        ttl: int = DEFAULT_TTL,
        *,
        tls: TlsFiles | None = None,
    ) -> None:
        if ttl < 1:
            raise ValueError(f"the election lease TTL is whole seconds, at least 1; got {ttl}")
        self.endpoints = list(endpoints)
        #: Client certificate and CA for etcd over https, else None (plain http).
        self.tls = tls
        self.key = leader_key(cluster)
        self.address = address
        self.ttl = ttl
        self.margin = ttl / 4
        #: Seconds one call to etcd may take.
        self.call_timeout = max(1, ttl // 2)
        #: A master is in touch with etcd (it can campaign) while etcd answered it within this
        #: many seconds: the lease TTL, or longer where a round that goes well can leave a
        #: longer gap between answers (a pause of TTL/4, then a call that takes its timeout).
        self.contact_window = max(float(ttl), ttl / 4 + self.call_timeout)
        #: When etcd last answered (time.monotonic()), None before it first did; and why the
        #: last round failed, "" when etcd answered since. (Read by the HTTP thread.)
        self._answered_at: float | None = None
        self._etcd_error = ""
        #: Who leads as this master last read the leader key ("" when nobody did); ourselves
        #: when we do. Named (``leader``) only while etcd answers us.
        self._leader = ""
        self.is_leader = False
        self._valid_until = 0.0
        #: Asked while leading, at each renewal of the lease: why this master should hand
        #: its term to another one (it hears from no storage node: ``MasterCore.
        #: step_down_reason``), or None.
        self.step_down_reason: Callable[[], str | None] = lambda: None
        #: Until when (time.monotonic()) this master, having stepped down, only follows the
        #: leader key and does not campaign.
        self._campaign_after = 0.0
        self._client: aetcd.Client | None = None
        #: node id -> its registration in etcd, as this term read or wrote it; and those to
        #: write (``_write_nodes``, one task at a time).
        self._registered: dict[str, bytes] = {}
        self._wanted: dict[str, bytes] = {}
        self._writer: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        #: Where this cluster's keys live in etcd.
        self.cluster_prefix = leader_key(cluster).rsplit(b"/", 1)[0]
        self._nodes_prefix = self.cluster_prefix + b"/nodes/"
        #: A key written once, by the cluster's first term, and never removed: a term that
        #: finds it gone, after this master saw it, finds etcd's data lost (or restored from
        #: an older backup), as does one whose epoch is not above every earlier one here.
        self._marker = self.cluster_prefix + b"/created"
        self._marker_seen = False
        #: The highest epoch this master led with (0: none yet), and the highest etcd
        #: revision it was elected at (an epoch is that revision, or above it after a loss).
        self._highest_epoch = 0
        self._last_revision = 0
        #: etcd answered a renewal with no lease (TTL 0) while the term began: it ends at once.
        self._lease_gone = False
        #: Set as a term begins: whether etcd lost this cluster's data since this master
        #: last saw it (the node list, the tombstone records and the leader key's history
        #: are gone): the term then waits for whatever nodes come, as a first start does.
        self.etcd_data_lost = False

    @property
    def etcd_client(self) -> aetcd.Client | None:
        """The etcd client of the current campaign (None before the first)."""
        return self._client

    @property
    def leader(self) -> str:
        """Who leads, as far as we know ("" when nobody does, or we cannot know); ourselves
        when we do. What a standby read of the leader key holds only while etcd answers it
        (``in_touch``): cut off for longer than the contact window (the lease TTL at least),
        the leader it read has stepped down (its renewals fail too: etcd is down) or leads
        on out of its sight, so it names none rather than send nodes and clients to a master
        that may refuse them in turn. Nor does a leader whose lease may be running out (it
        refuses calls as it steps down) name itself. Safe to call from another thread."""
        leader = self._leader
        if not leader or not self._heard_lately():
            return ""
        return "" if self.is_leader and not self.serving() else leader

    @leader.setter
    def leader(self, value: str) -> None:
        self._leader = value

    def serving(self) -> bool:
        """True while we lead and our lease is surely alive."""
        return self.is_leader and time.monotonic() < self._valid_until - self.margin

    def _heard_lately(self) -> bool:
        """Whether etcd answered within ``contact_window`` seconds."""
        answered = self._answered_at
        return answered is not None and time.monotonic() - answered < self.contact_window

    def in_touch(self) -> tuple[bool, str]:
        """Whether etcd answered within ``contact_window`` seconds (judged on
        time.monotonic(), as ``serving`` is), i.e. this master can campaign; and, when it
        did not, since when. Safe to call from another thread."""
        answered, error = self._answered_at, self._etcd_error
        now = time.monotonic()
        if answered is not None and now - answered < self.contact_window:
            return True, ""
        why = f": {error}" if error else ""
        if answered is None:
            return False, f"etcd not reached yet{why}"
        since = datetime.fromtimestamp(time.time() - (now - answered), UTC)
        return False, (
            f"etcd unreachable since {since.strftime('%Y-%m-%dT%H:%M:%SZ')} "
            f"({now - answered:.1f} s){why}"
        )

    def _answered(self) -> None:
        self._answered_at = time.monotonic()
        self._etcd_error = ""

    # The storage nodes of the cluster are listed in etcd (see the module's docstring). What
    # this term learns is written by one task, in order, each write guarded by the leader key
    # (a deposed leader changes nothing), retried while it fails; a node counts as written
    # only once etcd took it.

    def node_seen(self, node_id: str) -> None:
        """The node mounts a segment: it serves."""
        self._want(node_id, LIVE)

    def node_gone(self, node_id: str, lost: int = 0, ago: float = 0.0) -> None:
        """The node was declared dead, or unmounted its last segment: it is away (it may
        come back, a paused process or a node with its disk, holding what it held), since
        ``ago`` seconds. ``lost``: the objects it alone held that its drain did not copy
        away."""
        value = AWAY + b"%d" % int(time.time() - max(0.0, ago))
        self._want(node_id, value + LOST + b"%d" % lost if lost > 0 else value)

    def _want(self, node_id: str, value: bytes) -> None:
        if self._client is None or not self.is_leader:
            return
        current = self._wanted.get(node_id, self._registered.get(node_id))
        if current == value or (
            current is not None
            and current.startswith(AWAY)
            and value.startswith(AWAY)
            and _lost_of(value) <= _lost_of(current)
        ):
            return  # (away since then already: the first time counts, for MAX_AGE)
        self._wanted[node_id] = value
        if self._writer is None or self._writer.done():
            self._writer = self._spawn(self._write_nodes(self._client))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def registered_nodes(self) -> ClusterNodes:
        """The nodes etcd lists, for a new term (its writes of them start from this).
        Registrations away for longer than MAX_AGE are deleted. Raises one of ETCD_ERRORS
        when etcd cannot be read: a leader that does not know the nodes must not serve."""
        client = self._client
        if client is None:
            raise ConnectionError("no etcd client")
        prefix = self._nodes_prefix
        entries = await asyncio.wait_for(client.get_prefix(prefix), max(1, self.ttl))
        nodes = ClusterNodes()
        registered: dict[str, bytes] = {}
        expired: list[bytes] = []
        now = time.time()
        for kv in entries:
            node_id = kv.key[len(prefix) :].decode(errors="replace")
            value = bytes(kv.value)
            if value.startswith(AWAY):
                try:
                    since = float(value[len(AWAY) :].partition(LOST)[0])
                except ValueError:
                    since = now  # (unreadable: away, from now on)
                if now - since > MAX_AGE:
                    expired.append(kv.key)
                    continue
                nodes.away.add(node_id)
                if lost := _lost_of(value):
                    nodes.lost[node_id] = lost
            else:
                nodes.live.add(node_id)
            registered[node_id] = value
        self._registered = registered
        self._wanted = {}
        for key in expired:
            with contextlib.suppress(*ETCD_ERRORS):
                await asyncio.wait_for(self._guarded(client, client.transactions.delete(key)), 1)
        return nodes

    async def _guarded(self, client: aetcd.Client, op: Any) -> bool:
        """Runs ``op`` if this master holds the leader key; whether it did."""
        leading = client.transactions.value(self.key) == self.address.encode()
        succeeded, _ = await client.transaction(compare=[leading], success=[op], failure=[])
        return bool(succeeded)

    async def _write_nodes(self, client: aetcd.Client) -> None:
        """Writes the registrations wanted, while this term lasts."""
        failing = False
        transactions = client.transactions
        while self._wanted and self._client is client and self.is_leader:
            node_id, value = next(iter(self._wanted.items()))
            put = transactions.put(self._nodes_prefix + node_id.encode(), value)
            try:
                leading = await asyncio.wait_for(self._guarded(client, put), max(1, self.ttl))
            except Exception as error:  # (etcd's, or its client closed as the term ended)
                if self._client is not client or not self.is_leader:
                    return
                if not failing:
                    log.warning(
                        "a node's registration not written to etcd; retrying",
                        node=node_id,
                        error=str(error) or type(error).__name__,
                    )
                failing = True
                await asyncio.sleep(self.ttl / 4)
                continue
            if not leading:
                return  # (the next term reads etcd afresh)
            if failing:
                log.info("nodes' registrations written to etcd again")
                failing = False
            self._registered[node_id] = value
            if self._wanted.get(node_id) == value:
                del self._wanted[node_id]

    async def run(
        self,
        stop: asyncio.Event,
        on_elected: Callable[[int], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
    ) -> None:
        """Campaigns until ``stop``; calls ``on_elected(epoch)`` and ``on_lost()`` as terms
        begin and end."""
        attempt = 0
        while not stop.is_set():
            endpoint = self.endpoints[attempt % len(self.endpoints)]
            attempt += 1
            client: aetcd.Client | None = None
            try:
                # (made here, in the round: its TLS files are read now, and one read halfway
                # through a renewal must fail this round only, not end the campaign)
                client = self._new_client(endpoint)
                self._client = client
                await self._campaign(client, stop, on_elected, on_lost)
            except ETCD_ERRORS as error:
                self._etcd_error = _short(str(error) or type(error).__name__)
                # (an outage fails a round about twice a second: a line or two a minute)
                if (suppressed := ETCD_FAILURE_LOGS.allow(endpoint)) is not None:
                    log.warning(
                        "etcd unreachable, or a call to it failed",
                        endpoint=endpoint,
                        error=str(error) or type(error).__name__,
                        suppressed=suppressed,
                    )
            except Exception as error:  # (a bug where a term begins or ends: campaign on,
                # rather than sit a standby for good with nobody told)
                self._etcd_error = _short(f"election round failed: {error!r}")
                log.error("election round failed; campaigning again", error=repr(error))
            finally:
                if not self._heard_lately():
                    # (what we read of the leader key is stale: not named again when etcd
                    # first answers, before it is read again)
                    self._leader = ""
                if self.is_leader:
                    self.is_leader = False
                    try:
                        await on_lost()
                    except Exception as error:
                        log.error("ending the term failed", error=repr(error))
                if client is not None:
                    with contextlib.suppress(*ETCD_ERRORS, Exception):
                        await client.close()
            await pause(stop, self.ttl / 4)

    def _new_client(self, endpoint: str) -> aetcd.Client:
        host, _, port = endpoint.rpartition(":")
        timeout = self.call_timeout
        options = {"grpc.max_receive_message_length": ETCD_RECEIVE_LIMIT}
        if self.tls is not None:
            return TlsEtcdClient(host, int(port), timeout=timeout, tls=self.tls, options=options)
        return aetcd.Client(host, int(port), timeout=timeout, options=options)

    async def _data_lost(self, client: aetcd.Client, revision: int) -> bool:
        """Whether etcd lost this cluster's data since this master last saw it (see
        ``_marker``; ``revision``: the one it is elected at); writes the marker where it is
        missing."""
        lost = revision <= self._last_revision
        found = await client.get(self._marker)
        self._answered()
        if found is not None:
            self._marker_seen = True
            return lost
        await client.put(self._marker, self.address.encode())
        self._answered()
        lost = lost or self._marker_seen
        self._marker_seen = True
        return lost

    async def _campaign(
        self,
        client: aetcd.Client,
        stop: asyncio.Event,
        on_elected: Callable[[int], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
    ) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            if sent < self._campaign_after:  # (it stepped down: a standby takes the term)
                found = await client.get(self.key)
                self._answered()
                self._follow(found.value.decode() if found is not None else "")
                await pause(stop, self.ttl / 4)
                continue
            lease = await client.lease(self.ttl)
            self._answered()
            won, responses = await client.transaction(
                compare=[client.transactions.create(self.key) == 0],
                success=[client.transactions.put(self.key, self.address.encode(), lease=lease)],
                failure=[client.transactions.get(self.key)],
            )
            self._answered()
            if not won:
                await lease.revoke()
                self._answered()
                current = responses[0][0][0].decode() if responses and responses[0] else ""
                self._follow(current)
                if not self._marker_seen:  # (a standby too must know the cluster had it)
                    self._marker_seen = await client.get(self._marker) is not None
                    self._answered()
                await pause(stop, self.ttl / 4)
                continue
            revision = epoch = responses[0].response_put.header.revision
            self._valid_until = sent + self.ttl
            try:
                self.etcd_data_lost = await self._data_lost(client, revision)
            except BaseException:
                # (the key names this master until the lease goes: give it back now)
                with contextlib.suppress(*ETCD_ERRORS):
                    await lease.revoke()
                raise
            self._last_revision = max(self._last_revision, revision)
            if self.etcd_data_lost:
                log.error(
                    "etcd lost this cluster's data (its marker key is gone, or its revision "
                    "went back): an etcd restarted without its data directory, or restored "
                    "from an older backup. The node list and the tombstone records are gone: "
                    "this term waits for whatever nodes come, and objects removed while their "
                    "node was away may come back with it",
                    epoch=epoch,
                    highest_epoch_before=self._highest_epoch,
                )
            epoch = max(epoch, self._highest_epoch + 1)  # (this master's terms only go up)
            self._highest_epoch = epoch
            self._lease_gone = False
            self.is_leader = True
            self.leader = self.address
            log.info("elected leader", epoch=epoch, ttl_s=self.ttl)
            # (the term's start reads etcd, its node list and tombstone records, which can
            # take longer than the lease: it is renewed meanwhile, or the term would be lost
            # to a standby before it began)
            renewing = asyncio.ensure_future(self._renew(lease))
            try:
                await on_elected(epoch)
            finally:
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)
            stepped_down = await self._keep(lease, stop)
            if stepped_down:
                self._campaign_after = time.monotonic() + STEP_DOWN_PAUSE_TTLS * self.ttl
            self.is_leader = False
            self.leader = ""
            log.warning("leadership lost", epoch=epoch)
            await on_lost()
            if stepped_down:
                # (the lease, still alive, is given back only ``margin`` after this master
                # stopped serving, as a lease that runs out is: what it answered just before,
                # a readiness probe say, is not seen beside a successor elected at once)
                await pause(stop, self.margin)
            with contextlib.suppress(*ETCD_ERRORS):
                await lease.revoke()

    def _follow(self, current: str) -> None:
        """The leader key names ``current`` ("" when nobody leads). A key that still names
        this master, not leading (its lease not revoked yet), names nobody: callers are
        not sent back here."""
        if current == self.address and not self.is_leader:
            current = ""
        if current != self._leader:
            log.info("following a leader", leader=current or "(none)")
        self._leader = current

    async def _renew(self, lease: Any) -> None:
        """Renews the lease every third of its TTL, for as long as it runs (cancelled)."""
        while True:
            await asyncio.sleep(self.ttl / 3)
            sent = time.monotonic()
            try:
                response = await asyncio.wait_for(lease.refresh(), self.ttl / 3)
            except ETCD_ERRORS:
                continue  # (``serving`` runs out with the lease's last renewal)
            self._answered()
            if response.TTL > 0:
                self._valid_until = sent + response.TTL
            else:  # (etcd no longer knows the lease: serve no more, end the term at once)
                self._valid_until = 0.0
                self._lease_gone = True
                return

    async def _keep(self, lease: Any, stop: asyncio.Event) -> bool:
        """Renews the lease every third of its TTL until renewals stop working in time, or
        this master should step down (then True)."""
        if self._lease_gone:
            log.warning("etcd no longer knows this master's lease", epoch=self._highest_epoch)
            return False
        while not stop.is_set():
            await pause(stop, self.ttl / 3)
            why = self.step_down_reason()
            if why is not None:
                log.warning("stepping down: another master may reach the nodes", reason=why)
                return True
            sent = time.monotonic()
            try:
                response = await asyncio.wait_for(lease.refresh(), self.ttl / 3)
            except ETCD_ERRORS:
                response = None
            if response is not None:
                self._answered()
            if response is not None and response.TTL > 0:
                self._valid_until = sent + response.TTL
            elif response is not None:
                # (etcd no longer knows the lease: it ran out, or etcd lost its data. Another
                # master may be elected at once: stop serving now, not at our own reckoning)
                log.warning("etcd no longer knows this master's lease", epoch=self._highest_epoch)
                return False
            elif time.monotonic() >= self._valid_until - self.margin:
                return False  # stop serving before the lease can expire under us
        return False


def _short(reason: str, limit: int = 200) -> str:
    """``reason`` on one line, at most ``limit`` characters (it ends up in a probe's answer)."""
    line = " ".join(reason.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _lost_of(registration: bytes) -> int:
    """The objects lost that a node's registration says it left with (0: none, or unreadable)."""
    _, found, count = registration.partition(LOST)
    try:
        return max(0, int(count)) if found else 0
    except ValueError:
        return 0
