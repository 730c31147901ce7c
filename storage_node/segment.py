"""Segments a storage node exposes: memory it owns, registered with UCX for remote access.

Three kinds, one interface:

* DRAM: a memfd (lost with the process);
* DRAM in /dev/shm (``--dram-shm``): a shared-memory file that outlives the process, so a
  restarted node finds its objects again;
* NVMe (``--nvme PATH``): a file, memory-mapped, so clients read and write it directly with
  the same one-sided operations as DRAM; it may be far larger than RAM (the page cache does
  the rest). Its blocks are reserved on the disk when the node starts
  (storage_node/disk_reservation.py), unless ``--nvme-sparse`` leaves them to be allocated as
  objects are written.

The DRAM kinds are shared with clients on the same host (``shared_memory`` in the descriptor:
the client maps the file and copies with plain loads and stores, see
kvpool.transport.shared_memory): a memfd always, a /dev/shm file only when prefaulted (a
client's store into a hole of a full /dev/shm would kill it with SIGBUS). NVMe segments are
not shared (a page-cache miss or an I/O error would land in the client as a fault).

Persistent segments (the last two) keep a durable index beside the data. An object is
recorded there only after its bytes are durable (msync of its range, for NVMe), with a
CRC-32C the node computes itself; on reopening, an entry whose bytes no longer match is
dropped, never served.

Large writes into an NVMe segment over the checked stream do not go through the mapping:
their whole pages are written with direct I/O from a resident buffer, and their checksums
come from the parts as they passed (storage_node/direct_writes.py). Large reads of bytes
not in the page cache (on the checked stream, and promotions to DRAM) are direct reads;
the mapping serves cached reads, small writes, the partial pages at an object's ends, and
copies into this tier.

Recording an NVMe object is a wait for the disk, which the node makes as short and as rare
as it can: the writeback of the object's pages starts before the node reads them for the
checksum, so the disk writes while the CPU checksums; records that arrive while another is
being made durable share its successor's syncs (group commit, ``group_commit``); and once
recorded, the object's pages are unmapped from the node (they stay in the file and the page
cache): the kernel then treats them as any cached file page, which it drops under memory
pressure (or on ``posix_fadvise(DONTNEED)``) without first unmapping them from the node, and
the next reader maps them again.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import google_crc32c

from kvpool.common.file_writes import write_all
from kvpool.common.libc import LIBC
from kvpool.common.logging import get_logger
from kvpool.common.status import Tier
from kvpool.proto import master_pb2 as pb
from kvpool.storage_node import metrics
from kvpool.storage_node.direct_writes import (
    DirectReadRefused,
    DirectWriter,
    uncached_pieces,
)
from kvpool.storage_node.disk_reservation import DiskTooSmall, reserve, set_size
from kvpool.storage_node.group_commit import GroupCommit
from kvpool.storage_node.object_index import LOCK_SUFFIX, DurableIndex, Entry, MemoryIndex
from kvpool.storage_node.unreadable import UnreadablePlaces
from kvpool.transport import ucp, writer_locks
from kvpool.transport.shared_memory import MADV_POPULATE_READ, MADV_POPULATE_WRITE, boot_id

log = get_logger("kvpool.node.segment")

DATA_SUFFIX = ".data"
INDEX_SUFFIX = ".index"


class SyncFailed(OSError):
    """The disk failed a sync of a segment's bytes or index records (or an earlier one did:
    the segment records nothing more). Apart from other errors of a record (a read of the
    bytes that fails, before any sync), which concern one object only."""


@dataclass
class Segment:
    segment_id: str
    tier: Tier
    memory: mmap.mmap
    region: ucp.MemoryRegion
    index: MemoryIndex
    path: Path | None = None
    #: Entries dropped when the segment was reopened (torn records, corrupted bytes).
    dropped_on_open: list[str] = field(default_factory=list)
    #: Entries dropped when the segment was reopened because their bytes could not be read
    #: (a disk's I/O error), and the first such error.
    unreadable_on_open: list[str] = field(default_factory=list)
    read_error: str | None = None
    #: The backing file (memfd or data file), kept open: to allocate blocks ahead of writes,
    #: and for clients on this host to map (``shareable``).
    fd: int | None = None
    #: Clients on this host may map ``fd`` (DRAM that no store can fault on; see above), or,
    #: for an NVMe segment, write its file themselves (transport/shared_file.py).
    shareable: bool = False
    #: NVMe: the data file opened for writes that bypass the page cache, and the checksums
    #: of the parts written through it (storage_node/direct_writes.py); None: none.
    direct: DirectWriter | None = None
    #: Every block of the file is allocated on its disk (storage_node/disk_reservation.py):
    #: no write into it fails for space, and none needs a Prepare.
    space_reserved: bool = False
    #: Bumped after every change of the index, so that the metrics count again only the
    #: segments that changed (counting walks the whole index).
    changes: int = 0
    #: Where reads of it failed on the disk, for the master (storage_node/unreadable.py).
    unreadable: UnreadablePlaces = field(default_factory=UnreadablePlaces)
    #: A description of ``fd`` of the node's own, holding no lock, through which it asks
    #: whether same-host writers hold locks (``writer_copying``); opened on first use.
    lock_probe: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        #: Records that arrive while one is being made durable share the next commit.
        self._group_commit: GroupCommit[Entry] = GroupCommit(self._commit)
        #: The first sync of this segment's bytes that failed, if any. Linux reports a failed
        #: writeback once and marks its pages clean: any later sync of the file may succeed
        #: with bytes that never reached the disk, so from then on nothing more is recorded
        #: as durable here (until the node restarts, and its reopening checks every object).
        self._sync_failed: OSError | None = None

    @property
    def _nvme(self) -> bool:
        return self.tier is Tier.NVME

    @property
    def size(self) -> int:
        return self.region.length

    @property
    def persistent(self) -> bool:
        return self.index.durable

    def descriptor(self, node_id: str, host: str, worker_address: bytes) -> pb.Segment:
        """What the master hands to clients so they can reach this segment."""
        return pb.Segment(
            segment_id=self.segment_id,
            node_id=node_id,
            host=host,
            worker_address=worker_address,
            base_address=self.region.address,
            size=self.size,
            rkey=self.region.peer_rkey,
            # protoc's .pyi wants its own enum in an enum field; protobuf takes any int (the
            # wire values, which common.status's enums hold)
            tier=self.tier,  # type: ignore[arg-type]
            persistent=self.persistent,
            shared_memory=self._shared_memory(),
            space_reserved=self.space_reserved,
        )

    def _shared_memory(self) -> pb.SharedMemory | None:
        if not self.shareable or self.fd is None:
            return None
        stat = os.fstat(self.fd)
        return pb.SharedMemory(
            pid=os.getpid(),
            fd=self.fd,
            inode=stat.st_ino,
            device=stat.st_dev,
            boot_id=boot_id(),
            direct_io=self._nvme,
        )

    def record(self, entries: list[Entry], *, writer_checksums: bool = False) -> list[int]:
        """Records newly published objects; on a persistent segment, first makes their bytes
        durable and checksums them. Returns the checksums it computed (none for DRAM).
        ``writer_checksums``: the entries' checksums are their writers' (a Persist's), to be
        taken where the writer wrote the file itself (``_written_crc``)."""
        size = self.size
        for entry in entries:  # (the master is trusted; a bug of its must not go further)
            if entry.offset + entry.size > size:  # (both unsigned on the wire)
                self._check_bounds(entry)
        if not self.persistent:
            self._put(entries)
            self.changes += 1
            return []
        if self._sync_failed is not None:
            raise SyncFailed(
                errno.EIO,
                f"segment {self.segment_id} records nothing more: a sync of its bytes failed "
                f"earlier ({self._sync_failed.strerror or self._sync_failed}), after which its "
                "disk cannot be trusted to hold what a later sync says it does. Restart the "
                "node to check its objects, and its disk",
            )
        # One sync per run of objects that lie back to back (a batch is usually placed so):
        # each sync is a wait for the disk, and the file system's journal commit.
        if self._nvme and self.fd is not None:
            for start, end in _runs((e.offset, e.offset + e.size) for e in entries):
                _start_writeback(self.fd, start, end - start)  # the disk writes meanwhile
        durable = [
            Entry(
                e.key,
                e.offset,
                e.size,
                e.generation,
                self._written_crc(e, writer_checksums),
                e.replicas,
            )
            for e in entries
        ]
        self._group_commit(durable)
        return [e.crc32c for e in durable if e.crc32c is not None]

    def _put(self, entries: list[Entry]) -> list[Entry]:
        """Records ``entries`` in the index; returns those recorded, counting the others
        (an older generation of a key than the one held)."""
        kept = self.index.put(entries)
        if len(kept) < len(entries):
            metrics.STALE_RECORDS.inc(len(entries) - len(kept))
        return kept

    def _written_crc(self, entry: Entry, writer_checksums: bool) -> int:
        """The object's checksum: combined from those of the parts written directly when
        they tile it (its bytes are on the disk, not in memory); else, in a file that
        clients on this host write themselves, the writer's own (``entry.crc32c`` of a
        Persist: the put's; such a writer could write any bytes there anyway, and a
        checksum that does not match them drops the object at the next reopening, as a
        corruption); else read from its bytes."""
        if self.direct is not None:
            crc = self.direct.parts.take((entry.offset, entry.generation), entry.size)
            if crc is not None:
                metrics.RECORD_CHECKSUMS.labels("parts").inc()
                return crc
            if writer_checksums and self.shareable and entry.crc32c is not None:
                metrics.RECORD_CHECKSUMS.labels("writer").inc()
                return entry.crc32c
        metrics.RECORD_CHECKSUMS.labels("bytes").inc()
        return self.checksum(entry.offset, entry.size)

    def _commit(self, durable: list[Entry]) -> None:
        """Makes objects durable and records them: their bytes, then their index records
        (one commit at a time: ``_group_commit``)."""
        runs = _runs((e.offset, e.offset + e.size) for e in durable)
        if self._nvme:
            for start, end in runs:
                began = time.perf_counter()
                self._sync(start, end - start)
                metrics.synced(self, "data", time.perf_counter() - began)
        began = time.perf_counter()
        try:
            appended = self._put(durable)
        except SyncFailed:
            raise
        except OSError as error:  # (the index's append or its sync)
            raise SyncFailed(error.errno, error.strerror or str(error)) from error
        if appended:  # an empty append writes nothing
            metrics.synced(self, "index", time.perf_counter() - began)
        if self._nvme:
            for start, end in runs:
                self._unmap_pages(start, end)
        self.changes += 1

    def prepare(self, offset: int, size: int) -> None:
        """Allocates the file blocks of a reserved range before the client writes it: a
        write into a hole of a sparse file costs a block allocation per page fault, and a
        full device then fails here (ENOSPC) rather than as a SIGBUS in a writer. Nothing to
        do in a file whose blocks were all reserved."""
        if self.fd is not None and self.tier is Tier.NVME and not self.space_reserved:
            self._check_bounds(Entry("", offset, size, 0))
            os.posix_fallocate(self.fd, offset, size)

    def writer_copying(self, ranges: Iterable[tuple[int, int]]) -> bool:
        """Whether a client on this host that writes the segment itself (mapped DRAM, or the
        NVMe file) holds a lock on any byte of these (offset, size) ranges: it may still copy
        into them, and their space must not be reused yet (transport/writer_locks.py)."""
        if not self.shareable or self.fd is None:
            return False  # (no client writes it but through the node)
        if self.lock_probe is None:
            self.lock_probe = writer_locks.own_description(self.fd, writable=True)
            if self.lock_probe is None:
                return False
        probe = self.lock_probe
        return any(writer_locks.written_at(probe, offset, size) for offset, size in ranges)

    def forget(self, entries: list[Entry], *, durable_later: bool = False) -> None:
        """Drops recorded objects. ``durable_later``: an index log that cannot be written now
        takes their removal later (``DurableIndex.delete_now_or_later``) instead of raising."""
        began = time.perf_counter()
        if durable_later:
            self.index.delete_now_or_later(entries)
        else:
            self.index.delete(entries)
        if self.persistent and entries:  # a durable index syncs its log
            metrics.synced(self, "index", time.perf_counter() - began)
        if self._nvme:  # readers mapped them again; they are garbage now
            for entry in entries:
                if self.direct is not None:
                    self.direct.parts.drop((entry.offset, entry.generation))
                if entry.offset >= 0 and entry.offset + entry.size <= self.size:
                    self._unmap_pages(entry.offset, entry.offset + entry.size)
        self.changes += 1

    def copy_from(self, source: Segment, source_offset: int, target: Entry) -> list[int]:
        """Copies an object from another segment of this node into ``target`` and records
        it there (a demotion to NVMe or a promotion to DRAM).

        Into NVMe, the bytes are written to the file (``pwrite``), not stored through its
        mapping: a file cut short under the node (truncated by someone) or a disk that fails
        is then an OSError, a failed copy (the object stays where it was), where a store
        into the mapping would kill the node with SIGBUS. A file found shorter than the
        segment is refused outright (a write would lengthen it again, over a hole).

        From NVMe (a promotion), the bytes are read from the source's file (direct reads, or
        ``preadv`` when those decline: bytes cached, or every bounce buffer busy), never
        loaded through its mapping, for the same reason: a block its disk cannot read is an
        OSError there, but a SIGBUS through the mapping. Such a failed read notes the source
        object as unreadable, so that the master hears of it at the next heartbeat (its
        generation is the copy's: a copy keeps its object's)."""
        self._check_bounds(target)
        source._check_bounds(Entry(target.key, source_offset, target.size, target.generation))
        if self._nvme and self.fd is not None:
            self._check_file_whole()
        self.prepare(target.offset, target.size)  # a full disk fails here, not as a SIGBUS
        into = self.region.address + target.offset
        if self._nvme and self.fd is not None:
            if not source.read_direct(source_offset, into, target.size):
                # (the GIL released: a write that waits for the disk stalls this thread alone)
                view = ucp.view_of(source.region.address + source_offset, target.size)
                write_all(self.fd, view, target.offset)
        elif source._nvme and source.fd is not None:
            try:
                if not source.read_direct(source_offset, into, target.size):
                    end = target.offset + target.size
                    with memoryview(self.memory)[target.offset : end] as view:
                        source._read_file(source_offset, view)
            except OSError:
                source.unreadable.note(source_offset, target.generation)
                raise
        elif not source.read_direct(source_offset, into, target.size):
            # (DRAM to DRAM: nothing to wait for, nothing that faults)
            ctypes.memmove(into, source.region.address + source_offset, target.size)
        crcs = self.record([target])
        if crcs:
            return crcs
        return [self.checksum(target.offset, target.size)]

    def _check_file_whole(self) -> None:
        """OSError unless the segment's file still spans the whole segment."""
        assert self.fd is not None
        length = os.fstat(self.fd).st_size
        if length < self.size:
            raise OSError(
                errno.EIO,
                f"the data file of segment {self.segment_id} ({self.path}) is {length} bytes, "
                f"not {self.size}: it was cut short under the node, and nothing is written "
                "into it (restart the node to check what it still holds)",
            )

    def read_direct(self, offset: int, into: int, length: int) -> bool:
        """Copies ``length`` bytes at ``offset`` to the address ``into`` with direct reads,
        when this is an NVMe segment whose bytes there are not in the page cache (a read
        through the mapping would fault them in a page at a time); False, having copied
        nothing, otherwise. ``into`` may be another NVMe segment's mapping: the copy
        (``memmove``) releases the GIL, so a store that waits for its disk stalls this
        thread alone."""
        with uncached_pieces(self.direct, self.region.address, offset, length) as pieces:
            if pieces is None:
                return False
            at = into
            try:
                for piece in pieces:
                    size = len(piece)
                    ctypes.memmove(at, ucp.address_of(piece, writable=False)[0], size)
                    at += size
            except DirectReadRefused:
                return False
        return True

    def _read_file(self, offset: int, into: memoryview) -> None:
        """Fills ``into`` with the bytes at ``offset`` of the segment's file (``preadv``,
        through the page cache, the GIL released), never through the mapping: a block the
        disk cannot read is then an OSError, where a load from the mapping would kill the
        node with SIGBUS. A file that ends first (cut short under the node) is an OSError
        too (EIO)."""
        assert self.fd is not None
        at, length = 0, len(into)
        while at < length:
            got = os.preadv(self.fd, [into[at:]], offset + at)
            if got <= 0:
                raise OSError(
                    errno.EIO,
                    f"the data file of segment {self.segment_id} ends before "
                    f"{offset + length} (read up to {offset + at})",
                )
            at += got

    def checksum(self, offset: int, size: int) -> int:
        """The CRC-32C of the bytes at ``offset``. The checksum holds the GIL, so on NVMe the
        pages are faulted in first with it released (``_fault_in``): a read that waits for
        the disk then stalls this thread alone, not every thread of the node."""
        address = self.region.address + offset
        if self._nvme:
            _fault_in(address, size)
        return google_crc32c.value(ucp.view_of(address, size))

    def stored_objects(self) -> list[pb.StoredObject]:
        """What to report when mounting: everything recorded here."""
        objects = []
        unconfirmed = self.index.unconfirmed  # (a damaged index log: object_index)
        for entry in self.index.entries():
            message = pb.StoredObject(
                key=entry.key,
                offset=entry.offset,
                size=entry.size,
                generation=entry.generation,
                replicas=entry.replicas,  # so that a new master restores as many
                unconfirmed=entry.key in unconfirmed,
            )
            if entry.crc32c is not None:
                message.crc32c = entry.crc32c
            objects.append(message)
        return objects

    def close(self) -> None:
        if self.tier is Tier.NVME:
            _msync(self.region.address, self.size)
        self.region.close()
        self.memory.close()
        self.index.close()
        if self.direct is not None:
            self.direct.close()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.lock_probe is not None:
            os.close(self.lock_probe)
            self.lock_probe = None

    def _sync(self, offset: int, size: int) -> None:
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            _msync(self.region.address + start, max(offset + size - start, 1))
        except OSError as error:
            failed = SyncFailed(error.errno, error.strerror or str(error))
            if self._sync_failed is None:
                self._sync_failed = error
                log.error(
                    "a sync of an NVMe segment's bytes failed: it records nothing more until "
                    "the node restarts (restart it to check its objects; check the disk)",
                    segment=self.segment_id,
                    error=str(error),
                )
            raise failed from error

    def _unmap_pages(self, start: int, end: int) -> None:
        """Drops this process's mappings of the whole pages in [start, end), recorded and
        clean: their bytes stay in the file and the page cache, which may now let them go like
        any cached file page (mapped pages it keeps), and the next reader maps them again."""
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        last = end - end % mmap.PAGESIZE
        if last > first:
            self.memory.madvise(mmap.MADV_DONTNEED, first, last - first)

    def _check_bounds(self, entry: Entry) -> None:
        if entry.offset < 0 or entry.offset + entry.size > self.size:
            raise ValueError(
                f"{entry.key!r} at {entry.offset}+{entry.size} lies outside segment "
                f"{self.segment_id} of {self.size} bytes"
            )


def allocate_dram_segment(
    context: ucp.Context, node_id: str, size: int, *, prefault: bool = True
) -> Segment:
    """A memfd, mapped shared (so that clients on this host can map it too), in huge pages
    where the kernel allows.

    With ``prefault`` every page is faulted in now: on a virtual machine a first touch costs
    many times a plain copy, and it would otherwise land on the first put into each page.
    Shared either way: a memfd has no size limit of its own, so a client's first store into a
    page fails only where any allocation would (the memory limit).
    """
    if size <= 0:
        raise ValueError(f"a DRAM segment needs a positive size, got {size}")
    segment_id = f"{node_id}/dram-{uuid.uuid4().hex[:8]}"
    fd = os.memfd_create(f"kvpool-{segment_id.replace('/', '_')}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        memory = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    except OSError:
        os.close(fd)
        raise
    if hasattr(mmap, "MADV_HUGEPAGE"):
        memory.madvise(mmap.MADV_HUGEPAGE)
    if prefault:
        _prefault(memory)
    region = context.register(memory)
    return Segment(segment_id, Tier.DRAM, memory, region, MemoryIndex(), fd=fd, shareable=True)


def open_persistent_segment(
    context: ucp.Context,
    node_id: str,
    base: Path,
    size: int,
    tier: Tier,
    *,
    prefault: bool = False,
    sparse: bool = False,
) -> Segment:
    """Opens (or creates) a file-backed segment at ``base``.data with its index at
    ``base``.index. Reopening checks every recorded object against its bytes. An NVMe
    segment's blocks are all reserved on its disk (``reserve``), unless ``sparse``; a disk
    without room for them, or a segment larger than one file may be there (``FileTooLarge``),
    raises ``DiskTooSmall`` and leaves no file this call created behind: its data file (or one
    it found empty with no index), its index and the index's lock file (those of a segment
    there before stay as they were). A data file that holds bytes beside an index missing or
    empty is refused (``LogDamaged``, naming both): its index is lost, and a new one would lose
    its objects."""
    if size <= 0:
        raise ValueError(f"a segment needs a positive size, got {size}")
    data_path = base.with_name(base.name + DATA_SUFFIX)
    index_path = base.with_name(base.name + INDEX_SUFFIX)
    data_path.parent.mkdir(parents=True, exist_ok=True)
    kind = tier.name.lower()
    lock_path = index_path.with_name(index_path.name + LOCK_SUFFIX)
    new_files = [path for path in (index_path, lock_path) if not os.path.lexists(path)]
    # The index first, synced with its directory, then the data file: a data file with bytes
    # and no index is then a lost index, never a new segment, and is refused (``data_file``).
    index = DurableIndex(
        index_path,
        {"segment_id": f"{node_id}/{kind}-{uuid.uuid4().hex[:8]}", "size": size, "tier": kind},
        data_file=data_path,
    )
    if index.header.get("size") != size or index.header.get("tier") != kind:
        index.close()
        raise ValueError(
            f"{data_path} holds a {index.header.get('tier')} segment of "
            f"{index.header.get('size')} bytes, not {kind} of {size}: pass its original size, "
            f"or delete {data_path} and {index_path} to start afresh"
        )
    # (one found empty beside no index held nothing: a refusal removes it as one it made, not to
    # leave a file of the size it was given and no index, which the next start would refuse)
    created = not data_path.exists() or (index_path in new_files and data_path.stat().st_size == 0)
    fd = os.open(data_path, os.O_RDWR | os.O_CREAT, 0o600)
    reserved = False
    try:
        if os.fstat(fd).st_size != size:  # (sparse until reserved)
            set_size(fd, size, str(data_path.parent), **_size_option(tier))
        if tier is Tier.NVME and not sparse:
            reserved = reserve(fd, size, str(data_path.parent))
            if not reserved:
                log.warning(
                    "this file system cannot reserve the NVMe segment's blocks ahead: they "
                    "are allocated as objects are written, and puts fail once it is full",
                    path=str(data_path),
                )
        memory = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    except (OSError, DiskTooSmall):
        os.close(fd)
        # A later start with a smaller size begins afresh: the files this start made go, while
        # it still holds the segment (an index whose data file it made goes too: its header
        # names the size refused, and it records no object the new file holds).
        if created:
            data_path.unlink(missing_ok=True)
            new_files.append(index_path)
        for path in new_files:
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # (the refusal is what the caller hears of)
            index.close()
        raise
    if prefault:
        _prefault(memory)
    direct = DirectWriter.open(data_path) if tier is Tier.NVME else None
    segment = Segment(
        index.header["segment_id"],
        tier,
        memory,
        context.register(memory),
        index,
        base,
        fd=fd,
        # DRAM: a hole in a full tmpfs would be a SIGBUS to a client mapping it. NVMe: clients
        # write the file, never map it, and only where it takes direct I/O.
        shareable=(tier is Tier.DRAM and prefault) or direct is not None,
        direct=direct,
        space_reserved=reserved,
    )
    _verify(segment)
    return segment


def _size_option(tier: Tier) -> dict[str, str]:
    """How a refusal of a segment's size names it and the option that set it."""
    if tier is Tier.NVME:
        return {"what": "the NVMe segment", "option": "--nvme-size"}
    return {"what": "the DRAM segment", "option": "--dram"}


#: Bytes read at a time when a reopened segment's objects are checked.
VERIFY_PIECE = 4 << 20


def _verify(segment: Segment) -> None:
    """Drops every recorded object whose bytes no longer match its checksum
    (``dropped_on_open``), or cannot be read (``unreadable_on_open``, ``read_error``).

    The bytes are read with ``pread`` into memory, never through the mapping: a block the
    disk cannot read is an ``OSError`` there, but a SIGBUS through the mapping, which would
    kill the node at every start, silently, until someone deleted the whole segment. A read
    that comes short (a data file shorter than its index says) counts as unreadable too."""
    assert segment.fd is not None
    damaged: list[Entry] = []
    unreadable: list[Entry] = []
    for entry in segment.index.entries():
        if entry.crc32c is None or entry.offset < 0 or entry.offset + entry.size > segment.size:
            damaged.append(entry)
            continue
        try:
            crc = _file_checksum(segment.fd, entry.offset, entry.size)
        except OSError as error:
            unreadable.append(entry)
            if segment.read_error is None:
                segment.read_error = f"{entry.key!r} at {entry.offset}+{entry.size}: {error}"
            continue
        if crc != entry.crc32c:
            damaged.append(entry)
    segment.index.delete(damaged + unreadable)
    segment.dropped_on_open = [entry.key for entry in damaged]
    segment.unreadable_on_open = [entry.key for entry in unreadable]


def _file_checksum(fd: int, offset: int, size: int) -> int:
    """The CRC-32C of ``size`` bytes of the file at ``offset``, read with ``pread``; raises
    OSError where they cannot all be read."""
    crc, at, end = 0, offset, offset + size
    while at < end:
        piece = os.pread(fd, min(VERIFY_PIECE, end - at), at)
        if not piece:
            raise OSError(errno.EIO, f"the data file ends at {at}, before {end}")
        crc = google_crc32c.extend(crc, piece)
        at += len(piece)
    return crc


def _prefault(memory: mmap.mmap) -> None:
    try:
        memory.madvise(MADV_POPULATE_WRITE)
    except OSError:  # kernel older than 5.14: touch one byte per page instead
        for offset in range(0, len(memory), mmap.PAGESIZE):
            memory[offset] = 0


_sync_file_range = LIBC.sync_file_range
_sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
SYNC_FILE_RANGE_WRITE = 2


_libc_msync = LIBC.msync
_libc_msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MS_SYNC = 4
_madvise = LIBC.madvise
_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _msync(address: int, size: int) -> None:
    """``msync(MS_SYNC)`` of the mapped range at ``address`` (page aligned): its dirty pages
    written and made durable, as ``mmap.flush`` does, but with the GIL released (ctypes
    releases it around a foreign call; ``mmap.flush`` holds it). A sync waits for the disk,
    and a disk that hangs would otherwise stop every thread of the node, its heartbeats
    and its DRAM tier among them, until the master declared it dead."""
    if _libc_msync(address, size, MS_SYNC) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"msync: {os.strerror(error)}")


def _fault_in(address: int, size: int) -> None:
    """Faults the pages of a mapped file range in for reading, with the GIL released
    (``MADV_POPULATE_READ``), so that what reads them next through the mapping holding the
    GIL finds them in memory. A kernel without it (older than 5.14) leaves them to that
    read. Raises OSError where a page cannot be read (an I/O error): a read through the
    mapping would die of SIGBUS there."""
    start = address - address % mmap.PAGESIZE
    if _madvise(start, address + size - start, MADV_POPULATE_READ) != 0:
        error = ctypes.get_errno()
        if error not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(errno.EIO, f"the segment's bytes cannot be read: {os.strerror(error)}")


def _start_writeback(fd: int, offset: int, size: int) -> None:
    """Starts writing the dirty pages of a range to the disk, without waiting (the sync that
    follows waits, and makes them and their metadata durable: this only starts early)."""
    _sync_file_range(fd, offset, size, SYNC_FILE_RANGE_WRITE)


def _runs(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) ranges merged where they touch or overlap, in order of start."""
    runs: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if runs and start <= runs[-1][1]:
            runs[-1] = (runs[-1][0], max(runs[-1][1], end))
        else:
            runs.append((start, end))
    return runs
