"""A reservation ended on one thread while another thread writes or commits it.

The master frees the space of a revoked reservation at once (it trusts that the writer has
stopped) and places the next object there; a write of the revoked reservation still under
way would land in that object. So ``Reservation.revoke`` and ``Client.close`` (which gives
back every open reservation) refuse the writes not begun, and give the space back only once
the writes under way have returned. A revoke racing a commit waits for the commit's answer,
and does not call a published object's key free.

The writing thread is held mid-write by a wrapper on its write path (it stands for the
thread being descheduled there); the other threads are the test's own. Against real
processes: a secure cluster whose DRAM the client maps, and an insecure one reached over
UCX (``same_host_mapping=False``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvpool import Client
from kvpool.client import client as client_module
from kvpool.client import put_path
from kvpool.client import reservation as reservation_module
from kvpool.client.data_path import DataPath
from kvpool.errors import InvalidArgument, KVPoolError, MasterUnavailable, TransferError
from kvpool.transport import writer_locks

SIZE = 4 << 20
#: The master's write window (``--write-timeout``): far longer than a thread is held.
WRITE_TIMEOUT = 10
#: Seconds the writing thread is held mid-write while the other thread ends its reservation.
HELD = 1.0
WRITER = "writer"


@dataclass
class Setup:
    writer: Client  # (its thread WRITER is held where ``hold`` says)
    other: Client  # (another client, placing the next objects)
    here: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def hold(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        """Holds the writing thread on entering ``owner.name`` until ``go``."""
        real = getattr(owner, name)

        def held(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name == WRITER:
                self.here.set()
                assert self.go.wait(30), "never let go"
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, held)


#: (secure, the writer maps the node's DRAM): where its write is held, inside the data path
#: (past its check for a closed client, its transfer under way for ``close`` to wait on).
CLUSTERS = pytest.mark.parametrize(
    ("secure", "mapping"),
    [(True, True), (False, False)],
    ids=["secure-mapped-dram", "insecure-ucx"],
)


@pytest.fixture
def make_setup(
    cluster_factory: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[bool, bool], Setup]]:
    made: list[Setup] = []

    def make(secure: bool, mapping: bool) -> Setup:
        cluster = cluster_factory(
            1, "64MiB", secure=secure, master_args=["--write-timeout", str(WRITE_TIMEOUT)]
        )
        if not secure:
            for name in ("KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE", "KVPOOL_TLS_CA"):
                monkeypatch.delenv(name, raising=False)
        credentials = cluster.client_credentials()
        setup = Setup(
            Client(
                cluster.master_address,
                timeout=30,
                same_host_mapping=mapping,
                copy_threads=1,
                **credentials,
            ),
            Client(cluster.master_address, timeout=30, **credentials),
        )
        made.append(setup)
        setup.writer.put("warm", b"w" * 4096)  # (maps the segment, or makes the endpoint)
        setup.writer.remove("warm")
        assert bool(setup.writer.mapped_segments) == mapping
        if mapping:
            setup.hold(monkeypatch, writer_locks, "hold")
        else:
            setup.hold(monkeypatch, DataPath, "_take_lane")
        return setup

    yield make
    for setup in made:
        setup.go.set()
        setup.writer.close()
        setup.other.close()


def address_of(reservation: Any) -> int:
    return int(reservation._put.slot.replicas[0].address)


def put_in_parts(client: Client, key: str, data: bytes) -> int:
    """Puts ``data`` through a reservation; returns where its replica was placed."""
    reservation = client.reserve(key, len(data))
    reservation.write(data)
    assert reservation.commit() == 1
    return address_of(reservation)


class Timed:
    """Runs ``call`` on a thread of its own (``name``), noting when it returned and how."""

    def __init__(self, name: str, call: Callable[[], object]) -> None:
        self.returned_at: float | None = None
        self.outcome: object = None
        self._call = call
        self.thread = threading.Thread(target=self._run, name=name)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.outcome = self._call()
        except Exception as error:  # (the test says what it was)
            self.outcome = error
        self.returned_at = time.monotonic()

    def join(self) -> None:
        self.thread.join(60)
        assert not self.thread.is_alive()


@dataclass
class EndedMidWrite:
    """What ``end_mid_write`` saw."""

    write: Timed
    end: Timed
    #: Whether the ending returned while the write was still held.
    returned_while_held: bool
    #: The object another client placed meanwhile.
    placed_meanwhile: bytes


def end_mid_write(
    setup: Setup, reservation: Any, name: str, end: Callable[[], object]
) -> EndedMidWrite:
    """Starts a write of ``reservation`` (held mid-write), runs ``end`` on a thread of its
    own (``name``), places another object while the write is held, then lets it go and
    waits for both."""
    write = Timed(WRITER, lambda: reservation.write(b"A" * SIZE))
    assert setup.here.wait(20), "the write never began"
    ending = Timed(name, end)
    time.sleep(HELD)
    returned_while_held = ending.returned_at is not None
    placed_meanwhile = os.urandom(SIZE)
    put_in_parts(setup.other, "victim/b", placed_meanwhile)
    setup.go.set()
    write.join()
    ending.join()
    return EndedMidWrite(write, ending, returned_while_held, placed_meanwhile)


@CLUSTERS
def test_a_revoke_during_another_threads_write_returns_once_the_write_is_over(
    make_setup, secure, mapping
):
    """The next object placed in the space reads back whole; so does one placed while the
    write was held (elsewhere: the space is not free until the write is over)."""
    setup = make_setup(secure, mapping)
    reservation = setup.writer.reserve("victim/a", SIZE)
    a_address = address_of(reservation)

    seen = end_mid_write(setup, reservation, "revoker", reservation.revoke)

    write, revoke = seen.write, seen.end
    assert setup.other.get("victim/b") == seen.placed_meanwhile, "the revoked write landed in it"
    assert not seen.returned_while_held, "revoke() returned while the write was under way"
    assert write.outcome is None and revoke.outcome is None  # (both within the window)
    assert write.returned_at is not None and revoke.returned_at is not None
    assert revoke.returned_at >= write.returned_at
    # given back at once: the key and the space are free, and a write of it is refused
    with pytest.raises(InvalidArgument, match="revoked"):
        reservation.write(b"A" * SIZE)
    placed_next = os.urandom(SIZE)
    assert put_in_parts(setup.other, "victim/a", placed_next) == a_address
    assert setup.other.get("victim/a") == placed_next


@CLUSTERS
def test_a_close_during_another_threads_write_gives_the_reservation_back_once_it_is_over(
    make_setup, secure, mapping
):
    setup = make_setup(secure, mapping)
    reservation = setup.writer.reserve("victim/a", SIZE)
    a_address = address_of(reservation)

    seen = end_mid_write(setup, reservation, "closer", setup.writer.close)

    write, close = seen.write, seen.end
    assert setup.other.get("victim/b") == seen.placed_meanwhile, "the given-back write landed in it"
    assert not seen.returned_while_held, "close() returned while the write was under way"
    assert write.outcome is None and close.outcome is None
    assert write.returned_at is not None and close.returned_at is not None
    assert close.returned_at >= write.returned_at
    # given back at close: the key and the space are free at once
    placed_next = os.urandom(SIZE)
    assert put_in_parts(setup.other, "victim/a", placed_next) == a_address
    assert setup.other.get("victim/a") == placed_next


@CLUSTERS
def test_a_write_not_begun_when_another_thread_revoked_is_refused(
    make_setup, monkeypatch, secure, mapping
):
    """Held after its first checks, before it marked itself under way: the revoke does not
    wait for it, and it writes nothing into the object placed in the space since."""
    setup = make_setup(secure, mapping)
    setup.hold(monkeypatch, reservation_module, "readable_address")
    reservation = setup.writer.reserve("victim/a", SIZE)
    a_address = address_of(reservation)
    write = Timed(WRITER, lambda: reservation.write(b"A" * SIZE))
    assert setup.here.wait(20), "the write never began"

    reservation.revoke()  # (nothing under way: at once)
    placed_next = os.urandom(SIZE)
    assert put_in_parts(setup.other, "victim/b", placed_next) == a_address
    setup.go.set()
    write.join()

    assert setup.other.get("victim/b") == placed_next, "the revoked write landed in it"
    assert isinstance(write.outcome, InvalidArgument), write.outcome
    assert "revoked" in str(write.outcome)


def test_a_revoke_racing_a_commit_that_wins_says_the_object_is_published(
    cluster_factory, monkeypatch
):
    """The commit on another thread was answered (published) but has not returned yet:
    revoke() waits for it, then raises InvalidArgument, as after a commit, rather than
    return as though the key were free."""
    cluster = cluster_factory(1, "64MiB")
    answered, go = threading.Event(), threading.Event()
    real = put_path.commit

    def held_after_the_answer(*args: Any, **kwargs: Any) -> Any:
        statuses = real(*args, **kwargs)
        if threading.current_thread().name == WRITER:
            answered.set()
            assert go.wait(30), "never let go"
        return statuses

    monkeypatch.setattr(put_path, "commit", held_after_the_answer)
    with Client(cluster.master_address, timeout=30, **cluster.client_credentials()) as client:
        reservation = client.reserve("k", 4096)
        reservation.write(b"x" * 4096)
        commit = Timed(WRITER, reservation.commit)
        assert answered.wait(20), "the commit was never answered"

        let_go = threading.Timer(HELD, go.set)
        let_go.start()
        try:
            with pytest.raises(InvalidArgument, match="the object is published"):
                reservation.revoke()
            assert go.is_set(), "revoke() did not wait for the commit under way"
        finally:
            go.set()
            let_go.cancel()
        commit.join()
        assert commit.outcome == 1
        assert client.get("k") == b"x" * 4096
        with pytest.raises(InvalidArgument, match="the object is published"):
            reservation.revoke()  # (and again)


@CLUSTERS
def test_a_revoke_from_a_signal_handler_on_the_writing_thread_leaves_the_give_back_to_the_write(
    make_setup, monkeypatch, secure, mapping
):
    """A signal handler that interrupts the write and revokes runs on the writing thread:
    it cannot wait for that write, which resumes only once the handler returns. It returns
    at once, and the write gives the reservation back as it returns."""
    setup = make_setup(secure, mapping)
    reservation = setup.writer.reserve("victim/a", SIZE)
    a_address = address_of(reservation)
    placed_meanwhile = os.urandom(SIZE)
    in_handler: list[float] = []

    def handler() -> None:  # (what a signal handler would do, where the write was held)
        if in_handler:
            return  # (the put below, on this thread too, goes through)
        in_handler.append(0.0)
        started = time.monotonic()
        reservation.revoke()
        in_handler[0] = time.monotonic() - started
        put_in_parts(setup.other, "victim/b", placed_meanwhile)

    monkeypatch.setattr(setup.go, "wait", lambda timeout=None: handler() or True)
    write = Timed(WRITER, lambda: reservation.write(b"A" * SIZE))
    write.join()

    assert in_handler and in_handler[0] < 1.0, in_handler  # (no wait for its own write)
    assert setup.other.get("victim/b") == placed_meanwhile, "the revoked write landed in it"
    assert write.outcome is None
    placed_next = os.urandom(SIZE)  # (given back once the write returned)
    assert put_in_parts(setup.other, "victim/a", placed_next) == a_address
    assert setup.other.get("victim/a") == placed_next


def test_a_revoke_waits_for_a_stopped_writer_no_longer_than_its_deadline_and_sends_nothing(
    make_setup, monkeypatch
):
    """A writing thread that does not run (stopped in a debugger, say) past its write
    deadline and ``WRITE_STOP_MARGIN``: the revoke gives up waiting and raises TransferError
    without giving the space back (the master reclaims it once the writer's window is
    over); the write, let go past its deadline, fails."""
    monkeypatch.setattr(reservation_module, "WRITE_STOP_MARGIN", 0.5, raising=False)
    setup = make_setup(True, True)
    reservation = setup.writer.reserve("victim/a", SIZE)
    window_end = reservation._window_end
    write = Timed(WRITER, lambda: reservation.write(b"A" * SIZE))
    assert setup.here.wait(20), "the write never began"

    with pytest.raises(TransferError, match=r"had not returned 0\.5 s past its deadline"):
        reservation.revoke()
    assert window_end + 0.5 <= time.monotonic() < window_end + 3
    with pytest.raises(KVPoolError) as still_held:
        setup.other.reserve("victim/a", SIZE)
    print("victim/a while the master holds the reservation:", repr(still_held.value))
    setup.go.set()
    write.join()
    assert isinstance(write.outcome, KVPoolError), write.outcome
    with pytest.raises(InvalidArgument, match="revoked"):
        reservation.commit()


def test_a_revoke_interrupted_while_it_waits_for_a_write_leaves_it_for_a_revoke_again(
    make_setup, monkeypatch
):
    """KeyboardInterrupt as the revoke waits for another thread's write: nothing was sent,
    so the reservation is as it was, and a revoke again gives it back (rather than return
    quietly, the key held until the master's timeout)."""
    setup = make_setup(True, True)
    reservation = setup.writer.reserve("victim/a", SIZE)
    a_address = address_of(reservation)
    write = Timed(WRITER, lambda: reservation.write(b"A" * SIZE))
    assert setup.here.wait(20), "the write never began"

    real_wait = reservation._changed.wait
    interrupted: list[bool] = []

    def interrupted_once(timeout: float | None = None) -> bool:
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return real_wait(timeout)

    monkeypatch.setattr(reservation._changed, "wait", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        reservation.revoke()
    assert interrupted
    setup.go.set()
    write.join()
    assert write.outcome is None

    reservation.revoke()  # (sends its PutRevoke now)
    placed_next = os.urandom(SIZE)
    assert put_in_parts(setup.other, "victim/a", placed_next) == a_address
    assert setup.other.get("victim/a") == placed_next


def test_a_revoke_unanswered_keeps_writes_refused_and_a_revoke_again_gives_it_back(
    cluster_factory, monkeypatch
):
    """A PutRevoke that reached the master but whose answer was lost (MasterUnavailable):
    the master may have freed the space, so no write is taken any more; a revoke again
    sends it again, and the key is free."""
    cluster = cluster_factory(1, "64MiB")
    real = put_path.revoke
    lost: list[bool] = []

    def answer_lost_once(*args: Any, **kwargs: Any) -> Any:
        statuses = real(*args, **kwargs)
        if not lost:
            lost.append(True)
            raise MasterUnavailable("the answer was lost")
        return statuses

    monkeypatch.setattr(put_path, "revoke", answer_lost_once)
    credentials = cluster.client_credentials()
    with (
        Client(cluster.master_address, timeout=30, **credentials) as client,
        Client(cluster.master_address, timeout=30, **credentials) as other,
    ):
        reservation = client.reserve("k", 4096)
        reservation.write(b"x" * 4096)
        with pytest.raises(MasterUnavailable):
            reservation.revoke()
        with pytest.raises(InvalidArgument, match="No more writes of it are taken"):
            reservation.write(b"y" * 4096)
        reservation.revoke()  # (again: the master no longer holds it, quietly)
        with pytest.raises(InvalidArgument, match="revoked"):
            reservation.write(b"y" * 4096)
        assert put_in_parts(other, "k", b"z" * 4096) >= 0
        assert other.get("k") == b"z" * 4096


def test_a_close_that_waited_for_a_write_gives_the_lease_release_the_same_extension(
    make_setup, monkeypatch
):
    """The time ``close`` waits for a write under way does not count against its
    deadline for giving the read leases back either."""
    monkeypatch.setattr(client_module, "RELEASE_TIMEOUT", 0.5)
    setup = make_setup(True, True)
    setup.other.put("leased", b"l" * 4096)
    assert setup.writer.get("leased") == b"l" * 4096  # (a lease for close to give back)
    left: list[float] = []
    real = Client._release_leases

    def noted(self: Client, deadline: float) -> None:
        left.append(deadline - time.monotonic())
        real(self, deadline)

    monkeypatch.setattr(Client, "_release_leases", noted)
    reservation = setup.writer.reserve("victim/a", SIZE)
    write = Timed(WRITER, lambda: reservation.write(b"A" * SIZE))
    assert setup.here.wait(20), "the write never began"
    threading.Timer(HELD, setup.go.set).start()  # (longer than RELEASE_TIMEOUT)
    setup.writer.close()
    write.join()
    assert left and left[0] > 0, left
