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
from kvpool.common.logging import get_logger
from kvpool.common.status import KeyStatus
from kvpool.errors import (
    ClientClosed,
    InvalidArgument,
    KVPoolError,
    PutAborted,
    PutOutcomeUnknown,
    TransferError,
)

log = get_logger("kvpool.client")

#: Seconds ``Reservation.closed`` waits for another thread's commit or write marking itself
#: under way (a close on the thread itself, a signal handler's, does not wait).
CLOSE_WAIT = 1.0
#: Seconds past a write's deadline that ending its reservation waits for the write to
#: return: a write stops at its deadline (client/data_path.py checks it before each piece;
#: a UCX transfer drains ``LATE_GRACE`` more), so a write still under way after this is
#: one whose thread is not running (stopped in a debugger, say).
WRITE_STOP_MARGIN = 2.0
#: Seconds past the client's timeout that ``revoke`` waits for the answer of a commit under
#: way on another thread (its PutEnd is answered, or given up on, within that timeout).
COMMIT_ANSWER_MARGIN = 1.0
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

    Its steps may be taken on different threads. A ``write`` is under way from its check
    that the reservation is open until its transfer returns; ending the reservation (a
    ``revoke``, the client's close, a ``write`` past the window giving it up) first refuses
    the writes not begun, then waits for those under way (each stops at its deadline)
    before it gives the space back: the master places other objects there at once, and a
    byte written late would land in one of them. A write that has not returned
    ``WRITE_STOP_MARGIN`` past its deadline (its thread is not running) keeps its
    reservation from being given back: the master reclaims it once the writer's window is
    over. A ``revoke`` during a commit on another thread waits for the commit's answer: a
    commit that published the object makes it raise InvalidArgument, as after it.
    """

    def __init__(self, session: Session, put: PendingPut, size: int, checksum: bool) -> None:
        self._session = session
        self._put = put
        self._checksum = checksum
        #: What keeps the session open while this reservation lives: its client (set by
        #: ``Client.reserve``), which would close the session once collected.
        self.owner: object = None
        self.key = put.key
        self.size = size
        self.put_id = put.slot.put_id
        self.replicas = len(put.slot.replicas)
        #: The replicas the commit published; None until a commit succeeded.
        self._committed: int | None = None
        self._revoked = False
        #: Writes are refused from the start of an ending (a revoke, a write past the window)
        #: on, and for good once a PutRevoke may have reached the master (it went unanswered)
        #: or the master said it no longer holds the reservation: the space may be another
        #: object's. Cleared only where the ending sent nothing (it was interrupted). A
        #: revoke (to send it again) and a commit (to learn the outcome) are still taken.
        self._no_more_writes = False
        #: Why its client's close ended it (``_closed_now``): kept whatever a revoke
        #: interrupted mid-way restores, which the close's own mark then stands for.
        self._closed_as: tuple[type[KVPoolError], str] | None = None
        #: A revoke has marked it and not finished (sent, or undone): another revoke waits
        #: for it before it reads whether the reservation is ending.
        self._revoking = False
        #: The thread of that revoke (a signal handler's revoke there does not wait for it).
        self._revoker = 0
        #: A commit went unanswered (PutOutcomeUnknown, or its client closed meanwhile), and
        #: none was answered since; a commit is under way.
        self._unanswered = False
        self._committing = False
        #: The thread whose commit is under way (a revoke there does not wait for it).
        self._committer = 0
        #: Orders an ending (``closed``, ``revoke``, a write past the window) against a
        #: commit about to send its PutEnd and a write about to begin. Reentrant: a signal
        #: handler's close or revoke may interrupt this thread inside it.
        self._closing = threading.RLock()
        #: Told when a commit was answered or a write returned.
        self._changed = threading.Condition(self._closing)
        #: The writes under way (their thread's id, and a token of each), and the latest
        #: deadline among them (monotonic).
        self._writes: tuple[tuple[int, object], ...] = ()
        self._writes_until = 0.0
        #: A signal handler's ``revoke`` interrupted a write of its own thread: the write
        #: gives the reservation back once it has returned.
        self._give_back_after_write = False
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
        # (the write is a call of its own: within the client's timeout, and the window)
        deadline = min(self._window_end, time.monotonic() + self._session.timeout)
        mine = (threading.get_ident(), object())
        try:
            self._begin_write(mine, deadline)
            self._put.source = source
            self._put.write_deadline = deadline
            put_path.write(self._session, [self._put], self._checksum)
        finally:
            self._end_write(mine)  # (an interrupt anywhere in the begin: as it left it)
        if self.size and all(self._put.errors):
            # (past the window's end: given up, as a write begun past it, saying why)
            self._refuse_if_window_passed(failures=self._put.failures)
            raise TransferError(
                f"no replica of {self.key!r} could be written: {'; '.join(self._put.errors)}",
                key=self.key,
            )

    def _begin_write(self, write: tuple[int, object], deadline: float) -> None:
        """Marks ``write`` (its thread's id, a token) under way until ``deadline``; raises
        as ``write`` on a reservation that ended (or is ending) meanwhile."""
        # The check and the mark with no call between them (as a commit's): an ending, on
        # another thread or in a signal handler here, sees the write either not begun (it
        # is refused) or under way (the ending waits for it).
        with self._closing:
            if (
                self._committed is None
                and not self._revoked
                and self._over is None
                and not self._no_more_writes
            ):
                self._writes += (write,)
                if deadline > self._writes_until:
                    self._writes_until = deadline
                return
        self._refuse_if_over("write")  # (ended since the first check: it raises)

    def _end_write(self, write: tuple[int, object]) -> None:
        """``write`` returned (or raised, or was refused): an ending waiting for it goes
        on. The last one out gives the reservation back where a signal handler's revoke on
        a writing thread left that to it."""
        give_back = False
        with self._closing:
            if write not in self._writes:
                return  # (refused, or interrupted before its mark)
            self._writes = tuple(other for other in self._writes if other is not write)
            if not self._writes:
                self._writes_until = 0.0
                give_back, self._give_back_after_write = self._give_back_after_write, False
            self._changed.notify_all()
        if give_back:
            put_path.give_back(self._session, [self.key], [self.put_id])
            self._session.let_go(self)

    def _write_bound(self) -> float:
        """Seconds until the writes under way must have returned (0: none is)."""
        return max(0.0, self._writes_until - time.monotonic()) if self._writes else 0.0

    def _writing_here(self, me: int) -> bool:
        """Whether a write of thread ``me`` is under way (a signal handler interrupted it)."""
        return any(thread == me for thread, _ in self._writes)

    def _writes_stopped(self, me: int) -> bool:
        """Waits (``_closing`` held) for the writes under way on other threads to return,
        ``WRITE_STOP_MARGIN`` past their deadline at most. True once none is under way;
        False where one still is: past that bound, or one of this thread ``me`` (a signal
        handler's call interrupted it, and it cannot return before the handler does)."""
        while any(thread != me for thread, _ in self._writes):
            left = self._writes_until + WRITE_STOP_MARGIN - time.monotonic()
            if left <= 0:
                break
            self._changed.wait(left)
        return not self._writes

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
        me = threading.get_ident()
        error: KVPoolError | None = None
        # (not answered: the reservation stays open, for a commit again to learn the outcome)
        try:
            # The check and the mark with no call between them: a close or revoke (another
            # thread's, or a signal handler's, which runs only at a call) sees the commit
            # either not begun, then no PutEnd goes, or under way.
            with self._closing:
                if self._committed is None and not self._revoked and self._over is None:
                    self._committing = True
                    self._committer = me
            if not self._committing:
                self._refuse_if_over("commit")  # (closed since the check above: it raises)
            try:
                [status] = put_path.commit(
                    self._session, [self._put], self._deadline(), UNKNOWN_OUTCOME_ADVICE
                )
            except (PutOutcomeUnknown, ClientClosed):  # (ClientClosed: closed mid-commit)
                self._unanswered = True
                raise
            # (answered: the reservation is over, published or not; recorded before the
            # commit stops being under way, for a revoke waiting on it to read)
            self._unanswered = False
            if status == KeyStatus.OK:
                self._committed = self._put.replicas_written
            else:
                error = error_for(status, self.key, self._put.why_not_published)
                self._over = (type(error), str(error))
        finally:
            with self._closing:
                self._committing = False
                self._changed.notify_all()
        self._session.let_go(self)
        if error is not None:
            raise error
        assert self._committed is not None
        return self._committed

    def revoke(self) -> None:
        """Gives the reservation up; the key and its space are free again. Does nothing on a
        reservation that is over already (revoked, given up, a commit refused, timed out at
        the master); InvalidArgument after a commit that published the object.

        After a commit that went unanswered (PutOutcomeUnknown), a reservation the master no
        longer holds may have been published by that commit: PutOutcomeUnknown again, and
        the reservation stays as it was (``commit`` again learns the outcome).

        Writes not begun are refused from the start, and it returns only once the writes
        under way on other threads have (see the class's docstring). One that has not
        returned ``WRITE_STOP_MARGIN`` past its deadline: TransferError, nothing sent (the
        master reclaims the reservation once the writer's window is over). A commit under
        way on another thread is waited for (the client's timeout, and
        ``COMMIT_ANSWER_MARGIN``): published, InvalidArgument. Called by a signal handler
        that interrupted a write of this thread, it leaves the give-back to that write, as
        it returns. Interrupted before its PutRevoke went, it leaves the reservation as it
        was; one whose PutRevoke went unanswered leaves writes refused (the master may have
        freed the space), and a revoke again sends it again."""
        self._session.check_process()  # (ClientForked in a fork child)
        me = threading.get_ident()
        marked = sending = revoking = False  # (marked revoked here; a PutRevoke may have gone)
        was_ending = False
        try:
            with self._closing:
                # A commit or a revoke under way on another thread: their outcome first (a
                # signal handler's call here, on the thread of one, cannot wait for it)
                bound = self._session.timeout + COMMIT_ANSWER_MARGIN + WRITE_STOP_MARGIN
                until = time.monotonic() + bound + self._write_bound()
                while (self._committing and self._committer != me) or (
                    self._revoking and self._revoker != me
                ):
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
                # (still under way: this thread's own, a signal handler's revoke interrupted
                # it; or one not answered in time: its PutEnd may yet publish the object)
                committing = self._committing
                if self._committed is None and (self._revoked or self._over is not None):
                    # (over, or ending on another thread, which gives it back: a close as a
                    # commit was answered may have ended it, and published wins)
                    self._writes_stopped(me)
                    return
                self._refuse_if_over("revoke")  # (published: InvalidArgument)
                was_ending = self._no_more_writes
                # (from now on writes and commits are refused)
                self._revoked = self._no_more_writes = marked = True
                self._revoking, self._revoker, revoking = True, me, True
                stopped = self._writes_stopped(me)
                if not stopped and self._writing_here(me):
                    marked = False  # (it stays revoked: see below)
                    self._give_back_after_write = True
                    return  # (given back by the write this revoke interrupted, as it returns)
            if not stopped:
                marked = False  # (it stays revoked: the master reclaims it)
                self._session.let_go(self)  # (not given back at close either)
                raise self._not_given_back("revoke")
            sending = True
            [status] = put_path.revoke(self._session, [self._put], self._deadline())
            if status == KeyStatus.STALE_PUT and (self._unanswered or committing):
                # (a commit again learns the outcome; writes stay refused: the undo below,
                # under the lock and before another revoke waiting for this one reads it)
                raise self._maybe_published()
        except BaseException:
            with self._closing:
                if marked:  # (as it was: a revoke again may give it back)
                    self._revoked = False
                    if not sending and self._closed_as is None:  # (nothing sent: as before)
                        self._no_more_writes = was_ending
                    if self._closed_as is not None and self._over is None:
                        self._over = self._closed_as  # (a close meanwhile: it stands)
            raise
        finally:
            if revoking:  # (this revoke's mark, whichever way it leaves)
                with self._closing:
                    self._revoking = False
                    self._changed.notify_all()
        self._session.let_go(self)
        if status not in (KeyStatus.OK, KeyStatus.STALE_PUT):  # (STALE_PUT: gone already)
            raise error_for(status, self.key)

    def _not_given_back(self, step: str) -> TransferError:
        """Why ending the reservation (``step``) did not give it back: a write of it on
        another thread had not returned past its deadline."""
        return TransferError(
            f"could not {step} the reservation of {shown_key(self.key)} at once: a write of "
            f"it on another thread had not returned {WRITE_STOP_MARGIN:g} s past its "
            "deadline (its thread is not running), and giving the space back could let that "
            "write land in the next object placed there. No more writes or commits of it are "
            "taken; the master reclaims it once the writer's window is over",
            key=self.key,
        )

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
        """Its client closed and gives it back (``Client.close``, which then asks
        ``writes_over``). Ordered against a commit about to send its PutEnd: either that
        PutEnd goes after this, or never; and against a write about to begin: refused, or
        under way. (A close from a signal handler that interrupted this very thread's
        commit or write holding the order reads how far it had gone; one held by another
        thread is waited for ``CLOSE_WAIT`` at most.)"""
        if not self._closing.acquire(timeout=CLOSE_WAIT):
            self._closed_now(self._committing)  # (as far as the commit had gone)
            return
        try:
            self._closed_now(self._committing)
        finally:
            self._closing.release()

    def writes_over(self) -> bool:
        """For ``Client.close``, after ``closed``: waits for the writes under way on other
        threads to return (see ``_writes_stopped``). True once none is under way (the
        reservation may be given back); False, with a log line, where one is (the master
        reclaims the reservation once the writer's window is over)."""
        me = threading.get_ident()
        if not self._closing.acquire(timeout=CLOSE_WAIT):
            stopped = not self._writes  # (held by a thread that is not running)
        else:
            try:
                stopped = self._writes_stopped(me)
            finally:
                self._closing.release()
        if not stopped:
            log.warning(
                "a reservation was not given back at close: a write of it had not returned "
                "(on this thread, interrupted by the close; or on a thread that is not "
                "running); the master reclaims it once the writer's window is over",
                key=shown_key(self.key),
                put_id=self.put_id,
            )
        return stopped

    def _closed_now(self, committing: bool) -> None:
        key = shown_key(self.key)
        if self._unanswered or committing:  # (a commit may have reached the master)
            why = (
                f"the client was closed while the commit of {key} was under way or "
                f"unanswered: the object may have been published; check with exists({key}) "
                "from a new client (a put of it again gets ObjectExists where it was)"
            )
        else:
            why = (
                f"the client was closed, and the reservation of {key} given up with it "
                "(nothing was published): make a new client, and reserve the key again"
            )
        self._closed_as = (ClientClosed, why)
        self._no_more_writes = True
        self.end(ClientClosed, why)

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
        me = threading.get_ident()
        with self._closing:
            # (ending it here, unless a commit's answer, a close or a revoke did: that one
            # gives it back)
            ending = self._committed is None and not self._revoked and self._over is None
            was_ending = self._no_more_writes
            self.end(
                PutAborted,
                f"the write window of the reservation of {shown_key(self.key)} (about "
                f"{self._window:.2f} s from reserve(): the master's --write-timeout) {what}, "
                f"and the reservation was given up. {advice}",
            )
            if ending:
                self._no_more_writes = True
            try:
                stopped = self._writes_stopped(me) if ending else False
            except BaseException:
                if ending:  # (nothing sent: as it was, for a revoke to give it back)
                    self._over = self._closed_as  # (None unless a close came meanwhile)
                    if self._closed_as is None:
                        self._no_more_writes = was_ending
                raise
            if ending and not stopped and self._writing_here(me):
                self._give_back_after_write = True  # (a signal handler's write: see revoke)
                ending = False
        if ending and stopped:
            put_path.give_back(self._session, [self.key], [self.put_id])
        elif ending:
            log.warning(str(self._not_given_back("give up")), key=shown_key(self.key))
        self._session.let_go(self)
        self._refuse_if_over("write")
        raise AssertionError("unreachable: the reservation is over")

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
        if step == "write" and self._no_more_writes:
            raise InvalidArgument(
                f"cannot write {shown_key(self.key)}: its reservation is being given back, or "
                "a revoke's PutRevoke went unanswered (the master may have freed the space "
                "already), or the master no longer holds it after an unanswered commit (which "
                "may have published the object). No more writes of it are taken: call "
                "revoke() again to give it back, or commit() to learn a commit's outcome",
                key=self.key,
            )

    def _deadline(self) -> float:
        return time.monotonic() + self._session.timeout
