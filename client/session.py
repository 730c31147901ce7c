"""What every client operation needs: the master link, the data path, and the client's identity.

A session belongs to the process that made it. Its connections (lane, gRPC, UCX, the
checked streams), its threads and its mappings are not the child's after ``fork()``: a call
in the child would go out on the parent's streams, and either process could read the other's
answer (another key's bytes). So the child's copy of every session is abandoned as the
child starts: its link and data path are replaced by stand-ins that raise ClientForked on
any use, and the parent's objects are kept, never closed or freed in the child (closing a
UCX endpoint or a gRPC channel there would tell the peer, and break the parent's).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn, cast

from kvpool.client.data_path import DataPath
from kvpool.client.heartbeat import Heartbeat
from kvpool.client.master_link import MasterLink
from kvpool.errors import ClientForked

if TYPE_CHECKING:
    from kvpool.client.reservation import Reservation

#: Open reservations (``Client.reserve``) a session remembers, for ``close`` to give back; the
#: oldest beyond it are left to run out at the master's reservation timeout.
RESERVATIONS_REMEMBERED = 4096


@dataclass(eq=False)
class Session:
    link: MasterLink
    data: DataPath
    timeout: float
    lease_ttl: float = 0.0
    client_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    host: str = field(default_factory=socket.gethostname)
    heartbeat: Heartbeat | None = None
    #: The process that made it (in a fork child: the parent, whose session this was).
    pid: int = field(default_factory=os.getpid)
    #: Whether this is a fork child's copy of its parent's session (see the module docstring).
    forked: bool = False
    #: Starts the heartbeat once, however many threads write first at the same time.
    _heartbeat_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: The reservations ``Client.reserve`` made that are neither committed nor given up yet,
    #: by (key, put id), oldest first: ``close`` gives them back. Weakly: a reservation its
    #: caller dropped is still given back, its buffer not held. (``put`` and ``put_many``
    #: never come here: their reservations end within the call.)
    _open: dict[tuple[str, int], weakref.ref[Reservation]] = field(default_factory=dict, repr=False)
    _open_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Set once ``take_reservations`` took them for the client's close: later ones are not
    #: held (``hold`` says so, and their caller gives them back itself).
    _taken: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        global _made
        _made += 1
        _LIVE.add(self)

    def check_process(self) -> None:
        """ClientForked in a fork child (the calls that do not reach the link check here)."""
        if self.forked:
            raise forked_error(self.pid)

    def writing(self) -> None:
        """Called before reserving: a client with reservations must heartbeat, or the master
        revokes them when it stops hearing from it."""
        if self.heartbeat is None:  # (as a rule it runs: no lock taken)
            self.check_process()
            with self._heartbeat_lock:
                if self.heartbeat is None:
                    heartbeat = Heartbeat(self.link, self.client_id)
                    heartbeat.start()
                    self.heartbeat = heartbeat

    def hold(self, reservation: Reservation) -> bool:
        """Notes an open reservation, for the client's close to give back; False (not
        noted) once the close took them."""
        ref = weakref.ref(reservation)
        with self._open_lock:
            if self._taken:
                return False
            held = self._open
            held[(reservation.key, reservation.put_id)] = ref
            if len(held) > RESERVATIONS_REMEMBERED:  # (the oldest: most likely over by now)
                del held[next(iter(held))]
        return True

    def let_go(self, reservation: Reservation) -> None:
        """Forgets a reservation that ended (committed, revoked, or over)."""
        with self._open_lock:
            self._open.pop((reservation.key, reservation.put_id), None)

    def take_reservations(self) -> list[tuple[tuple[str, int], Reservation | None]]:
        """The open reservations, forgotten here: (key, put id) and the Reservation (None
        where its caller dropped it)."""
        with self._open_lock:
            held, self._open, self._taken = self._open, {}, True
        return [(ids, ref()) for ids, ref in held.items()]

    def close(self) -> None:
        if self.forked:  # the parent's: left alone (see the module docstring)
            return
        with self._heartbeat_lock:
            heartbeat = self.heartbeat
        if heartbeat is not None:
            heartbeat.stop()
        self.data.close()
        self.link.close()

    def _abandon(self) -> None:
        """In a fork child: from now on every use raises ClientForked, and nothing of the
        parent's is touched (not even freed)."""
        if self.forked:
            return
        _INHERITED.append((self.link, self.data, self.heartbeat))
        self.forked = True
        self.link = cast("MasterLink", _Inherited(self.pid))
        self.data = cast("DataPath", _Inherited(self.pid))
        self.heartbeat = None
        self._heartbeat_lock = threading.Lock()  # (another thread may have held it at fork)
        self._open_lock = threading.Lock()  # (as the heartbeat's)
        self._open = {}
        self._taken = False


def forked_error(pid: int) -> ClientForked:
    return ClientForked(
        f"this Client was made in process {pid} before fork(): make a new Client in the child "
        f"(process {os.getpid()}); a client's connections cannot be shared across processes"
    )


class _Inherited:
    """Stands in for a fork child's copy of its parent's link or data path: any use of it
    raises ClientForked."""

    def __init__(self, pid: int) -> None:
        self._pid = pid

    def __getattr__(self, name: str) -> NoReturn:
        raise forked_error(self._pid)


def ucx_config_after_fork(config: dict[str, str] | None) -> dict[str, str] | None:
    """The UCX settings of a new client's data path: ``config``, and in a fork child of a
    process that had made a client, UCX's registration cache off (unless set either way).
    Making that cache installs a handler under UCX's memory-event lock, which a parent's
    thread may have held (read-locked, in an mmap) at the fork: the child would wait for it
    for ever. Registrations then cost a little more in that child; nothing else changes."""
    if not _forked_after_sessions or "UCX_RCACHE_ENABLE" in os.environ:
        return config
    if config is not None and "RCACHE_ENABLE" in config:
        return config
    return {**(config or {}), "RCACHE_ENABLE": "n"}


#: The sessions of this process (and, in a fork child, those it inherited).
_LIVE: weakref.WeakSet[Session] = weakref.WeakSet()
#: What a fork child inherited from its parent's sessions: held, so that freeing it never
#: runs a destructor that speaks on the parent's connections.
_INHERITED: list[object] = []
#: Sessions made in this process and the processes it was forked from.
_made = 0
#: Whether this process was forked from one that had made a session (``ucx_config_after_fork``).
_forked_after_sessions = False


def _after_fork_in_child() -> None:
    global _forked_after_sessions
    _forked_after_sessions = _made > 0
    for session in list(_LIVE):
        session._abandon()


os.register_at_fork(after_in_child=_after_fork_in_child)
