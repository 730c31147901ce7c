"""The read side: locate at the master (granting leases), then copy over UCX.

Replicas on this host are tried first, those on nodes this client could not reach lately
last; a failed transfer falls over to the next replica. While other replicas remain, an
attempt gets only its share of the time left (``attempt_deadline``), so that a node that
silently stopped answering (a partition, a one-way cut, a stopped process: its packets are
dropped, nothing fails, the transfer just waits) costs that share, not the whole call: the
next replica is read in the time left, and the silent node is remembered as unreachable for a
few seconds (client/unreachable_nodes.py), so that the next reads try it last and puts avoid
it. When no replica's node can be reached
(a node died and the master has not declared it dead yet: it still lists the object), the
error names the nodes and says when the master will notice. The
lease is timed on our own monotonic clock from before the request was sent, so our estimate
can only end early: bytes whose transfer may have outlived the lease are discarded
(LeaseExpired) rather than returned, since their space may have been reused meanwhile.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from kvpool.client import batch_split
from kvpool.client.cancellation import checkpoint
from kvpool.client.checksum import crc32c_at, crc32c_of_pieces
from kvpool.client.data_path import Failure, Transfer
from kvpool.client.outcomes import error_for
from kvpool.client.session import Session
from kvpool.common.status import KeyStatus
from kvpool.errors import (
    ChecksumMismatch,
    KVPoolError,
    LeaseExpired,
    NotVerifiable,
    TransferError,
)
from kvpool.proto import master_pb2 as pb

#: (address, size) to copy each located object into, by batch position.
Targets = Mapping[int, tuple[int, int]]
#: Where a read copies less than a whole object, or not into one buffer (ranged and
#: scattered reads), by batch position: (offset in the object, address, length) of each
#: piece, in order. Its target then says only how many bytes the pieces hold in all (and,
#: for a verified read, nothing else is asked of it).
Pieces = Mapping[int, Sequence[tuple[int, int, int]]]

#: Seconds an attempt on a replica gets at least, when the time left allows, whatever its
#: share: a healthy node must be able to take a connection (a lost SYN is sent again after a
#: second), set up a UCX endpoint and answer while busy with other clients before it is
#: given up on as silent.
MIN_ATTEMPT = 1.0
#: Bytes per second any healthy node and link deliver to one call, at the least, however
#: shared (a 1 GbE link shared by fifty readers; a slow disk): an attempt gets
#: ``MIN_ATTEMPT`` more than its bytes take at this rate (when the time left allows). Set
#: low on purpose: a share that cuts a healthy transfer short fails a read that would have
#: succeeded, and marks a healthy node; one too long only delays falling over. (A reader
#: cannot tell a slow node from a silent one by the time alone: reads of many bytes get the
#: whole budget, as before shares.)
SLOW_RATE = 2 << 20


def locate(
    session: Session,
    keys: Sequence[str],
    valid: Sequence[int],
    results: list[Any],
    deadline: float,
    unanswered: list[int] | None = None,
) -> tuple[dict[int, pb.ObjectLocation], float]:
    """GetReplicas for ``keys[i] for i in valid``; fills errors into ``results``.

    Returns the located objects by batch position and when their lease ends (monotonic).
    More keys than one master call takes go in parts within ``deadline``; a part after the
    first that fails gives its error to its keys (``batch_split``), the others are read.
    ``unanswered`` (when given) gets the positions whose master call failed: their answer
    may have been lost after the master leased them.
    """
    located: dict[int, pb.ObjectLocation] = {}
    if not valid:
        return located, 0.0
    lease_deadline = float("inf")
    ok, quota = KeyStatus.OK, KeyStatus.QUOTA_EXCEEDED  # (read off their class once)

    def locate_part(positions: Sequence[int]) -> bool:
        nonlocal lease_deadline
        sent_at = time.monotonic()
        try:
            response = session.link.call(
                "GetReplicas",
                pb.GetReplicasRequest(
                    client_id=session.client_id,
                    keys=[keys[i] for i in positions],
                    lease_ms=int(session.lease_ttl * 1000),
                    mapped_segments=session.data.mapped_for(writing=False),
                ),
                deadline,
            )
        except BaseException:
            if unanswered is not None:
                unanswered.extend(positions)
            raise
        lease_deadline = min(lease_deadline, sent_at + response.lease_ms / 1000.0)
        session.data.learn(response.segments)
        for i, location in zip(positions, response.objects, strict=True):
            if location.status == ok:
                located[i] = location
            else:  # (a refused lease says the master's figures of the tenant's quota)
                why = response.quota_refusal if location.status == quota else ""
                results[i] = error_for(location.status, keys[i], why)
        return True

    # (a part failed after the first: the parts before it are leased, so they are read, and
    # their leases given back)
    batch_split.answer_each_part(valid, keys.__getitem__, results, locate_part)
    return located, lease_deadline


def read(
    session: Session,
    keys: Sequence[str],
    located: MutableMapping[int, pb.ObjectLocation],
    targets: Targets,
    results: list[Any],
    deadline: float,
    lease_deadline: float,
    pieces: Pieces | None = None,
    *,
    again: bool = True,
) -> None:
    """Copies each located object into its target (or, for those in ``pieces``, the pieces
    of it named there); errors replace results[i].

    An object whose every replica tried was cut off (``Failure.interrupted``: removed or
    moved away while it was read, a demotion to NVMe say) is located again once and read
    from where it is now (``again``); ``located`` then holds its new location."""
    before = {i: results[i] for i in targets}  # (what a read that goes through leaves)
    interrupted = _read_once(
        session, keys, located, targets, results, deadline, lease_deadline, pieces
    )
    if time.monotonic() > lease_deadline:
        for i in targets:
            if i not in interrupted and not isinstance(results[i], KVPoolError):
                results[i] = _lease_expired(keys[i])
    if not interrupted or not again or time.monotonic() >= deadline:
        return
    order = sorted(interrupted)
    sizes = {i: located[i].size for i in order}
    now_at, new_lease_deadline = locate(session, keys, order, results, deadline)
    again_targets = {}
    for i, location in now_at.items():
        if location.size != sizes[i]:  # (removed, then put again: another object)
            results[i] = TransferError(
                f"{keys[i]!r} was removed and put again while it was read: read it again",
                key=keys[i],
            )
            continue
        located[i] = location
        results[i] = before[i]
        again_targets[i] = targets[i]
    read(
        session,
        keys,
        located,
        again_targets,
        results,
        deadline,
        new_lease_deadline,
        pieces,
        again=False,
    )


def attempt_deadline(
    now: float, deadline: float, lease_deadline: float, replicas_left: int, nbytes: int
) -> float:
    """When an attempt to read ``nbytes`` from one replica, with ``replicas_left`` replicas
    (this one included) still to try, must end (all monotonic seconds).

    The last replica gets all the time left; any other one its share of it,
    ``(end - now) / replicas_left``, so that a node that never answers leaves time for the
    others. No attempt runs past the lease (``end`` is the earlier of ``deadline`` and
    ``lease_deadline``): bytes read after it would be discarded anyway.

    A share is never below ``MIN_ATTEMPT`` plus the time ``nbytes`` take at ``SLOW_RATE``
    (when that much is left; else the attempt gets all the time left). Why a floor: a share
    that cuts a healthy transfer short is worse than no share at all, since the next replica
    then gets less time still for the same bytes, and the healthy node is avoided for a while.
    A small read needs milliseconds, so its share is just the time split; a large one (a
    batch of many megabytes) must keep enough to move its bytes over a slow but healthy link,
    and when the budget cannot give it that and still leave time for another replica, it gets
    the whole budget, as if it were the last (a silent node then costs the whole call, but a
    healthy one is never cut off).
    """
    end = min(deadline, lease_deadline)
    left = end - now
    if replicas_left <= 1 or left <= 0:
        return end
    floor = MIN_ATTEMPT + nbytes / SLOW_RATE
    return now + min(left, max(left / replicas_left, floor))


def _read_once(
    session: Session,
    keys: Sequence[str],
    located: Mapping[int, pb.ObjectLocation],
    targets: Targets,
    results: list[Any],
    deadline: float,
    lease_deadline: float,
    pieces: Pieces | None,
) -> set[int]:
    """Reads each object from its replicas in turn until one answers; returns the objects
    that failed on every replica tried, at least once cut off.

    Each attempt is one run of every object pending (none waits on another's share), each
    from its next replica, until the deadline ``attempt_deadline`` gives the run: a share of
    the time left while an object of it has another replica left, all of it once every one
    is on its last. A transfer cut off by its share marks its node unreachable for a while
    where the node took it and did not answer, and falls over to the next replica; one on its
    last replica, cut off by the share of the others (a batch whose objects are not all on as
    many replicas), is run again from there with the time left, where that is enough for its
    bytes (``_time_for``); its node is not marked. Each run moves every object
    with another replica on (or out), so a call makes as many runs at most as an object of
    it has replicas, plus one."""
    data = session.data
    candidates = {i: by_nearness(session, located[i].replicas) for i in targets}
    failures: dict[int, list[Failure]] = {}  # (made for the objects that fail only)
    pending = [i for i in targets if targets[i][1] > 0]
    at = dict.fromkeys(pending, 0)  # (the replica each object is read from, of its candidates)
    while pending:
        checkpoint()  # (a cancelled call writes nothing more into the caller's buffers)
        replicas_left = min(
            (n for i in pending if (n := len(candidates[i]) - at[i]) > 1), default=1
        )
        transfers = _transfers(pending, candidates, at, targets, pieces)
        started = time.monotonic()
        until = attempt_deadline(
            started, deadline, lease_deadline, replicas_left, sum(t.length for t in transfers)
        )
        errors = data.run(transfers, is_get=True, deadline=until)
        if pieces:
            errors = _by_object(pending, pieces, errors)
        retry = []
        for i, error in zip(pending, errors, strict=True):
            if error is None:
                continue
            if error.timed_out and until >= lease_deadline:  # the lease ran out
                failures.setdefault(i, []).append(error)
                results[i] = _lease_expired(keys[i])
                continue
            on_last = at[i] + 1 >= len(candidates[i])
            if error.timed_out and until < min(deadline, lease_deadline):
                error = _cut_short(session, error, until - started, on_last)
                if on_last and _time_for(targets[i][1], deadline, lease_deadline):
                    retry.append(i)  # (cut off by the others' share: its last, again)
                    continue
            failures.setdefault(i, []).append(error)
            if not on_last and time.monotonic() < deadline:
                at[i] += 1
                retry.append(i)
            else:
                results[i] = _unreadable(keys[i], len(candidates[i]), failures[i])
        pending = retry
    return {
        i
        for i, failed in failures.items()
        if isinstance(results[i], TransferError) and any(f.interrupted for f in failed)
    }


def _transfers(
    group: Sequence[int],
    candidates: Mapping[int, Sequence[pb.Replica]],
    at: Mapping[int, int],
    targets: Targets,
    pieces: Pieces | None,
) -> list[Transfer]:
    """The transfers of ``group``'s objects, each from its replica ``at``: one per object,
    or one per non-empty piece of those read in ``pieces``."""
    transfers = []
    for i in group:
        replica = candidates[i][at[i]]
        if pieces and i in pieces:
            for offset, local, length in pieces[i]:
                if length:
                    transfers.append(
                        Transfer(
                            replica.segment_id,
                            replica.address + offset,
                            local,
                            length,
                            replica.capability,
                        )
                    )
            continue
        address, size = targets[i]
        transfers.append(
            Transfer(replica.segment_id, replica.address, address, size, replica.capability)
        )
    return transfers


def _cut_short(session: Session, error: Failure, share: float, on_last: bool) -> Failure:
    """``error``, a transfer's that its share of the time cut off, said so; its node (when
    it took the transfer and did not answer: ``Failure.silent``) is remembered as
    unreachable, so that reads try it last and puts avoid it for a while (or until it
    answers a transfer again). Not so for a transfer from an object's last replica, cut off
    by the share of the others (``on_last``): nothing says its node is silent rather than
    slower than the share allowed."""
    shown = f"{max(share, 0.0):.2g} s"
    if on_last:
        why = f"not done within the {shown} of a run shared with objects on more replicas"
    else:
        why = f"not done within the {shown} given to this replica, others left"
        if error.silent and error.node_id:
            session.data.unreachable.add(error.node_id)
            why += ": its node is tried last for a few seconds"
    return dataclasses.replace(error, message=f"{error.message} ({why})")


def _time_for(nbytes: int, deadline: float, lease_deadline: float) -> bool:
    """Whether the time left gives a read of ``nbytes`` from its last replica, run again, as
    much as ``attempt_deadline``'s floor would (else it fails with its first run's error)."""
    left = min(deadline, lease_deadline) - time.monotonic()
    return left >= MIN_ATTEMPT + nbytes / SLOW_RATE


def _by_object(
    pending: Sequence[int], pieces: Pieces, errors: Sequence[Failure | None]
) -> list[Failure | None]:
    """Per object of ``pending``, the first failure of its transfers (those of ``read``'s
    loop: one per object, or one per non-empty piece of those read in pieces)."""
    outcomes: list[Failure | None] = []
    at = 0
    for i in pending:
        count = sum(1 for piece in pieces[i] if piece[2]) if i in pieces else 1
        outcomes.append(next((e for e in errors[at : at + count] if e is not None), None))
        at += count
    return outcomes


def _unreadable(key: str, replicas: int, failures: Sequence[Failure]) -> TransferError:
    """The error of an object none of whose replicas tried could be read: how many were
    tried, of how many, and why each failed (on which node)."""
    what = "; ".join(f"[{f.node_id}] {f}" if f.node_id else str(f) for f in failures)
    tried = len(failures)
    if tried < replicas:
        message = (
            f"could not read {key!r}: tried {tried} of its {replicas} replicas, no time was "
            f"left for the others (raise the client's timeout): {what}"
        )
    else:
        message = f"could not read {key!r} from any of its {replicas} replica(s): {what}"
    if tried == replicas and all(f.unreachable for f in failures):
        nodes = ", ".join(dict.fromkeys(f.node_id or "(unknown)" for f in failures))
        message = (
            f"could not read {key!r}: no storage node holding it can be reached ({nodes}; "
            f"{what}). A node that died is declared dead by the master once it misses "
            "heartbeats for the node TTL (`kvpool master --node-ttl`, 5 s by default); until "
            f"then exists({key!r}) still answers True, afterwards a get gives ObjectNotFound. "
            "Put the object again, or retry once the node is back"
        )
    return TransferError(message, key=key)


def _lease_expired(key: str) -> LeaseExpired:
    return LeaseExpired(
        f"the read lease on {key!r} may have expired before its transfer finished, so the "
        "bytes were discarded: read it again (or ask for a longer lease_ttl)",
        key=key,
    )


def verify(
    keys: Sequence[str],
    located: Mapping[int, pb.ObjectLocation],
    targets: Targets,
    results: list[Any],
    pieces: Pieces | None = None,
) -> None:
    """Checks each successfully read object against its checksum (its writer's, or the one
    its persistent segment computed); one that has none fails with NotVerifiable rather than
    pass unchecked. Reads in ``pieces`` must each cover their whole object (a checksum is of
    the whole)."""
    for i, (address, size) in targets.items():
        if isinstance(results[i], KVPoolError):
            continue
        if not located[i].HasField("crc32c"):
            results[i] = NotVerifiable(
                f"{keys[i]!r} carries no checksum (it was put without checksum=True, on a "
                "tier that keeps none), so verify=True cannot check it: read it with "
                "verify=False, or put it again with checksum=True",
                key=keys[i],
            )
            continue
        if pieces and i in pieces:
            actual = crc32c_of_pieces((local, length) for _, local, length in pieces[i])
        else:
            actual = crc32c_at(address, size)
        if actual != located[i].crc32c:
            results[i] = ChecksumMismatch(
                f"the bytes read for {keys[i]!r} do not match its writer's checksum "
                f"(crc32c {actual:#010x}, expected {located[i].crc32c:#010x}); they were "
                "discarded: read it again, and report this if it repeats",
                key=keys[i],
            )


def by_nearness(session: Session, replicas: Sequence[pb.Replica]) -> list[pb.Replica]:
    """Replicas on this host first (they move over shared memory), those on nodes this
    client could not reach lately last."""
    if len(replicas) < 2:
        return list(replicas)
    data = session.data
    avoid = data.unreachable.current()

    def rank(replica: pb.Replica) -> tuple[bool, bool]:
        far = data.host_of(replica.segment_id) != session.host
        return bool(avoid) and data.node_of(replica.segment_id) in avoid, far

    return sorted(replicas, key=rank)
