"""The adapter's metadata line to the kvpool master, every call with its own deadline.

Lookups, lease renewals, deletes, listings and health probes carry no payload, so they do not
go through a data client (whose UCX worker may be busy with a long transfer) and each gets
the deadline of its kind: a lookup on the prefetch path must answer within milliseconds, a
health probe within a second, while a delete may wait longer.

Lookup-and-lock is ``GetReplicas`` with a lease: one round trip per batch, and the lease is
the lock (a leased object is neither evicted nor removed without force). ``kvpool.Client``
has no public call that only takes leases, so this talks to the master through the client's
``MasterLink`` directly. ``release`` (``ReleaseLeases``) ends the leases early, at unlock.

The master ends only the lease of the client that leased an object last, so the control
plane leases under the load client's id (``client_id``): a load of a locked chunk then
renews that same lease instead of taking it over, and one release ends both.

Keys that are no valid kvpool key (over 1024 bytes of UTF-8, lone surrogates) are never
sent: the master would refuse the whole batch for one of them (and protobuf cannot even
encode a lone surrogate). They answer ``INVALID_KEY`` here, as the master would per key.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.client.master_link import MasterLink
from kvpool.common.keys import valid_keys_of, valid_positions
from kvpool.common.status import KeyStatus
from kvpool.errors import KVPoolError
from kvpool.proto import master_pb2 as pb
from kvpool.security.caller import CallerCredentials

#: Statuses of a lease that mean the object is not there to hold: nothing to renew, and a
#: chunk this adapter stored is gone. Any other non-OK status (a tenant's leases quota
#: reached, a write in progress, a status this client does not know) says nothing of that.
GONE = frozenset({KeyStatus.NOT_FOUND, KeyStatus.INVALID_KEY})


@dataclass(frozen=True, slots=True)
class Leased:
    """Outcome of a lease batch: the size of each leased key (None: not leased), the moment,
    on this process's monotonic clock, before which every lease surely still holds, and each
    key's KeyStatus as a number (empty: every None size was NOT_FOUND)."""

    sizes: list[int | None]
    until: float
    statuses: Sequence[int] = ()
    #: Why a lease was refused for the tenant's leases quota: the master's figures ('' when
    #: none was).
    quota_refusal: str = ""

    def gone(self, index: int) -> bool:
        """Whether key ``index`` is surely not in kvpool (not merely refused a lease)."""
        if not self.statuses:
            return self.sizes[index] is None
        return self.statuses[index] in GONE


class ControlPlane:
    def __init__(
        self,
        master: str,
        metadata_lane: bool = True,
        credentials: CallerCredentials | None = None,
        client_id: str | None = None,
    ) -> None:
        self.master = master
        self.client_id = client_id or f"lmcache-{uuid.uuid4().hex}"
        self._link = MasterLink(master, use_lane=metadata_lane, credentials=credentials)

    def lease(self, keys: Sequence[str], ttl: float, timeout: float) -> Leased:
        """Leases every existing key for ``ttl`` seconds (one round trip, none when no key is
        valid); raises ``MasterUnavailable`` when the master does not answer within
        ``timeout``."""
        sent_at = time.monotonic()
        valid = valid_positions(keys)
        sizes: list[int | None] = [None] * len(keys)
        statuses: list[int] = [KeyStatus.INVALID_KEY] * len(keys)
        if not valid:
            return Leased(sizes, sent_at + ttl, statuses)
        response = self._link.call(
            "GetReplicas",
            pb.GetReplicasRequest(
                client_id=self.client_id,
                keys=[keys[i] for i in valid],
                lease_ms=max(1, int(ttl * 1000)),
            ),
            sent_at + timeout,
        )
        if len(response.objects) != len(valid):
            raise KVPoolError(f"the master answered {len(response.objects)} of {len(valid)} keys")
        for i, location in zip(valid, response.objects, strict=True):
            statuses[i] = location.status
            sizes[i] = location.size if location.status == KeyStatus.OK else None
        # The master counts the lease from the request's arrival, so counting it from
        # before sending can only end our estimate early, never late.
        return Leased(sizes, sent_at + response.lease_ms / 1000.0, statuses, response.quota_refusal)

    def release(self, keys: Sequence[str], timeout: float) -> int:
        """Ends this client's leases on ``keys`` now (``ReleaseLeases``), instead of when
        they run out: unlocked chunks count against the tenant's leases quota and are kept
        from eviction until then. Returns how many leases ended."""
        valid = valid_keys_of(keys)
        if not valid:
            return 0
        response = self._link.call(
            "ReleaseLeases",
            pb.ReleaseLeasesRequest(client_id=self.client_id, keys=valid),
            time.monotonic() + timeout,
        )
        return int(response.released)

    def remove(self, keys: Sequence[str], timeout: float, *, force: bool) -> list[int]:
        """Each key's KeyStatus as a number (a newer master's status this one does not know
        stays a number, and is neither removed nor missing). Invalid keys are INVALID_KEY,
        unsent."""
        statuses: list[int] = [KeyStatus.INVALID_KEY] * len(keys)
        valid = valid_positions(keys)
        if not valid:
            return statuses
        response = self._link.call(
            "Remove",
            pb.RemoveRequest(client_id=self.client_id, keys=[keys[i] for i in valid], force=force),
            time.monotonic() + timeout,
        )
        for i, status in zip(valid, response.statuses, strict=True):
            statuses[i] = status
        return statuses

    def list_keys(
        self, prefix: str, limit: int, start_after: str, timeout: float
    ) -> pb.ListKeysResponse:
        return self._link.call(
            "ListKeys",
            pb.ListKeysRequest(prefix=prefix, limit=limit, start_after=start_after),
            time.monotonic() + timeout,
        )

    def cluster_status(self, timeout: float) -> pb.ClusterStatusResponse:
        return self._link.call(
            "ClusterStatus", pb.ClusterStatusRequest(), time.monotonic() + timeout
        )

    def close(self) -> None:
        self._link.close()
