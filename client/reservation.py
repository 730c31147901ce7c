"""A put taken apart: reserve, write, then commit or revoke, each step explicit."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from kvpool.client import put_path
from kvpool.client.buffers import readable_address
from kvpool.client.data_path import Failure
from kvpool.client.outcomes import error_for
from kvpool.client.put_path import PendingPut
from kvpool.client.session import Session
from kvpool.common.keys import shown_key
from kvpool.common.status import KeyStatus
from kvpool.errors import (
    ClientClosed,
    InvalidArgument,
    KVPoolError,
    PutAborted,
    PutOutcomeUnknown,
    TransferError,
)

#: Seconds ``Reservation.closed`` waits for a commit marking itself under way.
CLOSE_WAIT = 1.0
#: What a commit that got no answer (PutOutcomeUnknown) advises: the master answers a
#: repeated PutEnd of the same reservation with the first one's outcome (master/state.py).
UNKNOWN_OUTCOME_ADVICE = (
    "Call commit() again once the master answers: a repeated commit of the same reservation "
    "is answered with the first one's outcome (and publishes the object if the first never "
    "arrived and the reservation still stands); or check with exists() or get()"
)


class Reservation:
    """Space reserved for ``key``; invisible to readers until ``commit``.

    Each step knows what came before it: ``write`` and ``commit`` after ``revoke``, and
    ``write`` and ``revoke`` after a ``commit`` that published the object, are refused with
    InvalidArgument (nothing is sent); a second ``commit`` returns the first one's count, a
    second ``revoke`` does nothing. An object of 0 bytes needs no ``write`` before ``commit``.

    A reservation can also end without either: a ``write`` after its write window (see
    ``Client.reserve``) gives it up and raises PutAborted; a ``commit`` the master answered
    with an error ends it; closing the client gives it up. After that ``write`` and
    ``commit`` raise again why it ended, and ``revoke`` does nothing (so that a cleanup's
    ``revoke`` never raises for a reservation that is over already); a reservation the
    master no longer holds (it timed out) is revoked quietly too.

    A ``commit`` the master did not answer (PutOutcomeUnknown: it may have published the
    object) leaves the reservation open: ``commit`` again asks for the outcome. A ``revoke``
    after it gives the reservation up where the master still holds it (the commit had not
    reached it: it never publishes); where the master no longer does (the commit may have
    published the object), it raises PutOutcomeUnknown rather than report the key free.
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
        #: A commit went unanswered (PutOutcomeUnknown, or its client closed meanwhile), and
        #: none was answered since; a commit is under way.
        self._unanswered = False
        self._committing = False
        #: Orders a close against a commit about to send its PutEnd (``closed``, ``commit``).
        self._closing = threading.Lock()
        #: Why it ended otherwise (the error's type and message, raised again by ``write``
        #: and ``commit``); None while it is open.
        self._over: tuple[type[KVPoolError], str] | None = None
        #: When the master's write window ends (monotonic), and about how long it was.
        self._window_end = put.write_deadline
        self._window = max(0.0, put.write_deadline - time.monotonic())
        if not session.hold(self):  # (for the client's close to give it back)
            self._closed_meanwhile()

    def _closed_meanwhile(self) -> None:
        """The client closed while PutStart was answered (after its close gave back the
        reservations it knew of): this one goes back too, and ClientClosed is raised."""
        given_back = "the reservation was given back"
        if not put_path.give_back(self._session, [self.key], [self.put_id]):
            given_back = (  # (its connection closed)
                "the reservation ends when the master stops hearing from the client "
                "(its --client-ttl)"
            )
        raise ClientClosed(
            f"the client was closed while {shown_key(self.key)} was being reserved; "
            f"{given_back}: make a new client, and reserve the key again",
            key=self.key,
        )

    def write(self, data: Any) -> None:
        """Copies ``data`` (exactly ``size`` bytes) into every reserved replica, within the
        reservation's write window (see ``Client.reserve``); past it, the reservation is
        given up and PutAborted raised."""
        self._session.check_process()  # (ClientForked in a fork child)
        self._refuse_if_over("write")
        if self.size:
            self._refuse_if_window_passed()
        source = readable_address(data)
        if source[1] != self.size:
            raise InvalidArgument(
                f"reserved {self.size} bytes for {self.key!r} but got {source[1]}", key=self.key
            )
        self._put.source = source
        # (the write is a call of its own: within the client's timeout, and the window)
        self._put.write_deadline = min(self._window_end, time.monotonic() + self._session.timeout)
        put_path.write(self._session, [self._put], self._checksum)
        if self.size and all(self._put.errors):
            # (past the window's end: given up, as a write begun past it, saying why)
            self._refuse_if_window_passed(failures=self._put.failures)
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
        # (not answered: the reservation stays open, for a commit again to learn the outcome)
        try:
            # The check and the mark with no call between them: a close (another thread's,
            # or a signal handler's, which runs only at a call) sees the commit either not
            # begun, then no PutEnd goes, or under way.
            with self._closing:
                if self._committed is None and not self._revoked and self._over is None:
                    self._committing = True
            if not self._committing:
                self._refuse_if_over("commit")  # (closed since the check above: it raises)
            try:
                [status] = put_path.commit(
                    self._session, [self._put], self._deadline(), UNKNOWN_OUTCOME_ADVICE
                )
            except (PutOutcomeUnknown, ClientClosed):  # (ClientClosed: closed mid-commit)
                self._unanswered = True
                raise
        finally:
            self._committing = False
        self._unanswered = False
        # (answered: the reservation is over, published or not)
        self._session.let_go(self)
        if status != KeyStatus.OK:
            error = error_for(status, self.key, self._put.why_not_published)
            self._over = (type(error), str(error))
            raise error
        self._committed = self._put.replicas_written
        return self._committed

    def revoke(self) -> None:
        """Gives the reservation up; the key and its space are free again. Does nothing on a
        reservation that is over already (revoked, given up, a commit refused, timed out at
        the master); InvalidArgument after a commit that published the object.

        After a commit that went unanswered (PutOutcomeUnknown), a reservation the master no
        longer holds may have been published by that commit: PutOutcomeUnknown again, and
        the reservation stays as it was (``commit`` again learns the outcome)."""
        self._session.check_process()  # (ClientForked in a fork child)
        if self._committed is None and (self._revoked or self._over is not None):
            return  # (a close as a commit was answered may have ended it: published wins)
        self._refuse_if_over("revoke")
        [status] = put_path.revoke(self._session, [self._put], self._deadline())
        if status == KeyStatus.STALE_PUT and self._unanswered:
            raise self._maybe_published()
        self._revoked = True  # (whatever the master answered: this reservation is over)
        self._session.let_go(self)
        if status not in (KeyStatus.OK, KeyStatus.STALE_PUT):  # (STALE_PUT: gone already)
            raise error_for(status, self.key)

    def _maybe_published(self) -> PutOutcomeUnknown:
        """What ``revoke`` raises when the master no longer holds a reservation whose
        commit went unanswered: that commit may have reached it, and published the object
        (or been refused, or the reservation timed out)."""
        key = shown_key(self.key)
        return PutOutcomeUnknown(
            f"could not revoke the reservation of {key}: the master no longer holds it, and "
            f"its earlier commit (PutEnd) went unanswered, so that commit may have reached "
            f"the master and published the object (or been refused, or the reservation timed "
            f"out). The key may not be free: call commit() again to learn the commit's "
            f"outcome (the master answers a repeated commit with the first one's), or check "
            f"with exists({key}); remove it to free the key",
            key=self.key,
        )

    def end(self, error: type[KVPoolError], message: str) -> None:
        """Marks the reservation over (given up elsewhere): ``write`` and ``commit`` then
        raise ``error(message)``, ``revoke`` does nothing. No call is made."""
        if self._committed is None and not self._revoked and self._over is None:
            self._over = (error, message)

    def closed(self) -> None:
        """Its client closed and gave it back (``Client.close``). Ordered against a commit
        about to send its PutEnd: either that PutEnd goes after this, or never. (A close
        from a signal handler that interrupted this very thread's commit holding the order
        waits ``CLOSE_WAIT`` at most, then reads how far the commit had gone.)"""
        if not self._closing.acquire(timeout=CLOSE_WAIT):
            self._closed_now(self._committing)  # (as far as the commit had gone)
            return
        try:
            self._closed_now(self._committing)
        finally:
            self._closing.release()

    def _closed_now(self, committing: bool) -> None:
        key = shown_key(self.key)
        if self._unanswered or committing:  # (a commit may have reached the master)
            self.end(
                ClientClosed,
                f"the client was closed while the commit of {key} was under way or "
                f"unanswered: the object may have been published; check with exists({key}) "
                "from a new client (a put of it again gets ObjectExists where it was)",
            )
            return
        self.end(
            ClientClosed,
            f"the client was closed, and the reservation of {key} given up with it (nothing "
            "was published): make a new client, and reserve the key again",
        )

    def _refuse_if_window_passed(self, failures: Sequence[Failure | None] = ()) -> None:
        """Past the write window no byte may be written (the master may have reused the
        space): the reservation is given back, best effort, and PutAborted raised.
        ``failures``: those of a write that began within the window and failed (each
        replica's), said as they are unless the window's end cut them all off."""
        late = time.monotonic() - self._window_end
        if late < 0:
            return
        advice = "Reserve the key again and write it sooner"
        if not failures:
            what = f"ran out {late:.2f} s ago: nothing was written"
        elif all(failure is not None and failure.timed_out for failure in failures):
            what = "ended before the write did: it was not written whole"
        else:
            errors = "; ".join(str(failure) for failure in failures if failure is not None)
            what = f"had ended by the time the write failed ({errors})"
            advice = "Reserve the key again once its nodes are reachable"
        put_path.give_back(self._session, [self.key], [self.put_id])
        self._session.let_go(self)
        self.end(
            PutAborted,
            f"the write window of the reservation of {shown_key(self.key)} (about "
            f"{self._window:.2f} s from reserve(): the master's --write-timeout) {what}, and "
            f"the reservation was given up. {advice}",
        )
        assert self._over is not None
        raise self._over[0](self._over[1], key=self.key)

    def _refuse_if_over(self, step: str) -> None:
        """InvalidArgument for ``step`` on a reservation already committed or revoked; why
        it ended, for one over otherwise."""
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
        over = self._over
        if over is not None:
            raise over[0](over[1], key=self.key)

    def _deadline(self) -> float:
        return time.monotonic() + self._session.timeout
