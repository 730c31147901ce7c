"""The adapter's metadata line to the kvpool master, every call with its own deadline.

Lookups, lease renewals, deletes, listings and health probes carry no payload, so they do not
go through a data client (whose UCX worker may be busy with a long transfer) and each gets
the deadline of its kind: a lookup on the prefetch path must answer within milliseconds, a
health probe within a second, while a delete may wait longer.

Lookup-and-lock is ``GetReplicas`` with a lease: one round trip per batch, and the lease is
the lock (a leased object is neither evicted nor removed without force). ``kvpool.Client``
has no public call that only takes leases, so this talks to the master through the client's
``MasterLink`` directly.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.client.master_link import MasterLink
from kvpool.common.status import KeyStatus
from kvpool.proto import master_pb2 as pb
from kvpool.security.caller import CallerCredentials


@dataclass(frozen=True, slots=True)
class Leased:
    """Outcome of a lease batch: the size of each leased key (None: absent) and the moment,
    on this process's monotonic clock, before which every lease surely still holds."""

    sizes: list[int | None]
    until: float


class ControlPlane:
    def __init__(
        self,
        master: str,
        metadata_lane: bool = True,
        credentials: CallerCredentials | None = None,
    ) -> None:
        self.master = master
        self.client_id = f"lmcache-{uuid.uuid4().hex}"
        self._link = MasterLink(master, use_lane=metadata_lane, credentials=credentials)

    def lease(self, keys: Sequence[str], ttl: float, timeout: float) -> Leased:
        """Leases every existing key for ``ttl`` seconds (one round trip); raises
        ``MasterUnavailable`` when the master does not answer within ``timeout``."""
        sent_at = time.monotonic()
        response = self._link.call(
            "GetReplicas",
            pb.GetReplicasRequest(
                client_id=self.client_id, keys=list(keys), lease_ms=max(1, int(ttl * 1000))
            ),
            sent_at + timeout,
        )
        sizes = [
            location.size if location.status == KeyStatus.OK else None
            for location in response.objects
        ]
        # The master counts the lease from the request's arrival, so counting it from
        # before sending can only end our estimate early, never late.
        return Leased(sizes, sent_at + response.lease_ms / 1000.0)

    def remove(self, keys: Sequence[str], timeout: float, *, force: bool) -> list[int]:
        """Each key's KeyStatus as a number (a newer master's status this one does not know
        stays a number, and is neither removed nor missing)."""
        response = self._link.call(
            "Remove",
            pb.RemoveRequest(client_id=self.client_id, keys=list(keys), force=force),
            time.monotonic() + timeout,
        )
        return list(response.statuses)

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
