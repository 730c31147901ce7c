"""A put taken apart: reserve, write, then commit or revoke, each step explicit."""

from __future__ import annotations

import time
from typing import Any

from kvpool.client import put_path
from kvpool.client.buffers import readable_address
from kvpool.client.outcomes import error_for
from kvpool.client.put_path import PendingPut
from kvpool.client.session import Session
from kvpool.common.status import KeyStatus
from kvpool.errors import InvalidArgument, TransferError


class Reservation:
    """Space reserved for ``key``; invisible to readers until ``commit``."""

    def __init__(self, session: Session, put: PendingPut, size: int, checksum: bool) -> None:
        self._session = session
        self._put = put
        self._checksum = checksum
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
        put_path.write(self._session, [self._put], self._checksum)
        if self.size and all(self._put.errors):
            raise TransferError(
                f"no replica of {self.key!r} could be written: {'; '.join(self._put.errors)}",
                key=self.key,
            )

    def commit(self) -> int:
        """Publishes the object; returns how many replicas it has."""
        if self._put.source is None:
            raise InvalidArgument(f"write {self.key!r} before committing it", key=self.key)
        [status] = put_path.commit(self._session, [self._put], self._deadline())
        self._raise_unless_ok(status)
        return self._put.replicas_written

    def revoke(self) -> None:
        """Gives the reservation up; the key and its space are free again."""
        [status] = put_path.revoke(self._session, [self._put], self._deadline())
        self._raise_unless_ok(status)

    def _deadline(self) -> float:
        return time.monotonic() + self._session.timeout

    def _raise_unless_ok(self, status: int) -> None:
        if status != KeyStatus.OK:
            raise error_for(status, self.key, "; ".join(filter(None, self._put.errors)))
