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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import aetcd

from kvpool.common.aio import pause
from kvpool.common.leader_resolver import leader_key
from kvpool.common.logging import get_logger
from kvpool.security.etcd_tls import TlsEtcdClient
from kvpool.security.tls import TlsFiles

log = get_logger("kvpool.election")

DEFAULT_TTL = 2
ETCD_ERRORS = (aetcd.ClientError, ConnectionError, OSError, asyncio.TimeoutError)


class AlwaysLeader:
    """Leadership of a master running alone (no etcd)."""

    leader = ""

    def serving(self) -> bool:
        return True

    def node_seen(self, node_id: str) -> None:
        pass

    def node_gone(self, node_id: str) -> None:
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
        #: Who leads, as far as we know ("" when nobody does); ourselves when we do.
        self.leader = ""
        self.is_leader = False
        self._valid_until = 0.0
        self._client: aetcd.Client | None = None
        self._registered: set[str] = set()
        self._tasks: set[asyncio.Future[None]] = set()
        #: Where this cluster's keys live in etcd.
        self.cluster_prefix = leader_key(cluster).rsplit(b"/", 1)[0]
        self._nodes_prefix = self.cluster_prefix + b"/nodes/"

    @property
    def etcd_client(self) -> aetcd.Client | None:
        """The etcd client of the current campaign (None before the first)."""
        return self._client

    def serving(self) -> bool:
        """True while we lead and our lease is surely alive."""
        return self.is_leader and time.monotonic() < self._valid_until - self.margin

    # The storage nodes of the cluster are listed in etcd, so that a new leader knows whom to
    # wait for before it answers clients from an index rebuilt from the nodes.

    def node_seen(self, node_id: str) -> None:
        if node_id not in self._registered and self._client is not None:
            self._registered.add(node_id)
            self._spawn(self._put_node(node_id))

    def node_gone(self, node_id: str) -> None:
        if self._client is not None:
            self._registered.discard(node_id)
            self._spawn(self._delete_node(node_id))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def registered_nodes(self) -> set[str]:
        if self._client is None:
            return set()
        try:
            entries = await self._client.get_prefix(self._nodes_prefix)
        except ETCD_ERRORS:
            return set()
        nodes = {kv.key[len(self._nodes_prefix) :].decode() for kv in entries}
        self._registered = set(nodes)
        return nodes

    async def _put_node(self, node_id: str) -> None:
        with contextlib.suppress(*ETCD_ERRORS):
            await self._client.put(self._nodes_prefix + node_id.encode(), b"")  # type: ignore[union-attr]

    async def _delete_node(self, node_id: str) -> None:
        with contextlib.suppress(*ETCD_ERRORS):
            await self._client.delete(self._nodes_prefix + node_id.encode())  # type: ignore[union-attr]

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
            host, _, port = endpoint.rpartition(":")
            timeout = max(1, self.ttl // 2)
            client = (
                TlsEtcdClient(host, int(port), timeout=timeout, tls=self.tls)
                if self.tls is not None
                else aetcd.Client(host, int(port), timeout=timeout)
            )
            self._client = client
            try:
                await self._campaign(client, stop, on_elected, on_lost)
            except ETCD_ERRORS as error:
                log.warning("etcd unreachable", endpoint=endpoint, error=str(error))
            except Exception as error:  # (a bug where a term begins or ends: campaign on,
                # rather than sit a standby for good with nobody told)
                log.error("election round failed; campaigning again", error=repr(error))
            finally:
                if self.is_leader:
                    self.is_leader = False
                    try:
                        await on_lost()
                    except Exception as error:
                        log.error("ending the term failed", error=repr(error))
                with contextlib.suppress(*ETCD_ERRORS, Exception):
                    await client.close()
            await pause(stop, self.ttl / 4)

    async def _campaign(
        self,
        client: aetcd.Client,
        stop: asyncio.Event,
        on_elected: Callable[[int], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
    ) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            lease = await client.lease(self.ttl)
            won, responses = await client.transaction(
                compare=[client.transactions.create(self.key) == 0],
                success=[client.transactions.put(self.key, self.address.encode(), lease=lease)],
                failure=[client.transactions.get(self.key)],
            )
            if not won:
                await lease.revoke()
                current = responses[0][0][0].decode() if responses and responses[0] else ""
                if current != self.leader:
                    log.info("following a leader", leader=current or "(none)")
                self.leader = current
                await pause(stop, self.ttl / 4)
                continue
            epoch = responses[0].response_put.header.revision
            self._valid_until = sent + self.ttl
            self.is_leader = True
            self.leader = self.address
            log.info("elected leader", epoch=epoch, ttl_s=self.ttl)
            await on_elected(epoch)
            await self._keep(lease, stop)
            self.is_leader = False
            self.leader = ""
            log.warning("leadership lost", epoch=epoch)
            await on_lost()
            with contextlib.suppress(*ETCD_ERRORS):
                await lease.revoke()

    async def _keep(self, lease: Any, stop: asyncio.Event) -> None:
        """Renews the lease every third of its TTL until renewals stop working in time."""
        while not stop.is_set():
            await pause(stop, self.ttl / 3)
            sent = time.monotonic()
            try:
                response = await asyncio.wait_for(lease.refresh(), self.ttl / 3)
            except ETCD_ERRORS:
                response = None
            if response is not None and response.TTL > 0:
                self._valid_until = sent + response.TTL
            elif time.monotonic() >= self._valid_until - self.margin:
                return  # stop serving before the lease can expire under us
