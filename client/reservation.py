"""A put taken apart: reserve, write, then commit or revoke, each step explicit."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvpool.client.buffers import readable_address
from kvpool.client.outcomes import error_for
from kvpool.common.status import KeyStatus
from kvpool.errors import InvalidArgument, KVPoolError, TransferError
from kvpool.proto import master_pb2 as pb

if TYPE_CHECKING:
    from kvpool.client.client import Client


@dataclass(slots=True)
class PendingPut:
    """One reserved key on its way to publication."""

    index: int  # position in the caller's batch
    key: str
    slot: pb.PutSlot
    source: tuple[int, int, Any] | None  # (address, length, keepalive) of the bytes
    errors: list[str] = field(default_factory=list)  # per replica: '' when written


class Reservation:
    """Space reserved for ``key``; invisible to readers until ``commit``."""

    def __init__(self, client: Client, put: PendingPut, size: int) -> None:
        self._client = client
        self._put = put
        self.key = put.key
        self.size = size
        self.put_id = put.slot.put_id
        self.replicas = len(put.slot.replicas)

    def write(self, data: Any) -> None:
        """Copies ``data`` (exactly ``size`` bytes) into every reserved replica."""
        source = readable_address(data)
        if source[1] != self.size:
            raise InvalidArgument(
                f"reserved {self.size} bytes for {self.key!r} but got {source[1]}", key=self.key
            )
        self._put.source = source
        self._client._write([self._put], time.monotonic() + self._client.timeout)
        if self.size and all(self._put.errors):
            raise TransferError(
                f"no replica of {self.key!r} could be written: {'; '.join(self._put.errors)}",
                key=self.key,
            )

    def commit(self) -> None:
        """Publishes the object (with the replicas whose writes completed)."""
        if self._put.source is None:
            raise InvalidArgument(f"write {self.key!r} before committing it", key=self.key)
        status = self._client._commit([self._put], time.monotonic() + self._client.timeout)[0]
        _raise_unless_ok(status, self.key, self._put.errors)

    def revoke(self) -> None:
        """Gives the reservation up; the key and its space are free again."""
        status = self._client._revoke([self._put], time.monotonic() + self._client.timeout)[0]
        _raise_unless_ok(status, self.key, [])


def _raise_unless_ok(status: int, key: str, errors: list[str]) -> None:
    if status != KeyStatus.OK:
        error: KVPoolError = error_for(status, key, "; ".join(filter(None, errors)))
        raise error
