"""The node's mapping socket: hands a segment's file to a client holding a map grant.

A client on this host that the master allows to map a segment (``security/mapping_grants.py``
says who) connects to this abstract unix socket, sends one request (mode and grant), and
receives the segment's file descriptor over ``SCM_RIGHTS``: opened read-only for ``r``, the
node's own read-write descriptor for ``w``. An NVMe segment's file is handed over for writes
only, as two descriptors: the node's direct-I/O one, then its plain one
(transport/shared_file.py; such a file is read over the checked stream). Nothing else is
ever sent, and the grant is checked first. The segment's file is mode 0600, so a client
under another user cannot reopen a read-only descriptor read-write through ``/proc``.

Bounded: one request per connection, a deadline on every receive and send, at most
``MAX_CONNECTIONS`` served at once (others are closed unanswered), answers short. After its
answer the node ends its side and drops what the peer still sends until the peer closes (for
``LINGER_S`` at most): a unix socket closed with a message unread fails the peer's receive,
even of the answer already queued for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable

from kvpool.common.log_throttle import LogThrottle
from kvpool.common.logging import get_logger
from kvpool.security import mapping_grants
from kvpool.security.mapping_grants import MapRefused
from kvpool.storage_node.checked_server import LINGER_S, NodeKeys, linger
from kvpool.storage_node.segment import Segment
from kvpool.transport.shared_memory import peer_credentials

log = get_logger(__name__)
#: Refusals are logged at a bounded rate: any local process may ask.
REFUSAL_LOGS = LogThrottle()

MAX_CONNECTIONS = 8
#: Deadline of each receive and send on a connection, seconds.
IO_TIMEOUT = 2.0


class MappingServer:
    """Serves ``segments`` (those that are shareable) to clients with map grants."""

    def __init__(
        self,
        segments: Iterable[Segment],
        keys: Callable[[], NodeKeys | None],
        tenant: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        shared = [s for s in segments if s.shareable and s.fd is not None]
        self._by_digest = {mapping_grants.segment_digest(s.segment_id): s for s in shared}
        self._keys = keys
        self.tenant = tenant
        self._clock = clock
        for segment in shared:
            assert segment.fd is not None
            os.fchmod(segment.fd, 0o600)
        #: The abstract socket's name (without the leading NUL), advertised in descriptors.
        self.name = f"kvpool-map-{uuid.uuid4().hex}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._listener.bind("\0" + self.name)
        self._listener.listen(32)
        self._lock = threading.Lock()
        self._serving = 0
        self._stopping = False
        self._acceptor = threading.Thread(target=self._accept_loop, name="kvpool-map", daemon=True)

    def start(self) -> None:
        self._acceptor.start()
        log.info("mapping socket listening", socket=self.name, tenant=self.tenant)

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._acceptor.join(IO_TIMEOUT)

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                if self._stopping:
                    return
                time.sleep(0.01)
                continue
            with self._lock:
                if self._serving >= MAX_CONNECTIONS:
                    connection.close()
                    continue
                self._serving += 1
            try:
                threading.Thread(
                    target=self._serve, args=(connection,), name="kvpool-map-serve", daemon=True
                ).start()
            except RuntimeError as error:  # (no thread to be had: a pids limit)
                with self._lock:
                    self._serving -= 1
                connection.close()
                log.error("mapping socket: cannot start a thread", error=str(error))
                time.sleep(0.1)

    def _serve(self, connection: socket.socket) -> None:
        answered = False
        try:
            connection.settimeout(IO_TIMEOUT)
            pid, uid = peer_credentials(connection)
            message = connection.recv(mapping_grants.REQUEST_SIZE + 1)
            try:
                writable, fds = self._decide(message)
            except MapRefused as refusal:
                reason = str(refusal).encode()[: mapping_grants.MAX_REASON]
                connection.send(bytes([mapping_grants.REFUSED]) + reason)
                answered = True
                suppressed = REFUSAL_LOGS.allow("map")
                if suppressed is not None:
                    log.warning(
                        "map request refused",
                        peer_pid=pid,
                        peer_uid=uid,
                        why=str(refusal),
                        suppressed=suppressed,
                    )
                return
            try:
                socket.send_fds(connection, [bytes([mapping_grants.HANDED_OVER])], fds)
                answered = True
            finally:
                for fd in fds:  # (the client holds its own now)
                    os.close(fd)
            log.info("segment handed over", peer_pid=pid, peer_uid=uid, writable=writable)
        except OSError:
            pass  # (the peer went, or missed a deadline)
        finally:
            if answered:  # (a message of the peer's left unread would reset the answer)
                linger(connection, LINGER_S)
            connection.close()
            with self._lock:
                self._serving -= 1

    def _decide(self, message: bytes) -> tuple[bool, list[int]]:
        """(writable, the descriptors to hand over) for a request; MapRefused otherwise."""
        writable, grant = mapping_grants.parse_request(message)
        segment = self._by_digest.get(mapping_grants.grant_segment(grant))
        if segment is None or segment.fd is None:
            raise MapRefused("the map grant names no segment this node shares")
        keys = self._keys()
        mapping_grants.check(
            keys.ring if keys is not None else None,
            grant,
            writable=writable,
            segment_id=segment.segment_id,
            size=segment.size,
            tenant=self.tenant,
            now_ms=int(self._clock() * 1000),
            min_term=keys.term if keys is not None else 0,
            max_skew_ms=keys.max_skew_ms if keys is not None else 0,
        )
        # Each client gets descriptions of its own (opened anew, not the node's): the locks
        # a writer holds through one go when that client exits (transport/writer_locks.py).
        if segment.direct is not None:
            if not writable:
                raise MapRefused("an NVMe segment is read over the checked stream, not mapped")
            direct = _reopened(segment.direct.fd)
            try:
                return True, [direct, _reopened(segment.fd)]
            except BaseException:
                os.close(direct)
                raise
        if writable:
            return True, [_reopened(segment.fd)]
        return False, [_reopened(segment.fd, os.O_RDONLY)]


def _reopened(fd: int, flags: int | None = None) -> int:
    """A new open file description of the node's file behind ``fd``: with ``flags``, else
    with ``fd``'s own (its access mode and ``O_DIRECT``)."""
    if flags is None:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_ACCMODE | os.O_DIRECT)
    return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC)
