"""The write side: reserve at the master, write every replica over UCX, commit.

A batch costs two master round trips whatever its size; all its transfers are in flight
together. Writes stop at the earlier of the caller's deadline and the write timeout the
master sets (after which the reservation may be gone and its space reused): the data path
force-closes transfers that run past it, so a late writer never touches reused memory.

A put none of whose replicas could be written because their nodes could not be reached (a
node that died and that the master has not declared dead yet; not a missed deadline) is
placed again within the caller's deadline: its failed reservation is committed as failed
(PutEnd frees it), and PutStart asks the master to avoid the nodes this client cannot reach
(client/unreachable_nodes.py), which every PutStart does for a few seconds after.

A call told to stop (client/cancellation.py, the asyncio client's cancellation) stops before
writing and before committing, and revokes its reservations (PutRevoke) there: its keys are
then free, never half-visible. Once PutEnd is sent, its keys are published whole or not;
should its answer not come, the call cannot tell which, and says so (PutOutcomeUnknown, a
MasterUnavailable: ``outcome_unknown``).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.client import arguments
from kvpool.client.cancellation import CallCancelled, cancelled
from kvpool.client.checksum import crc32c_at, crc32c_of_pieces
from kvpool.client.data_path import Failure, Transfer
from kvpool.client.session import Session
from kvpool.common.keys import shown_key
from kvpool.common.logging import get_logger
from kvpool.common.status import KeyStatus, Pin, Tier
from kvpool.errors import (
    ClientClosed,
    InvalidArgument,
    KVPoolError,
    MasterNotTrusted,
    MasterUnavailable,
    PutOutcomeUnknown,
)
from kvpool.proto import master_pb2 as pb

log = get_logger("kvpool.client")

PINS = {None: Pin.NONE, "none": Pin.NONE, "soft": Pin.SOFT, "hard": Pin.HARD}
TIERS = {None: Tier.UNSPECIFIED, "any": Tier.UNSPECIFIED, "dram": Tier.DRAM, "nvme": Tier.NVME}
#: Placements a put gets in all (the first included) while the nodes it is placed on cannot
#: be reached: each one avoids every node that failed before it.
PLACEMENTS = 3
#: How long past the call's deadline a put still tells the master how its writes went (or
#: gives its reservations back after an interrupt): else the reservation, and its key,
#: stay held until the master's write timeout runs out, and a put of the same key again
#: meanwhile is refused as already being written.
SETTLE_WAIT = 1.0


@dataclass(frozen=True, slots=True)
class WriteOptions:
    replicas: int = 0  # 0: the master's default
    preferred_hosts: tuple[str, ...] = ()
    pin: Pin = Pin.NONE
    pin_ttl: float = 0.0
    checksum: bool = False
    tier: Tier = Tier.UNSPECIFIED

    @staticmethod
    def build(
        replicas: int,
        preferred_hosts: Sequence[str],
        pin: str | None,
        pin_ttl: float,
        checksum: bool,
        tier: str | None = None,
    ) -> WriteOptions:
        if replicas < 0:
            raise InvalidArgument(f"replicas must be 0 (master default) or more, got {replicas}")
        if not (pin is None or isinstance(pin, str)) or pin not in PINS:
            raise InvalidArgument(f"pin must be None, 'soft' or 'hard', got {pin!r}")
        pin_ttl = arguments.seconds("pin_ttl", pin_ttl, zero_allowed=True)
        if not (tier is None or isinstance(tier, str)) or tier not in TIERS:
            raise InvalidArgument(f"tier must be None, 'any', 'dram' or 'nvme', got {tier!r}")
        hosts = arguments.texts("preferred_hosts", preferred_hosts)
        return WriteOptions(replicas, hosts, PINS[pin], pin_ttl, checksum, TIERS[tier])


@dataclass(slots=True)
class PendingPut:
    """One reserved key on its way to publication."""

    index: int  # position in the caller's batch
    key: str
    slot: pb.PutSlot
    source: tuple[int, int, Any] | None  # (address, length, keepalive) of the bytes
    write_deadline: float  # monotonic: no byte may be written after this
    crc32c: int | None = None
    errors: list[str] = field(default_factory=list)  # per replica: '' when written
    #: Why the master could not publish it, where it says more than the status (PutEnd).
    unpublished: str = ""
    failures: list[Failure | None] = field(default_factory=list)  # per replica: None when written
    #: (address, length) of each buffer an object gathered from several is made of, in order
    #: (``Client.put_parts``); None: the bytes are ``source``'s alone.
    pieces: Sequence[tuple[int, int]] | None = None
    #: Its commit went unanswered after another commit of the same call was answered
    #: (``write_and_commit``): its result, for this key alone, whatever its status says.
    unknown: PutOutcomeUnknown | None = None

    @property
    def why_not_published(self) -> str:
        """What the writer and the master know of why it was not published."""
        return "; ".join(filter(None, [*self.errors, self.unpublished]))

    @property
    def replicas_written(self) -> int:
        return self.errors.count("")  # ('' where written: counted in C)

    @property
    def nodes_unreachable(self) -> bool:
        """No replica was written, each for want of reaching its node (not of time)."""
        failures = self.failures
        return bool(failures) and all(f is not None and f.unreachable for f in failures)


def reserve(
    session: Session,
    keys: list[str],
    sizes: list[int],
    options: WriteOptions,
    deadline: float,
    writes_in_call: bool = True,
) -> tuple[Sequence[pb.PutSlot], float]:
    """PutStart for a batch; returns the slots and the monotonic time writes must end by:
    the master's write window, and ``deadline`` where the writes are of the same call
    (``writes_in_call``; not for ``Client.reserve``, whose write is a call of its own)."""
    session.writing()
    avoid = session.data.unreachable.current()
    sent_at = time.monotonic()
    response = session.link.call(
        "PutStart",
        pb.PutStartRequest(
            client_id=session.client_id,
            keys=keys,
            sizes=sizes,
            replicas=options.replicas,
            preferred_hosts=options.preferred_hosts,
            # protoc's .pyi wants its own enum in an enum field; protobuf takes any int (the
            # wire values, which common.status's enums hold)
            pin=options.pin,  # type: ignore[arg-type]
            pin_ttl_ms=int(options.pin_ttl * 1000),
            tier=options.tier,  # type: ignore[arg-type]  # (as pin)
            avoid_nodes=avoid,
            mapped_segments=session.data.mapped_for(writing=True),
        ),
        deadline,
    )
    try:
        session.data.learn(response.segments)
        write_deadline = deadline
        if response.write_timeout_ms:
            window = sent_at + response.write_timeout_ms / 1000.0
            write_deadline = min(deadline, window) if writes_in_call else window
        if avoid:
            for slot in response.slots:
                if slot.status == KeyStatus.NO_SPACE:
                    slot.message += (
                        f" (left out: node(s) {', '.join(avoid)}, which this client could not "
                        "reach in the last seconds)"
                    )
    except BaseException as error:
        give_back_on_interrupt(session, error, keys, response.slots)
        raise
    return response.slots, write_deadline


def give_back_on_interrupt(
    session: Session, error: BaseException, keys: Sequence[str], slots: Sequence[Any]
) -> None:
    """A put interrupted (Ctrl-C, a signal handler's exception) between PutStart's answer
    and its PutEnd gives back the reservations ``slots`` granted ``keys`` (entry i: key i's),
    best effort, so that the keys are free for a put again at once. A reservation already
    committed or revoked is left as it is (the master revokes only what is still reserved).
    Not for the master's own refusals (KVPoolError) nor a cancelled call (CallCancelled),
    which their own paths answer."""
    if isinstance(error, KVPoolError | CallCancelled):
        return
    ok = KeyStatus.OK
    granted = list(  # (a key given twice with one put id: once)
        dict.fromkeys(
            (key, slot.put_id) for key, slot in zip(keys, slots, strict=True) if slot.status == ok
        )
    )
    if not granted:
        return
    give_back(session, [key for key, _ in granted], [put_id for _, put_id in granted])


def write_and_commit(
    session: Session, puts: Sequence[PendingPut], options: WriteOptions, deadline: float
) -> list[int]:
    """Writes and commits ``puts``, placing again those whose nodes could not be reached (see
    the module's docstring) while ``deadline`` allows. Entry i is put i's final status; its
    ``slot``, ``errors`` and ``failures`` are then those of its last placement (or, when a
    placement was refused, ``errors`` says why).

    The first commit, of every put, raises PutOutcomeUnknown where it goes unanswered:
    nothing is known yet (a caller that knows results of an earlier part of its call keeps
    them: ``unknown_each``). Once it was answered, the results known are kept: each put of
    a later commit (of those placed again) that goes unanswered gets its own
    PutOutcomeUnknown in ``unknown`` instead (its status then means nothing), and a
    placement again that fails otherwise (PutStart unanswered, the writes failed as a
    whole) leaves its puts unpublished (NO_REPLICA), ``errors`` saying why."""
    revoke_if_cancelled(session, puts)
    write_or_give_back(session, puts, options.checksum)
    revoke_if_cancelled(session, puts)
    statuses = commit(session, puts, deadline)
    for _ in range(PLACEMENTS - 1):
        if KeyStatus.NO_REPLICA not in statuses:  # (one pass in C: as a rule, none failed)
            break
        if cancelled():  # (those not placed stay failed: their reservations are gone)
            raise CallCancelled
        again = [
            i
            for i, (put, status) in enumerate(zip(puts, statuses, strict=True))
            if status == KeyStatus.NO_REPLICA and put.nodes_unreachable
        ]
        if not again or time.monotonic() >= deadline:
            break
        # (an earlier commit of the call was answered: a failure from here on is its puts'
        # alone, the other results are kept)
        placed = again
        written: list[PendingPut] = []
        # (why each was placed again: its errors are those of its latest placement)
        earlier = {i: "; ".join(filter(None, puts[i].errors)) for i in again}
        try:
            refusals = _place_again(session, again, puts, options, deadline)
            placed = [i for i, refused in zip(again, refusals, strict=True) if refused is None]
            for i, refused in zip(again, refusals, strict=True):
                if refused is not None:
                    statuses[i] = refused
            written = [puts[i] for i in placed]
            for put in written:
                put.unpublished = ""  # (of its earlier placement)
            revoke_if_cancelled(session, written)
            write_or_give_back(session, written, options.checksum)
            revoke_if_cancelled(session, written)
            ends = commit(session, written, deadline)
        except PutOutcomeUnknown as error:  # (PutEnd sent, not answered)
            unknown_each(written, error)
            break
        except ClientClosed:
            raise  # (perhaps with a PutEnd sent: nothing can be said of its outcome here)
        except KVPoolError as error:  # (no PutEnd sent, or it was refused: not published)
            for i in placed:
                put = puts[i]
                put.errors = [
                    f"placing it again failed: {error} (it was being placed again: {earlier[i]})"
                ]
                put.failures = []
            break
        for i, status in zip(placed, ends, strict=True):
            statuses[i] = status
    return statuses


def unknown_each(puts: Sequence[PendingPut], error: PutOutcomeUnknown) -> None:
    """Gives each of ``puts``, whose commit raised ``error``, a PutOutcomeUnknown of its
    own key (``PendingPut.unknown``), for a call that knows other results already."""
    cause = error.__cause__  # (the link's error, as ``commit`` raised it)
    link = cause if isinstance(cause, MasterUnavailable) else MasterUnavailable(str(error))
    for put in puts:
        own = outcome_unknown([put], link)
        put.unknown = own if isinstance(own, PutOutcomeUnknown) else error


def _place_again(
    session: Session,
    again: Sequence[int],
    puts: Sequence[PendingPut],
    options: WriteOptions,
    deadline: float,
) -> list[int | None]:
    """PutStart for ``puts[i] for i in again`` (the nodes that failed them now avoided);
    entry j is None when the j-th of them got new replicas, else the status that ends it."""
    keys = [puts[i].key for i in again]
    sizes = [_size(puts[i]) for i in again]
    slots, write_deadline = reserve(session, keys, sizes, options, deadline)
    outcomes: list[int | None] = []
    for put, slot in zip([puts[i] for i in again], slots, strict=True):
        if slot.status == KeyStatus.OK:
            put.slot, put.write_deadline = slot, write_deadline
            outcomes.append(None)
        else:
            earlier = "; ".join(filter(None, put.errors))
            put.errors = [f"{slot.message} (it was being placed again: {earlier})"]
            put.failures = []
            outcomes.append(slot.status)
    return outcomes


def _size(put: PendingPut) -> int:
    assert put.source is not None, "a put being placed again has its bytes"
    return put.source[1]


def write(session: Session, puts: Sequence[PendingPut], checksum: bool) -> None:
    """Writes every replica of every put at once; records per-replica errors."""
    transfers: list[Transfer] = []
    owners: list[tuple[PendingPut, int]] = []
    files = session.data.may_write_file
    written_as_file: dict[str, bool] = {}  # segment -> files(segment), asked once a call
    for put in puts:
        assert put.source is not None
        address, length, _ = put.source
        pieces = put.pieces
        replicas = put.slot.replicas
        into_file = False
        if length and not checksum:
            for replica in replicas:
                segment_id = replica.segment_id
                known = written_as_file.get(segment_id)
                if known is None:
                    known = written_as_file[segment_id] = files(segment_id)
                if known:
                    into_file = True
                    break
        if checksum or into_file:
            # (a node records the writer's checksum of what the writer wrote into its file)
            put.crc32c = crc32c_at(address, length) if pieces is None else crc32c_of_pieces(pieces)
        put.errors = [""] * len(replicas)
        put.failures = [None] * len(replicas)
        for replica_index, replica in enumerate(replicas):
            if pieces is not None:  # each piece to the next bytes of the replica, in order
                offset = 0
                for local, part in pieces:
                    if part:
                        transfers.append(
                            Transfer(
                                replica.segment_id,
                                replica.address + offset,
                                local,
                                part,
                                replica.capability,
                            )
                        )
                        owners.append((put, replica_index))
                    offset += part
            elif length:
                transfers.append(
                    Transfer(
                        replica.segment_id, replica.address, address, length, replica.capability
                    )
                )
                owners.append((put, replica_index))
    if not transfers:
        return
    deadline = min([put.write_deadline for put in puts])
    errors = session.data.run(transfers, is_get=False, deadline=deadline)
    if not any(errors):  # the common case: every replica written, as recorded above
        return
    for (put, replica_index), error in zip(owners, errors, strict=True):
        if error is not None:  # (a replica written in pieces fails with any of them)
            put.errors[replica_index] = str(error)
            put.failures[replica_index] = error


def write_or_give_back(session: Session, puts: Sequence[PendingPut], checksum: bool) -> None:
    """``write``; failed as a whole (a KVPoolError) or cancelled, it gives the reservations
    back before raising. An interrupt (Ctrl-C, a signal handler's exception) is left to the
    caller's ``give_back_on_interrupt``, which gives back every reservation of the call at
    once, these among them. Nothing touches the caller's memory by then
    (common/helper_threads.py), and the keys are free for a put again at once."""
    try:
        write(session, puts, checksum)
    except (KVPoolError, CallCancelled):
        if puts:
            give_back(session, [put.key for put in puts], [put.slot.put_id for put in puts])
        raise


def commit(
    session: Session, puts: Sequence[PendingPut], deadline: float, unknown_advice: str = ""
) -> list[int]:
    """PutEnd: reports which replicas were written; the master publishes what it can. Sent
    even when the call's deadline has passed (its writes then failed as timed out), with
    ``SETTLE_WAIT`` to answer in. Not answered in time, it raises PutOutcomeUnknown
    (``outcome_unknown``, with ``unknown_advice``)."""
    if not puts:
        return []
    deadline = max(deadline, time.monotonic() + min(SETTLE_WAIT, session.timeout))
    request = pb.PutEndRequest(client_id=session.client_id)
    add = request.commits.add  # in place: building each commit apart costs half as much again
    for put in puts:
        ok = list(map(operator.not_, put.errors))  # ('' where written; in C)
        if put.crc32c is None:
            add(key=put.key, put_id=put.slot.put_id, replica_ok=ok)
        else:
            add(key=put.key, put_id=put.slot.put_id, replica_ok=ok, crc32c=put.crc32c)
    try:
        response = session.link.call("PutEnd", request, deadline)
    except MasterUnavailable as error:
        raise outcome_unknown(puts, error, unknown_advice) from error
    if response.messages:
        for put, message in zip(puts, response.messages, strict=False):
            put.unpublished = message
    return list(response.statuses)


def outcome_unknown(
    puts: Sequence[PendingPut], error: MasterUnavailable, advice: str = ""
) -> MasterUnavailable:
    """What a PutEnd the master did not answer raises: PutOutcomeUnknown, for the keys of
    ``puts`` (``advice``: what to do, where not the default's ``exists``/``get``). The link
    may have sent it (on the lane or over gRPC, perhaps more than once after a broken
    connection) before it gave up: a frame that reached the master's host is read and
    committed however late, and gRPC can no more tell a request lost from an answer lost.
    So its failure says nothing of whether the objects were published, and the error says
    so rather than suggest they were not. Only a master whose certificate failed the TLS
    check (MasterNotTrusted, raised as it is) is known not to have been reached."""
    if isinstance(error, MasterNotTrusted | PutOutcomeUnknown):
        return error
    keys = tuple(put.key for put in puts)
    if len(keys) == 1:
        what = f"object {shown_key(keys[0])} may have been published"
        check = f"exists({shown_key(keys[0])}) or get it"
    else:
        what = (
            f"each of its {len(keys)} objects ({shown_key(keys[0])}, ...: the error's "
            "`keys`) may have been published"
        )
        check = "exists() or get() on each"
    if not advice:
        advice = (
            f"Check with {check} once the master answers; putting it again gets ObjectExists "
            "where it was published (objects are immutable: remove it first to store other "
            "bytes under the key)"
        )
    return PutOutcomeUnknown(
        f"the outcome of the put is unknown: its commit (PutEnd) was sent (or may have "
        f"been) but not answered, "
        f"so {what}, or may yet be (a commit on its way is applied when it reaches the "
        f"master, while the reservation stands). {advice}. The link's error: {error}",
        key=keys[0] if len(keys) == 1 else None,
        keys=keys,
    )


def revoke_if_cancelled(session: Session, puts: Sequence[PendingPut]) -> None:
    """When the call was told to stop (client/cancellation.py): gives the reservations of
    ``puts`` back, so that nothing of them is left half-visible, and raises CallCancelled.
    Should the master not take them back in time, they run out by themselves at the write
    timeout, as any writer's that stops."""
    if not cancelled():
        return
    if puts:
        keys, put_ids = [put.key for put in puts], [put.slot.put_id for put in puts]
        give_back(session, keys, put_ids, time.monotonic() + session.timeout)
    raise CallCancelled


def give_back(
    session: Session, keys: Sequence[str], put_ids: Sequence[int], deadline: float | None = None
) -> bool:
    """PutRevoke of the reservations ``put_ids`` granted ``keys`` (entry i: key i's), best
    effort, within ``deadline`` (None: ``SETTLE_WAIT`` at most): True once the master
    answered. Should it not, they run out by themselves at the master's timeouts (its write
    or reservation timeout, or the client's TTL once this client is gone)."""
    if deadline is None:
        deadline = time.monotonic() + min(SETTLE_WAIT, session.timeout)
    request = pb.PutRevokeRequest(client_id=session.client_id, keys=keys, put_ids=put_ids)
    try:
        session.link.call("PutRevoke", request, deadline)
    except KVPoolError as error:
        log.debug("could not give reservations back", keys=len(keys), error=str(error))
        return False
    return True


def revoke(session: Session, puts: Sequence[PendingPut], deadline: float) -> list[int]:
    response = session.link.call(
        "PutRevoke",
        pb.PutRevokeRequest(
            client_id=session.client_id,
            keys=[put.key for put in puts],
            put_ids=[put.slot.put_id for put in puts],
        ),
        deadline,
    )
    return list(response.statuses)
