"""A storage node carrying out the master's commands on its segments.

A Copy comes from another segment of this node (a demotion or promotion), or from another
node's segment (``source_segment`` set: re-replication, a drain), read over UCX by
``peer_copy.PeerCopier`` and checked against the object's checksum before it is recorded.

**Persists that wait together are recorded together.** The node runs its commands one after
another, in the order sent. Puts in flight from several writers each end in a Persist,
which syncs the object's bytes and then its index record: one after another, each writer
waits for every sync queued before its own. So Persists found waiting back to back (and
Prepares, which only allocate) run as one group (``execute_group``): a persistent segment
records all of a group's objects at once, one sync of each run of bytes and one of the index
for them all, and each command is answered as if it had run alone. A disk error of the group
(an OSError: its sync failed) fails every command of it, none recorded: a sync retried after a
failed writeback succeeds with the bytes never written (Linux reports the error once), so only
an object that failed the group before any sync (out of bounds, say) makes each run alone.

**A Forget waits for same-host writers.** A client on this host that writes a segment
itself (mapped DRAM, the NVMe file) holds a lock on each range while it may copy into it
(transport/writer_locks.py). A Forget of a range still locked (its writer stopped or slow
past its write window) is answered once the lock goes, within ``WRITER_GRACE``, else it
fails: the master keeps the space out of use and sends the Forget again later
(master/forget_retries.py), so no new object is placed where a late copy may still land.
A Copy into such a range (a promotion or a move placed there as its space was freed, which
no forget barrier holds back) fails the same way: the master drops its target and leaves
that range alone a while (master/state.py ``_move_done``, "held").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from kvpool.common.keys import shown_key
from kvpool.common.status import WRITER_HOLDS_RANGE, Tier
from kvpool.proto import master_pb2 as pb
from kvpool.security import capabilities as caps
from kvpool.storage_node import metrics
from kvpool.storage_node.checked_seals import Seals
from kvpool.storage_node.checked_writes import WrittenRanges
from kvpool.storage_node.object_index import Entry
from kvpool.storage_node.peer_copy import (
    PEER_COPY_FAILURES,
    PeerCopier,
    PeerCopyFailed,
    SourceCorrupt,
)
from kvpool.storage_node.segment import Segment, SyncFailed

#: How long a Forget waits for a same-host writer to finish its copy into the range before it
#: fails: a piece of a copy takes milliseconds, and the node's later commands wait behind it.
WRITER_GRACE = 0.1
#: How often a waiting Forget looks again.
WRITER_POLL = 0.01


class CommandExecutor:
    def __init__(
        self,
        segments: list[Segment],
        peers: PeerCopier | None = None,
        seals: Seals | None = None,
        written: WrittenRanges | None = None,
        term: Callable[[], int | None] = lambda: None,
    ) -> None:
        """``peers`` reads other nodes' objects (None: copies from other nodes fail);
        ``seals``: the checked stream's, told of every object recorded (its writer's grant
        ends then) and forgotten. ``written``: where the segments hold several tenants'
        objects, what the checked stream wrote under each grant: a Persist then records an
        object only when its writer wrote every byte of it (storage_node/checked_writes.py);
        None: the writer's word is taken. ``term``: the term whose grants the checked stream
        honours now (None: no keys yet): a Forget's word on when its grants end counts only
        for grants of that term."""
        self._segments = {s.segment_id: s for s in segments}
        self._term = term
        self._peers = peers
        self._seals = seals
        self._written = written

    def _grants_end(self, forget: pb.Forget) -> int:
        """When the Forget says its grants end, if they are of the term whose grants this
        node honours (else 0: its seals are kept as long as any grant may run). Equal, not
        at least: a Forget of an older master than the one whose keys the node holds does
        not know of the newer master's grants, which the node honours too."""
        if not forget.grants_end_ms or self._term() != forget.term:
            return 0
        return forget.grants_end_ms

    def quick(self, command: pb.NodeCommand) -> bool:
        """Whether a command only touches memory (no disk sync, no bulk copy): such commands
        run on the event loop, sparing a thread hand-off on every put's critical path."""
        kind = command.WhichOneof("kind")
        if kind in ("persist", "forget"):
            named = getattr(command, kind)
            segment = self._segments.get(named.segment_id)
            if segment is None or segment.persistent:
                return False
            # (one that may wait for a checked transfer to stop, or for a same-host writer's
            # copy, runs on a thread)
            if kind == "forget" and segment.writer_copying(_ranges(named.objects)):
                return False
            seals = self._seals
            return seals is None or not seals.busy(
                named.segment_id, (o.offset for o in named.objects)
            )
        return False

    def groups_with(self, first: pb.NodeCommand, later: pb.NodeCommand) -> bool:
        """Whether ``later``, waiting right behind ``first`` (or behind commands that group
        with it), may run in one group with it (``execute_group``): of the same grouped
        kind, neither one that runs on the spot (``quick``)."""
        kind = first.WhichOneof("kind")
        return (
            kind in GROUPED
            and later.WhichOneof("kind") == kind
            and not self.quick(first)
            and not self.quick(later)
        )

    def execute_group(self, commands: list[pb.NodeCommand]) -> list[pb.CommandResult]:
        """Runs commands that group (``groups_with``), answering each as ``execute`` would:
        a group of Persists records its objects per segment at once."""
        if len(commands) == 1 or commands[0].WhichOneof("kind") != "persist":
            return [self.execute(command) for command in commands]
        began = time.perf_counter()
        results = [pb.CommandResult(command_id=c.command_id, ok=True) for c in commands]
        by_segment: dict[str, list[tuple[pb.CommandResult, list[Entry]]]] = {}
        for command, result in zip(commands, results, strict=True):
            try:
                segment, entries = self._sealed_persist(command.persist)
            except Exception as error:
                _failed(result, error)
            else:
                by_segment.setdefault(segment.segment_id, []).append((result, entries))
        for segment_id, members in by_segment.items():
            segment = self._segments[segment_id]
            try:
                crcs = segment.record(
                    [e for _, entries in members for e in entries], writer_checksums=True
                )
            except SyncFailed as error:
                # The disk failed a sync (of the bytes or of the index): every member fails
                # as a Persist alone would, and none is retried.
                # Linux reports a failed writeback once per file and marks its pages clean,
                # so a retry's sync would succeed with the bytes never on the disk, and
                # record as durable objects lost at the next restart.
                for result, _ in members:
                    _failed(result, error)
                continue
            except Exception:
                # (one object made the group fail before any sync, out of the segment's
                # bounds, or bytes its disk cannot read: each is recorded, or fails, alone)
                crcs = None
            at = 0
            for result, entries in members:
                if crcs is None:
                    try:
                        result.crc32c.extend(segment.record(entries, writer_checksums=True))
                    except Exception as error:
                        _failed(result, error)
                        continue
                elif crcs:
                    result.crc32c.extend(crcs[at : at + len(entries)])
                    at += len(entries)
                metrics.persisted(segment, entries)
        seconds = time.perf_counter() - began
        for result in results:
            metrics.command_done("persist", result.ok, seconds)
        return results

    def _sealed_persist(self, persist: pb.Persist) -> tuple[Segment, list[Entry]]:
        """A Persist's segment and objects, once no write under their grants can land."""
        segment = self._segment(persist.segment_id)
        entries = _entries(persist.objects)
        if self._seals is not None and not self._seals.seal(  # (first: no write lands once
            segment.segment_id, [(e.offset, e.generation) for e in entries]
        ):  # it is recorded)
            raise TimeoutError("a write under a recorded object's grant did not stop")
        if self._written is not None:
            digest = caps.segment_digest(segment.segment_id)
            for e in entries:
                if segment.index.holds(e):
                    continue  # (recorded already: a Persist sent again, as delivery may)
                if not self._written.proven(digest, e.offset, e.generation, e.size):
                    raise PermissionError(
                        f"object {shown_key(e.key)} was not written whole under its put's "
                        "grant over the checked stream: not recorded (a segment that holds "
                        "several tenants' objects records only bytes its writer wrote)"
                    )
        return segment, entries

    def execute(self, command: pb.NodeCommand) -> pb.CommandResult:
        """Runs one command (blocking: persistent segments sync to disk)."""
        began = time.perf_counter()
        result = pb.CommandResult(command_id=command.command_id, ok=True)
        kind = command.WhichOneof("kind")
        try:
            if kind == "persist":
                segment, entries = self._sealed_persist(command.persist)
                result.crc32c.extend(segment.record(entries, writer_checksums=True))
                metrics.persisted(segment, entries)
            elif kind == "forget":
                segment = self._segment(command.forget.segment_id)
                forgotten = _entries(command.forget.objects)
                # (first: once the master has the answer, no byte of a grant for these moves,
                # so it reuses their space at once)
                if self._seals is not None and not self._seals.forget(
                    segment.segment_id,
                    [(e.offset, e.generation) for e in forgotten],
                    grants_end_ms=self._grants_end(command.forget),
                ):
                    raise TimeoutError("a transfer under a forgotten object's grant did not stop")
                _wait_for_writers(segment, _ranges(command.forget.objects))
                if self._written is not None:
                    digest = caps.segment_digest(segment.segment_id)
                    for e in forgotten:
                        self._written.forget(digest, e.offset, e.generation)
                segment.forget(forgotten)
            elif kind == "prepare":
                prepare = command.prepare
                self._segment(prepare.segment_id).prepare(prepare.offset, prepare.size)
            elif kind == "copy" and command.copy.HasField("source_segment"):
                copy = command.copy
                target = self._segment(copy.target_segment_id)
                _wait_for_writers(target, _ranges((copy.target,)))  # (see the docstring)
                result.crc32c.extend(self._copy_from_peer(copy, target))
                self._readable(target, copy.target)
            elif kind == "copy":
                copy = command.copy
                target = self._segment(copy.target_segment_id)
                _wait_for_writers(target, _ranges((copy.target,)))
                source = self._segment(copy.source_segment_id)
                result.crc32c.extend(
                    target.copy_from(source, copy.source.offset, _entry(copy.target))
                )
                self._readable(target, copy.target)
                metrics.copied(source.tier, target.tier, copy.target.size)
            else:
                raise ValueError(f"unknown command {kind!r}")
        except Exception as error:
            _failed(result, error)
        metrics.command_done(metrics.command_kind(kind), result.ok, time.perf_counter() - began)
        return result

    def _readable(self, target: Segment, copied: pb.StoredObject) -> None:
        """A copy recorded in ``target`` keeps its object's generation: its readers' grants
        are honoured where it landed, whatever seal lies there (checked_seals.py)."""
        if self._seals is not None:
            self._seals.recorded(target.segment_id, copied.offset, copied.generation)

    def _copy_from_peer(self, copy: pb.Copy, target: Segment) -> list[int]:
        """Reads an object of another node into ``target`` and records it there; returns
        the checksum of what it holds. Bytes that do not match the object's checksum (when
        the master knows it) are not recorded."""
        if self._peers is None:
            raise PeerCopyFailed("this node copies nothing from other nodes")
        source = copy.source_segment
        if source.segment_id != copy.source_segment_id or source.segment_id in self._segments:
            raise ValueError(f"segment {source.segment_id!r} is not another node's")
        entry = _entry(copy.target)
        if entry.offset < 0 or entry.offset + entry.size > target.size:
            raise ValueError(
                f"{entry.key!r} at {entry.offset}+{entry.size} lies outside segment "
                f"{target.segment_id} of {target.size} bytes"
            )
        if copy.source.size != entry.size:
            raise ValueError(f"source and target of {entry.key!r} differ in size")
        target.prepare(entry.offset, entry.size)  # a full disk fails here, not as a SIGBUS
        region = target.region
        self._peers.read(
            source,
            copy.source.offset,
            entry.size,
            region.address + entry.offset,
            region.memh,
            capability=copy.capability,
        )
        crc = target.checksum(entry.offset, entry.size)
        if copy.source.HasField("crc32c") and crc != copy.source.crc32c:
            PEER_COPY_FAILURES.inc()
            raise SourceCorrupt(
                f"the bytes of {entry.key!r} read from node {source.node_id} do not match its "
                f"checksum ({crc:#010x}, expected {copy.source.crc32c:#010x}): not recorded"
            )
        crcs = target.record([entry])
        metrics.copied(Tier(source.tier), target.tier, entry.size)
        return crcs or [crc]

    def _segment(self, segment_id: str) -> Segment:
        try:
            return self._segments[segment_id]
        except KeyError:
            raise KeyError(f"this node has no segment {segment_id!r}") from None


#: Kinds of commands that run in groups (``CommandExecutor.groups_with``).
GROUPED = ("persist", "prepare")
#: Commands in one group at most (a group's answers all wait for its last sync).
MAX_GROUP = 32


def _failed(result: pb.CommandResult, error: Exception) -> None:
    result.ok = False
    result.error = f"{type(error).__name__}: {error}"
    result.source_corrupt = isinstance(error, SourceCorrupt)


def _entry(message: pb.StoredObject) -> Entry:
    return _entries((message,))[0]


def _ranges(objects: Iterable[pb.StoredObject]) -> list[tuple[int, int]]:
    return [(o.offset, max(o.size, 1)) for o in objects]


def _wait_for_writers(segment: Segment, ranges: list[tuple[int, int]]) -> None:
    """Returns once no same-host writer holds a lock on ``ranges`` (see the module's
    docstring); raises TimeoutError when one still does after ``WRITER_GRACE``."""
    if not segment.writer_copying(ranges):
        return
    until = time.monotonic() + WRITER_GRACE
    while time.monotonic() < until:
        time.sleep(WRITER_POLL)
        if not segment.writer_copying(ranges):
            return
    raise TimeoutError(
        f"{WRITER_HOLDS_RANGE} a lock on the range (its process stopped or slow, mid-copy, "
        "past its write window): the space stays out of use until its copy ends or the "
        "process exits"
    )


def _entries(messages: Iterable[pb.StoredObject]) -> list[Entry]:
    """``_entry`` of each of a command's objects (one list comprehension: a Persist names
    every object of a put batch, on the put's path)."""
    return [
        _new_entry(
            Entry,
            (
                m.key,
                m.offset,
                m.size,
                m.generation,
                m.crc32c if m.HasField("crc32c") else None,
                m.replicas,
            ),
        )
        for m in messages
    ]


#: Makes an ``Entry`` from all its fields at once (``tuple.__new__``: calling the named
#: tuple runs its ``__new__``, Python code, once per object).
_new_entry = tuple.__new__
