"""A put taken apart: reserve, write, then commit or revoke, each step explicit."""

from __future__ import annotations

import time
from typing import Any

from kvpool.client import put_path
from kvpool.client.buffers import readable_address
from kvpool.client.outcomes import error_for
from kvpool.client.put_path import PendingPut
from kvpool.client.session import Session
from kvpool.common.keys import shown_key
from kvpool.common.status import KeyStatus
from kvpool.errors import InvalidArgument, TransferError


class Reservation:
    """Space reserved for ``key``; invisible to readers until ``commit``.

    Each step knows what came before it: ``write`` and ``commit`` after ``revoke``, and
    ``write`` and ``revoke`` after a ``commit`` that published the object, are refused with
    InvalidArgument (nothing is sent); a second ``commit`` returns the first one's count, a
    second ``revoke`` does nothing. An object of 0 bytes needs no ``write`` before ``commit``.
    """

    def __init__(self, session: Session, put: PendingPut, size: int, checksum: bool) -> None:
        self._session = session
        self._put = put
        self._checksum = checksum
        self.key = put.key
        self.size = size
        self.put_id = put.slot.put_id
        self.replicas = len(put.slot.replicas)
        #: The replicas the commit published; None until a commit succeeded.
        self._committed: int | None = None
        self._revoked = False

    def write(self, data: Any) -> None:
        """Copies ``data`` (exactly ``size`` bytes) into every reserved replica."""
        self._session.check_process()  # (ClientForked in a fork child)
        self._refuse_if_over("write")
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
        self._session.check_process()  # (ClientForked in a fork child)
        if self._committed is not None:
            return self._committed  # (published already: the same answer again)
        self._refuse_if_over("commit")
        if self._put.source is None:
            if self.size:
                raise InvalidArgument(f"write {self.key!r} before committing it", key=self.key)
            self.write(b"")  # (nothing to write: the replicas are written as they are)
        [status] = put_path.commit(self._session, [self._put], self._deadline())
        self._raise_unless_ok(status)
        self._committed = self._put.replicas_written
        return self._committed

    def revoke(self) -> None:
        """Gives the reservation up; the key and its space are free again."""
        self._session.check_process()  # (ClientForked in a fork child)
        if self._revoked:
            return
        self._refuse_if_over("revoke")
        [status] = put_path.revoke(self._session, [self._put], self._deadline())
        self._revoked = True  # (whatever the master answered: this reservation is over)
        self._raise_unless_ok(status)

    def _refuse_if_over(self, step: str) -> None:
        """InvalidArgument for ``step`` on a reservation already committed or revoked."""
        if self._committed is not None:
            raise InvalidArgument(
                f"cannot {step} {shown_key(self.key)}: its reservation was committed, and the "
                f"object is published (objects are immutable: remove it to put it again)",
                key=self.key,
            )
        if self._revoked:
            raise InvalidArgument(
                f"cannot {step} {shown_key(self.key)}: its reservation was revoked (reserve "
                "the key again to put it)",
                key=self.key,
            )

    def _deadline(self) -> float:
        return time.monotonic() + self._session.timeout

    def _raise_unless_ok(self, status: int) -> None:
        if status != KeyStatus.OK:
            raise error_for(status, self.key, self._put.why_not_published)
