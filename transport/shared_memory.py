"""Same-host access to a storage node's memory by mapping it, not moving it over UCX.

A node keeps each DRAM segment in a memfd (or a /dev/shm file) and advertises the file
descriptor, its inode and the host's boot id. A client of the same user, on the same host and
in the same pid namespace, opens the file through ``/proc/<pid>/fd/<fd>`` and maps it: a put
or a get is then one memcpy in the client, with neither the kernel's cross-process copy (CMA)
nor the node's CPU in the way. Anything else (another host, another container, another user)
keeps using UCX.

Lifetime: a mapping holds a pidfd of the node process. The data path checks it before every
use, and a reaper thread, blocked in poll() on all pidfds, lets go of the segment as soon as
the process exits, so a client never keeps a dead node's memory alive. The clients of one
process share one mapping per segment (``MAPPINGS``): it goes when the last lets go.

Pages: mapping a file costs nothing until a page is first touched, and a first touch per
4 KiB page costs far more than copying it (a first copy into a chunk runs much slower than
later ones). So once mapped, a background thread populates the page tables chunk by chunk
(``MADV_POPULATE_WRITE``, once per mapping), and a copy that reaches a chunk before it does
populates that chunk itself. Where the kernel backs shared memory with huge pages
(``shmem_enabled``), the mapping asks for them: far fewer entries.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpool.common.libc import LIBC
from kvpool.transport import writer_locks

if TYPE_CHECKING:
    from kvpool.transport.shared_file import SharedFile

#: madvise(MADV_POPULATE_READ/WRITE), Linux 5.14+ (Python 3.11's mmap module lacks the name).
MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23
MADV_HUGEPAGE = 14
#: struct ucred: pid, uid, gid.
_UCRED = struct.Struct("3i")
#: Deadline of a node's answer at its mapping socket, seconds.
HANDOVER_TIMEOUT = 2.0
#: Page tables are populated this much at a time, on first use.
POPULATE_CHUNK = 64 << 20

LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MAP_FAILED = ctypes.c_void_p(-1).value


class MappingRefused(OSError):
    """The segment cannot be mapped from this process (another host, user, or pid namespace;
    a node that exited; a file that is not the one advertised)."""


@functools.cache
def boot_id() -> str:
    """Names this host's current boot: equal in two processes only on the same kernel."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return file.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """A node's segment as a descriptor names it: the node process and its descriptor for
    the file, the inode and device that say it is still that file, the segment's size and
    where the node has it; and, on a secure cluster, the node's mapping socket and the
    master's grant to show there."""

    pid: int
    fd: int
    inode: int
    device: int
    size: int
    remote_base: int
    socket_name: str = ""
    grant: bytes = b""
    #: A file on a disk, written with direct I/O and never mapped (transport/shared_file.py).
    direct_io: bool = False

    def origin(self, writable: bool) -> tuple[int, ...]:
        """What a mapping of it is known by (the grant, renewed now and then, is not)."""
        return (self.pid, self.fd, self.inode, self.device, self.size, self.remote_base,
                int(writable))  # fmt: skip


class HeldSegment:
    """What this process holds of a node's segment (a mapping, or its file open: see
    transport/shared_file.py), kept by ``Mappings``: ``remote_base`` is where the node has
    the segment, so a descriptor's remote address translates by offset; ``pidfd`` tells
    when the node process exits."""

    def __init__(
        self,
        size: int,
        remote_base: int,
        pidfd: int,
        origin: tuple[int, ...],
        lock_fd: int | None = None,
    ) -> None:
        self.size = size
        self.remote_base = remote_base
        self.pidfd = pidfd
        #: A description of the node's file of this process's own, through which a writer
        #: holds locks on the ranges it copies into (transport/writer_locks.py); None: none
        #: (read-only, or the file could not be opened again).
        self.lock_fd = lock_fd
        #: What it holds: (pid, fd, inode, device, size, remote_base, writable) of the node's
        #: segment.
        self.origin = origin
        #: Clients holding it (see Mappings).
        self.users = 0
        self.closed = False

    def alive(self) -> bool:
        """False once the node process has exited (its pidfd turns readable)."""
        if self.closed:
            return False
        poller = select.poll()  # not select(): a busy process may hold fds past 1024
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    def offset_of(self, remote_address: int, length: int) -> int:
        """Where ``remote_address`` lies in the segment; ValueError for a range outside it
        (a descriptor's addresses come from the master: checked, never trusted)."""
        offset = remote_address - self.remote_base
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"range {remote_address:#x}+{length} lies outside the segment")
        return offset

    def close(self) -> None:
        raise NotImplementedError


class MappedSegment(HeldSegment):
    """A node's segment mapped into this process at ``address``."""

    def __init__(
        self,
        address: int,
        size: int,
        remote_base: int,
        pidfd: int,
        origin: tuple[int, ...] = (),
        writable: bool = True,
        lock_fd: int | None = None,
    ) -> None:
        super().__init__(size, remote_base, pidfd, origin, lock_fd)
        self.address = address
        #: False: mapped read-only (gets only; a store into it would fault).
        self.writable = writable
        self._populated = bytearray((size + POPULATE_CHUNK - 1) // POPULATE_CHUNK)
        self._stop_populating = threading.Event()
        self._populator = threading.Thread(
            target=self._populate_all, name="kvpool-populate", daemon=True
        )
        self._populator.start()

    @classmethod
    def open(
        cls, file: SegmentFile, *, writable: bool = True, timeout: float = HANDOVER_TIMEOUT
    ) -> MappedSegment:
        """Maps the node's file, read-write or read-only; MappingRefused when this process
        cannot reach it. With ``file.socket_name`` the node hands the file over there under
        ``file.grant`` (storage_node/mapping_server.py); else it is opened as
        ``/proc/<pid>/fd/<fd>`` (a node of this process's user that lets it). A handover
        takes at most ``timeout`` seconds."""
        size = file.size
        flags = os.O_RDWR if writable else os.O_RDONLY
        pidfd, [opened] = open_node_file(file, [flags], writable=writable, timeout=timeout)
        lock_fd = None
        if writable:
            lock_fd = writer_locks.own_description(opened, handed_over=bool(file.socket_name))
        try:
            protection = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            address = LIBC.mmap(None, size, protection, mmap.MAP_SHARED, opened, 0)
            if address in (None, MAP_FAILED):
                errno = ctypes.get_errno()
                raise MappingRefused(errno, f"mmap of {size} bytes: {os.strerror(errno)}")
            LIBC.madvise(address, size, MADV_HUGEPAGE)  # best effort, see above
        except BaseException:
            os.close(pidfd)
            if lock_fd is not None:
                os.close(lock_fd)
            raise
        finally:
            os.close(opened)  # the mapping keeps the file
        origin = file.origin(writable)
        return cls(address, size, file.remote_base, pidfd, origin, writable, lock_fd)

    def local_address(self, remote_address: int, length: int) -> int:
        """Where ``remote_address`` lies in this process, its pages ready to copy."""
        offset = self.offset_of(remote_address, length)
        if length:
            first, last = offset // POPULATE_CHUNK, (offset + length - 1) // POPULATE_CHUNK
            for chunk in range(first, last + 1):
                if not self._populated[chunk]:
                    self._populate(chunk)
        return self.address + offset

    def close(self) -> None:
        """Unmaps, once the background populator has let go of the range (it stops between
        chunks: at most the rest of one chunk's population)."""
        if not self.closed:
            self.closed = True
            self._stop_populating.set()
            if self._populator is not threading.current_thread():
                self._populator.join()
            LIBC.munmap(self.address, self.size)
            os.close(self.pidfd)
            if self.lock_fd is not None:
                os.close(self.lock_fd)

    def _populate_all(self) -> None:
        for chunk in range(len(self._populated)):
            if self._stop_populating.is_set():
                return
            if not self._populated[chunk]:
                self._populate(chunk)

    def _populate(self, chunk: int) -> None:
        start = chunk * POPULATE_CHUNK
        length = min(POPULATE_CHUNK, self.size - start)
        # Best effort: where the kernel refuses (before 5.14), pages fault in on first touch.
        advice = MADV_POPULATE_WRITE if self.writable else MADV_POPULATE_READ
        LIBC.madvise(self.address + start, length, advice)
        self._populated[chunk] = 1


def open_node_file(
    file: SegmentFile, flags: Sequence[int], *, writable: bool, timeout: float = HANDOVER_TIMEOUT
) -> tuple[int, list[int]]:
    """A pidfd of the node process (first: its pid cannot be reused while this is held) and
    the segment's file as ``len(flags)`` descriptors: handed over by the node at its mapping
    socket (``file.socket_name``) under ``file.grant``, for writes or reads, or else opened
    as ``/proc/<pid>/fd/<fd>`` with each of ``flags`` (a node of this process's user that
    lets it); each checked to be the advertised file. MappingRefused when this process
    cannot reach it, and then nothing stays open."""
    pid = file.pid
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as error:
        raise MappingRefused(error.errno, f"node process {pid}: {error.strerror}") from None
    opened: list[int] = []
    try:
        if file.socket_name:
            opened = handed_over(
                file.socket_name, pid, writable, file.grant, count=len(flags), timeout=timeout
            )
            where = f"the file node process {pid} handed over"
        else:
            opened = [_open_proc_fd(pid, file.fd, flag) for flag in flags]
            where = f"/proc/{pid}/fd/{file.fd}"
        for fd in opened:
            stat = os.fstat(fd)
            if (stat.st_ino, stat.st_dev) != (file.inode, file.device) or stat.st_size < file.size:
                raise MappingRefused(0, f"{where} is not the advertised segment")
    except BaseException:
        for fd in opened:
            os.close(fd)
        os.close(pidfd)
        raise
    return pidfd, opened


def _open_proc_fd(pid: int, fd: int, flags: int) -> int:
    try:
        return os.open(f"/proc/{pid}/fd/{fd}", flags | os.O_CLOEXEC)
    except OSError as error:
        raise MappingRefused(error.errno, f"/proc/{pid}/fd/{fd}: {error.strerror}") from None


def peer_credentials(connection: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket, as the kernel saw it
    connect (``SO_PEERCRED``)."""
    pid, uid, _ = _UCRED.unpack(
        connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return pid, uid


def handed_over(
    socket_name: str,
    pid: int,
    writable: bool,
    grant: bytes,
    *,
    count: int,
    timeout: float = HANDOVER_TIMEOUT,
) -> list[int]:
    """The ``count`` descriptors of a segment's file the node process ``pid`` hands over at
    its mapping socket (abstract ``socket_name``) for ``grant``, checked to come from that
    very process, within ``timeout`` seconds; MappingRefused otherwise."""
    from kvpool.security import mapping_grants

    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        deadline = time.monotonic() + timeout
        connection.settimeout(timeout)
        connection.connect("\0" + socket_name)
        peer_pid, _ = peer_credentials(connection)
        if peer_pid != pid:
            raise MappingRefused(
                0,
                f"mapping socket {socket_name} is served by process {peer_pid}, not the "
                f"node process {pid} the master named",
            )
        connection.send(mapping_grants.request(writable, grant))
        connection.settimeout(max(deadline - time.monotonic(), 0.001))  # (the whole exchange)
        message, fds, _, _ = socket.recv_fds(connection, 1 + mapping_grants.MAX_REASON, count)
    except MappingRefused:
        raise  # (an OSError too: not to be wrapped again below)
    except OSError as error:
        raise MappingRefused(error.errno or 0, f"mapping socket {socket_name}: {error}") from None
    finally:
        connection.close()
    if message[:1] != bytes([mapping_grants.HANDED_OVER]) or len(fds) != count:
        for fd in fds:
            os.close(fd)
        reason = message[1:].decode(errors="replace") or "no answer"
        raise MappingRefused(0, f"node process {pid} refused to hand over its segment: {reason}")
    return fds


class Mappings:
    """The segments this process has mapped, shared by every client in it: one mapping (and
    one set of page tables) per node segment however many clients use it.

    A client ``acquire``s a segment before its first copy and ``release``s it when done with
    it (its node exited, a new descriptor came, or the client closed); the mapping goes when
    its last client releases it. A client copies only between its own acquire and release,
    so no copy is running when the memory is unmapped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[tuple[int, ...], MappedSegment | SharedFile] = {}

    def acquire(
        self, file: SegmentFile, *, writable: bool = True, timeout: float = HANDOVER_TIMEOUT
    ) -> MappedSegment | SharedFile:
        """The segment's mapping (read-write or read-only), made now unless a live one
        exists; MappingRefused when this process cannot map it (see ``MappedSegment.open``).
        A ``direct_io`` file is not mapped but held open for writes (``SharedFile``). It is
        made outside the lock, which the process's other clients share: a handover waits on
        the node's process (up to ``timeout``)."""
        from kvpool.transport.shared_file import SharedFile

        origin = file.origin(writable)
        with self._lock:
            mapped = self._current.get(origin)
            if mapped is not None and mapped.alive():
                mapped.users += 1
                return mapped
        if file.direct_io:
            if not writable:
                raise MappingRefused(0, "a file on a disk is read over the network")
            opened: MappedSegment | SharedFile = SharedFile.open(file, timeout=timeout)
        else:
            opened = MappedSegment.open(file, writable=writable, timeout=timeout)
        with self._lock:
            mapped = self._current.get(origin)
            spare = None
            if mapped is None or not mapped.alive():  # (a dead one stays with its users)
                mapped = self._current[origin] = opened
            else:
                spare = opened  # another client here made one meanwhile
            mapped.users += 1
        if spare is not None:
            spare.close()
        return mapped

    def release(self, mapped: MappedSegment | SharedFile) -> None:
        with self._lock:
            mapped.users -= 1
            if mapped.users > 0:
                return
            if self._current.get(mapped.origin) is mapped:
                del self._current[mapped.origin]
        mapped.close()

    def after_fork_in_child(self) -> None:
        """A fork child's clients map afresh: another thread of the parent may have held the
        lock at the fork (it would never be let go here), and the parent's mappings belong
        to its clients, which the child may not use (``ClientForked``). Those stay mapped in
        the child, unused, until it exits: unmapping them could pull memory from under a
        view the child still holds. Their lock descriptions (``HeldSegment.lock_fd``) are
        closed in the child: the child's copy would keep a lock the parent holds at the
        fork alive after the parent is gone (transport/writer_locks.py)."""
        for held in self._current.values():
            if held.lock_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(held.lock_fd)
                held.lock_fd = None
        self._lock = threading.Lock()
        self._current = {}


#: This process's mappings (clients share them).
MAPPINGS = Mappings()
os.register_at_fork(after_in_child=MAPPINGS.after_fork_in_child)


class Reaper:
    """Unmaps segments whose node process exited, as soon as it exits.

    One daemon thread sleeps in poll() on the pidfds of every live mapping (and an eventfd
    that says the set changed). ``on_exit`` is called with the segment id; the caller
    unmaps under its own lock, since copies may be running.
    """

    def __init__(self, on_exit: Callable[[str], None]) -> None:
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._watched: dict[int, str] = {}  # pidfd -> segment id
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._stopped = False
        self._thread: threading.Thread | None = None

    def watch(self, pidfd: int, segment_id: str) -> None:
        with self._lock:
            self._watched[pidfd] = segment_id
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kvpool-mapping-reaper", daemon=True
                )
                self._thread.start()
        os.eventfd_write(self._wake, 1)

    def unwatch(self, pidfd: int) -> None:
        with self._lock:
            self._watched.pop(pidfd, None)
        os.eventfd_write(self._wake, 1)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            thread = self._thread
        os.eventfd_write(self._wake, 1)
        if thread is not None:
            thread.join(timeout=2.0)
        os.close(self._wake)

    def _run(self) -> None:
        while True:
            poller = select.poll()
            poller.register(self._wake, select.POLLIN)
            with self._lock:
                if self._stopped:
                    return
                for pidfd in self._watched:
                    poller.register(pidfd, select.POLLIN)
            for fd, _ in poller.poll():
                if fd == self._wake:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
                    continue
                with self._lock:
                    segment_id = self._watched.pop(fd, None)
                if segment_id is not None:
                    self._on_exit(segment_id)
