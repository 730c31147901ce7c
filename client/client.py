"""``kvpool.Client``: put and get objects; metadata through the master, bytes over UCX.

Every operation is a batch underneath (a single op is a batch of one): one master round trip
to reserve or locate all keys, all transfers in flight together, one round trip to commit.
Batch methods return one entry per key, in order: the value, or the exception instance for
that key (they raise only for whole-call failures such as MasterUnavailable).

Beyond whole objects in one buffer: ranged reads (``get_range``, ``get_range_into``) copy
only the bytes asked for; an object can be written from several buffers gathered in order
(``put_parts``) and read scattered into several (``get_into_parts``), each part its own
transfer into or out of the replica at increasing offsets (or its own memory copy, on a
mapped segment). Calls that return more than bytes return kvpool's own frozen dataclasses
(client/types.py), never protobuf or UCX objects.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kvpool.client import arguments, batch_split, get_path, put_path
from kvpool.client.buffers import new_bytes, readable_address, writable_address
from kvpool.client.cancellation import cancelled, checkpoint
from kvpool.client.data_path import DataPath
from kvpool.client.master_link import MasterLink
from kvpool.client.outcomes import error_for
from kvpool.client.put_path import PendingPut, WriteOptions
from kvpool.client.reservation import Reservation
from kvpool.client.session import Session, ucx_config_after_fork
from kvpool.client.types import (
    ClusterStatus,
    KeyPage,
    ObjectInfo,
    PrefixRemoval,
    RegisteredRegion,
    StoryEvent,
    add_removals,
    cluster_status,
    key_page,
    object_info,
    prefix_removal,
    story_event,
)
from kvpool.common import lane_protocol as lp
from kvpool.common.keys import (
    MAX_KEY_BYTES,
    STORED_KEY_BYTES,
    key_problem,
    plainly_valid,
    shown_key,
    valid_keys_of,
)
from kvpool.common.logging import get_logger
from kvpool.common.master_address import parse_master
from kvpool.common.status import KeyStatus
from kvpool.errors import (
    BufferTooSmall,
    InvalidArgument,
    InvalidKey,
    KVPoolError,
    PutOutcomeUnknown,
    QuotaExceeded,
    TransferError,
)
from kvpool.proto import master_pb2 as pb
from kvpool.security.caller import CallerCredentials
from kvpool.transport import ucp

DEFAULT_TIMEOUT = 10.0
#: Leased keys a client remembers to give back when it closes.
LEASES_REMEMBERED = 4096
#: How long closing waits for the master to take the leases back.
RELEASE_TIMEOUT = 2.0

log = get_logger("kvpool.client")
#: First pause before retrying puts refused while a new master fences old writers.
FENCE_RETRY = 0.1


class Client:
    """A kvpool client. Use one per process and close it (or use ``with``). A client belongs
    to the process that made it: after ``fork()``, make a new one in the child (there, calls
    on the parent's raise ClientForked, and its connections are left to the parent).

    Thread-safe: threads share one client, and their calls overlap rather than queue (each
    master call on a connection of its own, each transfer on a UCX worker of its own, copies
    with mapped segments side by side). ``kvpool.aio.AsyncClient`` is the asyncio face of it.

    ``master`` is ``HOST:PORT``, a list ``HOST:PORT,HOST:PORT`` of masters, or
    ``etcd://HOST:2379/CLUSTER`` (default: ``$KVPOOL_MASTER``); the client follows failovers.
    ``replicas`` is the number of copies a put asks for, each on another storage node (None:
    the master's ``--default-replicas``). Puts are best effort: where fewer nodes have room,
    fewer copies are stored, and ``put`` returns how many (never 0: then it raises).
    ``timeout`` bounds every call, master round trips and transfers together (a put whose
    writes missed it still tells the master, within at most a second more, so that its key
    is free for a put again at once), except ``remove_prefix`` and ``remove_all``: these
    remove page after page of at most 4096 objects, and each page has a timeout of its own.
    ``timeout``, ``replicas``, ``checksum`` and ``prefer_local`` may be set on a client
    later too (checked as here; calls started afterwards follow them). ``lease_ttl``
    asks for read leases of that many seconds (0: the master's default). ``checksum`` makes
    puts send a CRC-32C of their bytes, which ``get(..., verify=True)`` checks.
    ``prefer_local`` puts the first replica on a node of this host when one has room.
    ``ucx_config`` overrides UCX settings by name without the ``UCX_`` prefix, e.g.
    ``{"TLS": "tcp"}``. ``same_host_mapping`` lets the client map the memory of storage nodes
    on its own host (same user, same pid namespace) and copy with plain loads and stores
    instead of UCX; turn it off to force UCX, e.g. to measure what other hosts would see.
    ``copy_threads`` is how many threads (this one included) share such copies of 8 MiB and
    more; 1 keeps them on the calling thread. ``metadata_lane`` sends the hot metadata calls
    over the master's metadata lane when it has one (else, and where it cannot be reached,
    gRPC); turn it off to use gRPC only.

    Credentials: ``token`` (or ``@/path/to/file``; default ``$KVPOOL_TOKEN`` or the file
    ``$KVPOOL_TOKEN_FILE``) is a client token of one tenant (`kvpool token create --role
    client --tenant T`): the client reaches that tenant's objects only. ``tls_ca`` (default
    ``$KVPOOL_TLS_CA``) is the CA of the master's certificate and makes every connection to
    it TLS; ``tls_cert`` and ``tls_key`` (``$KVPOOL_TLS_CERT``, ``$KVPOOL_TLS_KEY``) a client
    certificate, where the master asks for one. A master started ``--insecure`` needs none.
    """

    def __init__(
        self,
        master: str | None = None,
        *,
        replicas: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        lease_ttl: float = 0.0,
        checksum: bool = False,
        prefer_local: bool = False,
        ucx_config: Mapping[str, str] | None = None,
        same_host_mapping: bool = True,
        copy_threads: int = 2,
        metadata_lane: bool = True,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> None:
        try:
            target = parse_master(master)
            credentials = CallerCredentials.resolve(token, tls_ca, tls_cert, tls_key)
            credentials.refuse_plaintext_token((*target.masters, *target.etcd))
        except ValueError as error:
            raise InvalidArgument(str(error)) from None
        _check_replicas(replicas)
        for name, value in (
            ("checksum", checksum),
            ("prefer_local", prefer_local),
            ("same_host_mapping", same_host_mapping),
            ("metadata_lane", metadata_lane),
        ):
            arguments.flag(name, value)
        ucx_config = arguments.string_map("ucx_config", ucx_config)
        timeout = arguments.seconds("timeout", timeout, zero_allowed=False)
        lease_ttl = arguments.seconds("lease_ttl", lease_ttl, zero_allowed=True)
        if isinstance(copy_threads, bool) or not isinstance(copy_threads, int) or copy_threads < 1:
            raise InvalidArgument(f"copy_threads must be an integer >= 1, got {copy_threads!r}")
        self.master = str(target)
        self._replicas = replicas
        self._checksum = checksum
        self._prefer_local = prefer_local
        self._session = Session(
            MasterLink(target, use_lane=metadata_lane, credentials=credentials),
            DataPath(
                ucx_config_after_fork(ucx_config),
                same_host_mapping=same_host_mapping,
                copy_threads=copy_threads,
            ),
            timeout,
            lease_ttl,
        )
        self._closed = False
        # A client dropped without close() would keep its connections, UCX worker, mapped
        # memory and threads for the life of the process (nothing else refers to them):
        # they go once it is collected, with a ResourceWarning (as an unclosed file gives).
        self._finalizer = weakref.finalize(self, _close_dropped, self._session, self.master)
        self._finalizer.atexit = False  # (at exit, the process lets go of everything anyway)
        #: Keys this client leased lately (at most LEASES_REMEMBERED, oldest dropped first):
        #: given back when it closes, so that an exited reader does not hold up a removal.
        self._leased: dict[str, None] = {}
        self._leases_lock = threading.Lock()

    # (settable, checked as the constructor checks them: a NaN or infinite timeout would take
    # every deadline away, a str would fail untyped deep inside a call. The timeout lives in
    # the session, so that reservations and a put's settling, which read it there, follow.)

    @property
    def timeout(self) -> float:
        """Seconds a call may take (see the class docstring). Settable: the new value, checked
        as the constructor's (a finite number of seconds, more than 0), bounds every call
        started afterwards, and the reservations they make."""
        return self._session.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._session.timeout = arguments.seconds("timeout", value, zero_allowed=False)

    @property
    def replicas(self) -> int | None:
        """Copies a put asks for when it does not say (None: the master's default).
        Settable, checked as the constructor's; puts started afterwards use it."""
        return self._replicas

    @replicas.setter
    def replicas(self, value: int | None) -> None:
        _check_replicas(value)
        self._replicas = value

    @property
    def checksum(self) -> bool:
        """Whether puts that do not say send a CRC-32C of their bytes. Settable (True or
        False); puts started afterwards use it."""
        return self._checksum

    @checksum.setter
    def checksum(self, value: bool) -> None:
        self._checksum = arguments.flag("checksum", value)

    @property
    def prefer_local(self) -> bool:
        """Whether puts that name no ``preferred_hosts`` put their first replica on this
        host. Settable (True or False); puts started afterwards use it."""
        return self._prefer_local

    @prefer_local.setter
    def prefer_local(self, value: bool) -> None:
        self._prefer_local = arguments.flag("prefer_local", value)

    @property
    def client_id(self) -> str:
        return self._session.client_id

    @property
    def host(self) -> str:
        return self._session.host

    @property
    def retries(self) -> int:
        """Master calls retried because the master was unreachable or shedding load."""
        return self._session.link.retries

    @property
    def mapped_segments(self) -> list[str]:
        """Ids of the segments this client reaches by mapping their memory (nodes on its own
        host, see ``same_host_mapping``); the others go over UCX."""
        return self._session.data.mapped_segments()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Gives back the reservations of ``reserve`` neither committed nor revoked and the
        read leases this client holds (best effort, briefly), then lets go of its
        connections and mapped memory."""
        if not self._closed:
            self._closed = True
            if self._session.forked:  # a fork child's copy: the parent's, left alone
                return
            # (one deadline for both: a master away delays close by RELEASE_TIMEOUT at most)
            deadline = time.monotonic() + min(self.timeout, RELEASE_TIMEOUT)
            try:
                try:
                    # (moved on by the time it waited for writes under way, for both)
                    deadline = self._revoke_reservations(deadline)
                finally:
                    self._release_leases(deadline)
            finally:
                self._finalizer.detach()
                self._session.close()

    def _revoke_reservations(self, deadline: float) -> float:
        """One PutRevoke for the open reservations ``reserve`` made (its key free again at
        once, not when the master's reservation timeout or the client's heartbeat runs out);
        each Reservation still held is marked over. A reservation committed or revoked
        meanwhile is left as it is by the master.

        Each is given back only once the writes of it under way on other threads have
        returned (``Reservation.writes_over``: each stops at its deadline): the master places
        other objects in the space at once. One whose write has not (its thread is not
        running, or a signal handler's close interrupted it) is left to the master, which
        reclaims it once the writer's window is over. The time spent waiting does not count
        against ``deadline``: returns ``deadline`` moved on by that time, for the rest of
        the close."""
        held = self._session.take_reservations()
        if not held:
            return deadline
        budget = deadline - time.monotonic()
        reservations = [reservation for _, reservation in held if reservation is not None]
        for reservation in reservations:  # (every one refuses writes not begun, first)
            reservation.closed()
        writing = {(r.key, r.put_id) for r in reservations if not r.writes_over()}
        deadline = max(deadline, time.monotonic() + budget)
        given = [ids for ids, _ in held if ids not in writing]
        if given:
            keys, put_ids = [key for key, _ in given], [put_id for _, put_id in given]
            put_path.give_back(self._session, keys, put_ids, deadline)
        return deadline

    def _remember_leases(self, keys: Sequence[str]) -> None:
        """Notes the keys a call leased, for ``close`` to give back: the latest
        ``LEASES_REMEMBERED`` at least, and every key of the call at hand (a batch larger
        than that is given back whole; it is the caller's memory already)."""
        with self._leases_lock:
            leased = self._leased
            if leased:  # a key leased again moves to the newest end (in C: on every read)
                collections.deque(map(leased.pop, keys, itertools.repeat(None)), maxlen=0)
            leased.update(dict.fromkeys(keys))
            if len(leased) > 2 * LEASES_REMEMBERED:  # trimmed now and then, not on every call
                kept = list(itertools.islice(reversed(leased), LEASES_REMEMBERED))
                self._leased = dict.fromkeys(reversed(kept))
                self._leased.update(dict.fromkeys(keys))  # (some may have stood earlier)

    def _release_leases(self, deadline: float) -> None:
        with self._leases_lock:
            leased, self._leased = list(self._leased), {}
        if not leased or not self._session.link.answered:
            # (no master ever answered this client, at a wrong address say: waiting on one
            # again would only make close() slow. A lease granted by a call whose answer was
            # lost runs out by itself.)
            return
        keys = valid_keys_of(leased)
        if not keys:  # (an Exists may have asked about keys no put could have made)
            return
        request = pb.ReleaseLeasesRequest(client_id=self.client_id, keys=keys)
        try:
            self._session.link.call("ReleaseLeases", request, deadline)
        except KVPoolError as error:  # the leases run out by themselves
            log.debug("could not give leases back", keys=len(keys), error=str(error))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ single-key API

    def put(self, key: str, data: Any, **options: Any) -> int:
        """Stores ``data`` (bytes or any contiguous buffer) under ``key``, zero-copy.

        Returns how many replicas were stored: puts are best effort, so that a cache keeps
        working while nodes are away or full. Asked for 3 on a cluster where only 2 nodes
        have room, it stores 2 and returns 2 (compare with what you asked for if fewer
        matters to you); when none can be stored it raises. Options as for ``put_many``.
        """
        _check_options("put", options)
        return _raise_if_error(self.put_many([(key, data)], **options)[0])

    def get(self, key: str, *, verify: bool = False) -> bytes:
        return _raise_if_error(self.get_many([key], verify=verify)[0])

    def get_into(self, key: str, buffer: Any, *, verify: bool = False) -> int:
        """Reads the object straight into ``buffer`` (writable, contiguous); returns its size."""
        return _raise_if_error(self.get_into_many([key], [buffer], verify=verify)[0])

    def get_range(self, key: str, offset: int, length: int, *, verify: bool = False) -> bytes:
        """``length`` bytes of the object from byte ``offset``; only those move.

        The range must lie inside the object (``offset + length <= size``), else
        InvalidArgument, whose message says the object's size. A checksum covers a whole
        object, so ``verify=True`` is refused (InvalidArgument): verify with ``get``.
        """
        _check_range(offset, length, verify)

        def plan(i: int, location: Any) -> Any:
            problem = _outside(key, location.size, offset, length)
            if problem is not None:
                return problem
            data, address = new_bytes(length)
            return data, (address, length), ((offset, address, length),)

        [result] = self._read_planned([key], [None], plan)
        result = _raise_if_error(result)
        return bytes(result) if isinstance(result, bytearray) else result

    def get_range_into(
        self,
        key: str,
        buffer: Any,
        offset: int = 0,
        length: int | None = None,
        *,
        verify: bool = False,
    ) -> int:
        """Reads ``length`` bytes of the object from byte ``offset`` into the start of
        ``buffer`` (writable, contiguous); returns ``length``. ``length`` None: as many bytes
        as ``buffer`` holds. Range and ``verify`` as for ``get_range``; a buffer smaller than
        ``length`` is BufferTooSmall."""
        address, capacity, keepalive = writable_address(buffer)
        wanted = capacity if length is None else length
        _check_range(offset, wanted, verify)
        if capacity < wanted:
            raise BufferTooSmall(
                f"asked for {wanted} bytes of {shown_key(key)} but the buffer holds only "
                f"{capacity}: pass a larger buffer, or a smaller length",
                key=key,
            )

        def plan(i: int, location: Any) -> Any:
            problem = _outside(key, location.size, offset, wanted)
            if problem is not None:
                return problem
            return wanted, (address, wanted), ((offset, address, wanted),)

        [result] = self._read_planned([key], [None], plan)
        del keepalive  # (held until the bytes have landed)
        return _raise_if_error(result)

    def put_parts(self, key: str, parts: Sequence[Any], **options: Any) -> int:
        """Stores one object made of ``parts`` (a list of bytes or contiguous buffers) one
        after another, zero-copy: each part goes to the replica at its own offset. Returns
        the replicas stored, as ``put``; options as for ``put_many``."""
        _check_options("put_parts", options)
        return _raise_if_error(self.put_parts_many([(key, parts)], **options)[0])

    def get_into_parts(self, key: str, buffers: Sequence[Any], *, verify: bool = False) -> int:
        """Reads the object scattered into ``buffers`` (a list of writable contiguous
        buffers), filling each in order; their sizes must add up to the object's exactly,
        else InvalidArgument. Returns the object's size. ``verify`` checks the whole object,
        as for ``get``."""
        return _raise_if_error(self.get_into_parts_many([(key, buffers)], verify=verify)[0])

    def exists(self, key: str, *, lease: bool = True) -> bool:
        return _raise_if_error(self.exists_many([key], lease=lease)[0])

    def remove(self, key: str, *, force: bool = False) -> None:
        _raise_if_error(self.remove_many([key], force=force)[0])

    # ------------------------------------------------------------------ batch API

    def put_many(
        self,
        items: Mapping[str, Any] | Iterable[tuple[str, Any]],
        *,
        replicas: int | None = None,
        preferred_hosts: Sequence[str] | None = None,
        pin: str | None = None,
        pin_ttl: float = 0.0,
        checksum: bool | None = None,
        tier: str | None = None,
    ) -> list[int | KVPoolError]:
        """Stores every (key, data) pair; entry i is the number of replicas stored for key i
        (best effort, as for ``put``: possibly fewer than ``replicas``), or its error.

        ``replicas``: copies on distinct storage nodes, at least 1 and at most the master's
        limit (None: the client's ``replicas``, else the master's default).
        ``pin``: None, ``"soft"`` (evicted only after unpinned objects, for ``pin_ttl``
        seconds or the master's default) or ``"hard"`` (never evicted). ``tier``: ``"dram"``,
        ``"nvme"``, or None/``"any"`` (DRAM first, then NVMe).

        A key given more than once is put by its first entry; each later one is not sent and
        gets InvalidArgument. More than 4096 keys go to the master in parts of 4096, one after
        another: a part whose turn comes when the timeout has (nearly) run out is not sent,
        and each of its keys gets a TransferError that says so; a part after the first that
        fails as a whole gives its error to each of its keys not answered yet (a key the
        master refused keeps its refusal; the first part's failure raises). A commit the
        master did not answer raises PutOutcomeUnknown where no commit of the call was
        answered; else each of its keys gets a PutOutcomeUnknown of its own, and the other
        results are kept.
        """
        options = self._write_options(replicas, preferred_hosts, pin, pin_ttl, checksum, tier)
        pairs, keys = arguments.pair_list("put_many", items, "data")
        deadline = time.monotonic() + self.timeout
        results: list[Any] = [None] * len(pairs)
        sources: dict[int, tuple[int, int, Any]] = {}
        checked = plainly_valid(keys)  # the common case, in one pass
        for i, (key, data) in enumerate(pairs):
            problem = None if checked else key_problem(key)
            if problem is not None:
                results[i] = InvalidKey(f"invalid key {shown_key(key)}: {problem}", key=key)
                continue
            try:
                sources[i] = readable_address(data)
            except InvalidArgument as error:
                results[i] = InvalidArgument(f"{shown_key(key)}: {error}", key=key)
        _refuse_repeats(keys, sources, results)
        if not sources:
            return results
        return self._store(pairs, sources, results, options, deadline)

    def put_parts_many(
        self,
        items: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]],
        *,
        replicas: int | None = None,
        preferred_hosts: Sequence[str] | None = None,
        pin: str | None = None,
        pin_ttl: float = 0.0,
        checksum: bool | None = None,
        tier: str | None = None,
    ) -> list[int | KVPoolError]:
        """``put_parts`` for every (key, parts) pair in one batch (one master round trip to
        reserve, one to commit, all transfers in flight together); entry i is the number of
        replicas stored for key i, or its error. Options, keys given twice and batches of more
        than 4096 keys as for ``put_many``."""
        options = self._write_options(replicas, preferred_hosts, pin, pin_ttl, checksum, tier)
        pairs, keys = arguments.pair_list("put_parts_many", items, "parts")
        deadline = time.monotonic() + self.timeout
        results: list[Any] = [None] * len(pairs)
        sources: dict[int, tuple[int, int, Any]] = {}
        pieces: dict[int, list[tuple[int, int]]] = {}
        for i, (key, parts) in enumerate(pairs):
            problem = key_problem(key)
            if problem is not None:
                results[i] = InvalidKey(f"invalid key {shown_key(key)}: {problem}", key=key)
                continue
            try:
                addresses = [readable_address(part) for part in _parts_of(parts, "parts")]
            except InvalidArgument as error:
                results[i] = InvalidArgument(f"{shown_key(key)}: {error}", key=key)
                continue
            pieces[i] = [(address, length) for address, length, _ in addresses]
            first = addresses[0][0] if addresses else 0
            sources[i] = (first, sum(length for _, length in pieces[i]), addresses)
        _refuse_repeats(keys, sources, results)
        if not sources:
            return results
        return self._store(pairs, sources, results, options, deadline, pieces)

    def _store(
        self,
        pairs: Sequence[tuple[str, Any]],
        sources: Mapping[int, tuple[int, int, Any]],
        results: list[Any],
        options: WriteOptions,
        deadline: float,
        pieces: Mapping[int, Sequence[tuple[int, int]]] | None = None,
        answered_before: bool = False,
    ) -> list[Any]:
        """Reserves, writes and commits ``pairs[i]`` for each i of ``sources`` (its bytes,
        or with ``pieces`` the buffers they gather); fills ``results`` and returns it. A
        batch larger than one master call takes goes in parts of that size, each reserved,
        written and committed before the next is reserved (a reservation is to be written
        within the master's write window, which a whole large batch could outlast).

        A commit that went unanswered raises PutOutcomeUnknown only where no commit of the
        call was answered before it (``answered_before``: one of an earlier part was); else
        each of its keys gets a PutOutcomeUnknown of its own, the other results kept
        (``put_path.write_and_commit``, ``put_path.unknown_each``)."""
        order = list(sources)
        if len(order) > lp.MAX_BATCH_KEYS:
            return self._store_in_parts(pairs, sources, results, options, deadline, pieces)
        keys = [pairs[i][0] for i in order]
        sizes = [sources[i][1] for i in order]
        puts: list[PendingPut] = []
        ok = KeyStatus.OK  # (read off its Enum class once, not per key)
        reserved = self._reserve(keys, sizes, options, deadline)
        try:
            for i, (slot, write_deadline) in zip(order, reserved, strict=True):
                if slot.status == ok:
                    put = PendingPut(i, pairs[i][0], slot, sources[i], write_deadline)
                    if pieces is not None:
                        put.pieces = pieces[i]
                    puts.append(put)
                else:
                    results[i] = error_for(slot.status, pairs[i][0], slot.message)
            try:
                statuses = put_path.write_and_commit(self._session, puts, options, deadline)
            except PutOutcomeUnknown as error:  # (the first commit, of every put, unanswered)
                if not answered_before:
                    raise  # (nothing of the call is known: it fails as a whole)
                put_path.unknown_each(puts, error)
                statuses = [KeyStatus.NO_REPLICA] * len(puts)  # (each answered by ``unknown``)
        except BaseException as error:  # (interrupted: what is still reserved goes back)
            # (the slots reserved, and each put's latest placement where it was placed again;
            # a put id no longer held is left alone by the master)
            put_path.give_back_on_interrupt(
                self._session,
                error,
                [*keys, *(put.key for put in puts)],
                [*(slot for slot, _ in reserved), *(put.slot for put in puts)],
            )
            raise
        for put, status in zip(puts, statuses, strict=True):
            if put.unknown is not None:  # (its commit unanswered, others' answered)
                results[put.index] = put.unknown
            elif status == ok:
                results[put.index] = put.replicas_written
            else:
                results[put.index] = error_for(status, put.key, put.why_not_published)
        return results

    def _store_in_parts(
        self,
        pairs: Sequence[tuple[str, Any]],
        sources: Mapping[int, tuple[int, int, Any]],
        results: list[Any],
        options: WriteOptions,
        deadline: float,
        pieces: Mapping[int, Sequence[tuple[int, int]]] | None,
    ) -> list[Any]:
        """``_store`` part after part. Once a part is stored it stays stored, whatever befalls
        the next, so that each part after the first answers for its own keys rather than the
        call raising and the stored parts' results being lost: a part whose turn comes too
        late (``_too_late``) is not sent, its keys and the rest told that the timeout ran
        out; one that fails as a whole gives its error to each of its keys. Only the first
        part's failure, before anything is stored, raises."""
        order = list(sources)
        took = 0.0  # (how long the last part took)
        sent = 0  # (keys of the parts before)

        def store_part(part: Sequence[int]) -> bool:
            nonlocal took, sent
            checkpoint()  # (a cancelled put reserves no further part)
            began = time.monotonic()
            if sent and _too_late(deadline - began, took * len(part) / lp.MAX_BATCH_KEYS):
                for i in order[sent:]:
                    results[i] = self._not_sent(pairs[i][0], sent, len(order))
                return False
            answered_before = bool(sent)  # (an earlier part was answered: its results stand)
            sent += len(part)
            try:
                self._store(
                    pairs,
                    {i: sources[i] for i in part},
                    results,
                    options,
                    deadline,
                    pieces,
                    answered_before,
                )
            finally:
                took = time.monotonic() - began
            return True

        batch_split.answer_each_part(order, lambda i: pairs[i][0], results, store_part)
        return results

    def _not_sent(self, key: str, sent: int, total: int) -> TransferError:
        """The error of a key whose part of a large put was not sent for want of time."""
        return TransferError(
            f"{shown_key(key)} was not sent, and nothing was stored under it: the call's "
            f"timeout ({self.timeout:g} s) ran out, or too little of it was left for another "
            f"part, after {sent} of its {total} keys had been sent (in parts of 4096). Put it "
            "again, or put fewer keys in one call, or raise the client's timeout",
            key=key,
        )

    def reserve(self, key: str, size: int, **options: Any) -> Reservation:
        """Low-level put in explicit steps: reserve now, then ``write``, ``commit``/``revoke``.

        ``put`` does all three at once; this exists for callers that produce the bytes after
        reserving (and for tests of what readers see in between). Options as for ``put_many``.

        The reservation has a write window: ``write`` must end within the master's write
        timeout (``kvpool master --write-timeout``, 3 s by default) of this call, and within
        the client's ``timeout`` of the ``write``. A ``write`` past the window sends nothing,
        gives the reservation up and raises PutAborted: reserve the key again, and write
        sooner. (A ``commit`` of bytes written in time may come later, within the master's
        ``--reservation-timeout``.) Closing the client gives back the reservations neither
        committed nor revoked.
        """
        problem = key_problem(key)
        if problem is not None:
            raise InvalidKey(f"invalid key {shown_key(key)}: {problem}", key=key)
        size = arguments.whole("size", size)
        _check_options("reserve", options)
        write_options = self._write_options(**options)
        deadline = time.monotonic() + self.timeout
        [(slot, write_deadline)] = self._reserve(
            [key], [size], write_options, deadline, writes_in_call=False
        )
        if slot.status != KeyStatus.OK:
            raise error_for(slot.status, key, slot.message)
        pending = PendingPut(0, key, slot, None, write_deadline)
        reservation = Reservation(self._session, pending, size, write_options.checksum)
        # (it keeps this client alive: its session is the client's, which a client collected
        # meanwhile, dropped without close(), would close under the reservation's writes)
        reservation.owner = self
        return reservation

    def _reserve(
        self,
        keys: list[str],
        sizes: list[int],
        options: WriteOptions,
        deadline: float,
        writes_in_call: bool = True,
    ) -> list[tuple[Any, float]]:
        """PutStart for every key; entry i is (slot, write deadline: see
        ``put_path.reserve``). FENCED slots (a new master fencing old writers, or a node
        still clearing the space) are asked for again with backoff while the deadline
        allows."""
        outcomes: list[Any] = [None] * len(keys)
        order = list(range(len(keys)))
        pause = FENCE_RETRY
        while order:
            asked = ([keys[i] for i in order], [sizes[i] for i in order])
            slots, write_deadline = put_path.reserve(
                self._session, *asked, options, deadline, writes_in_call
            )
            fenced = []
            fenced_status = KeyStatus.FENCED  # (read off its Enum class once, not per key)
            for i, slot in zip(order, slots, strict=True):
                outcomes[i] = (slot, write_deadline)
                if slot.status == fenced_status and time.monotonic() + pause < deadline:
                    fenced.append(i)
            order = fenced if not cancelled() else []  # (a cancelled put asks no more)
            if order:
                try:
                    time.sleep(pause)
                except BaseException as error:  # (interrupted: what was granted goes back)
                    granted = [i for i, outcome in enumerate(outcomes) if outcome is not None]
                    put_path.give_back_on_interrupt(
                        self._session,
                        error,
                        [keys[i] for i in granted],
                        [outcomes[i][0] for i in granted],
                    )
                    raise
                pause = min(pause * 2, 1.0)
        return outcomes

    def get_many(self, keys: Sequence[str], *, verify: bool = False) -> list[bytes | KVPoolError]:
        """Reads every key; entry i is the object's bytes or the error for key i."""
        keys = arguments.key_list("get_many", keys, "get(key)")
        verify = arguments.flag("verify", verify)
        deadline = time.monotonic() + self.timeout
        results: list[Any] = [None] * len(keys)
        valid = self._valid_keys(keys, results)
        located, lease_deadline = self._locate(keys, valid, results, deadline)
        targets = {}
        for i, location in located.items():
            data, address = new_bytes(location.size)
            results[i] = data
            targets[i] = (address, location.size)
        get_path.read(self._session, keys, located, targets, results, deadline, lease_deadline)
        if verify:
            get_path.verify(keys, located, targets, results)
        return [bytes(r) if isinstance(r, bytearray) else r for r in results]

    def get_into_many(
        self, keys: Sequence[str], buffers: Sequence[Any], *, verify: bool = False
    ) -> list[int | KVPoolError]:
        """Reads key i into buffers[i]; entry i is the object's size or the error for key i."""
        keys = arguments.key_list("get_into_many", keys, "get_into(key, buffer)")
        if not isinstance(buffers, list | tuple):
            if not isinstance(buffers, Iterable) or arguments.one_buffer(buffers):
                raise InvalidArgument(
                    f"get_into_many takes a list of buffers, one per key, not one "
                    f"{type(buffers).__name__}: for one key, call get_into(key, buffer) (to "
                    "read into the rows of an array, pass list(array))"
                )
            buffers = list(buffers)
        verify = arguments.flag("verify", verify)
        if len(keys) != len(buffers):
            raise InvalidArgument(f"{len(keys)} keys but {len(buffers)} buffers: pass one per key")
        deadline = time.monotonic() + self.timeout
        results: list[Any] = [None] * len(keys)
        valid = self._valid_keys(keys, results)
        located, lease_deadline = self._locate(keys, valid, results, deadline)
        targets = {}
        for i, location in located.items():
            try:
                address, capacity, _ = writable_address(buffers[i])
            except InvalidArgument as error:
                results[i] = InvalidArgument(f"{shown_key(keys[i])}: {error}", key=keys[i])
                continue
            if capacity < location.size:
                results[i] = BufferTooSmall(
                    f"object {shown_key(keys[i])} is {location.size} bytes but its buffer "
                    f"holds only {capacity}: pass a larger buffer",
                    key=keys[i],
                )
                continue
            results[i] = location.size
            targets[i] = (address, location.size)
        get_path.read(self._session, keys, located, targets, results, deadline, lease_deadline)
        if verify:
            get_path.verify(keys, located, targets, results)
        return results

    def get_into_parts_many(
        self,
        items: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]],
        *,
        verify: bool = False,
    ) -> list[int | KVPoolError]:
        """``get_into_parts`` for every (key, buffers) pair in one batch (one master round
        trip, all transfers in flight together); entry i is the size of object i, or its
        error (InvalidArgument where its buffers' sizes do not add up to it)."""
        pairs, keys = arguments.pair_list("get_into_parts_many", items, "buffers")
        results: list[Any] = [None] * len(pairs)
        layouts: dict[int, list[tuple[int, int, Any]]] = {}
        for i, (key, buffers) in enumerate(pairs):
            try:
                layouts[i] = [writable_address(b) for b in _parts_of(buffers, "buffers")]
            except InvalidArgument as error:
                results[i] = InvalidArgument(f"{shown_key(key)}: {error}", key=key)

        def plan(i: int, location: Any) -> Any:
            layout = layouts[i]
            total = sum(length for _, length, _ in layout)
            if total != location.size:
                return InvalidArgument(
                    f"object {shown_key(keys[i])} is {location.size} bytes but its "
                    f"{len(layout)} buffer(s) hold {total} in all: pass buffers whose sizes "
                    f"add up to exactly {location.size}",
                    key=keys[i],
                )
            split, offset = [], 0
            for address, length, _ in layout:
                split.append((offset, address, length))
                offset += length
            return location.size, (split[0][1] if split else 0, total), split

        return self._read_planned(keys, results, plan, verify=verify)

    def exists_many(self, keys: Sequence[str], *, lease: bool = True) -> list[bool | KVPoolError]:
        """Whether each key is published. Each one that is gets a read lease, as a get would
        (so that a lookup followed by a load finds the object still there); ``lease=False``
        only looks, and pins nothing against removal or eviction."""
        keys = arguments.key_list("exists_many", keys, "exists(key)")
        if arguments.flag("lease", lease):
            fields: dict[str, Any] = {"lease_ms": int(self._session.lease_ttl * 1000)}
        else:
            fields = {"no_lease": True}
        try:
            found = _found(self._keyed_call("Exists", keys, explain_quota=True, **fields), keys)
        except BaseException:
            if lease:  # (its answer may be lost, and the keys leased: given back at close)
                self._remember_leases(valid_keys_of(keys))
            raise
        if lease:  # (given back at close: the keys found, each leased; never an invalid one)
            leased = keys if found.count(True) == len(found) else _leased_keys(keys, found)
            self._remember_leases(leased)
        return found

    def release_leases(self, keys: Sequence[str]) -> int:
        """Ends this client's read leases on ``keys`` now (those its gets and ``exists``
        took), instead of when they run out or the client closes: objects a reader is done
        with can then be removed or evicted, and stop counting against its tenant's leases
        quota. A lease another reader took on an object since is not cut short. Returns how
        many leases ended; invalid keys are skipped (none could have been leased)."""
        keys = valid_keys_of(arguments.key_list("release_leases", keys, "release_leases([key])"))
        if not keys:
            return 0
        with self._leases_lock:  # (before the call: a lease taken again meanwhile is noted)
            pop = self._leased.pop
            for key in keys:
                pop(key, None)
        request = pb.ReleaseLeasesRequest(client_id=self.client_id, keys=keys)
        try:
            return int(self._call("ReleaseLeases", request).released)
        except BaseException:
            self._remember_leases(keys)  # (not given back: close() tries again)
            raise

    def remove_many(self, keys: Sequence[str], *, force: bool = False) -> list[KVPoolError | None]:
        keys = arguments.key_list("remove_many", keys, "remove(key)")
        force = arguments.flag("force", force)
        statuses = self._keyed_call("Remove", keys, force=force)
        return [
            s if isinstance(s, KVPoolError) else None if s == KeyStatus.OK else error_for(s, k)
            for k, s in zip(keys, statuses, strict=True)
        ]

    def remove_prefix(self, prefix: str, *, force: bool = False) -> PrefixRemoval:
        """Removes every object whose key starts with ``prefix``; says what was kept and why.

        The master removes at most 4096 objects per call, so this goes page after page, and
        the client's ``timeout`` bounds each page, not the whole removal (a page that runs out
        of time raises, the pages before it removed: call it again to go on)."""
        if not _prefix(prefix):
            raise InvalidArgument("an empty prefix would remove everything: use remove_all()")
        return self._remove_pages(prefix, arguments.flag("force", force))

    def remove_all(self, *, force: bool = False) -> PrefixRemoval:
        """Removes every object (leased ones and those being written only with ``force``),
        page after page as ``remove_prefix``: the client's ``timeout`` bounds each page of at
        most 4096 objects, not the whole removal."""
        return self._remove_pages("", arguments.flag("force", force))

    def _remove_pages(self, prefix: str, force: bool) -> PrefixRemoval:
        """RemovePrefix page after page (the master removes a bounded number of objects per
        call, so that one removal never holds it long), each page with its own deadline;
        the pages' counts added up. Objects put meanwhile under a page already passed stay."""
        total = PrefixRemoval(0, 0, 0)
        start_after = ""
        while True:
            request = pb.RemovePrefixRequest(prefix=prefix, force=force, start_after=start_after)
            page = self._call("RemovePrefix", request)
            total = add_removals(total, prefix_removal(page))
            following = page.next_start_after
            # (a cursor that does not move on would be a broken master: stop, not loop)
            if not following or following <= start_after or cancelled():
                return total
            start_after = following

    # ------------------------------------------------------------------ listing and status

    def list_keys(self, prefix: str = "", *, limit: int = 0, start_after: str = "") -> KeyPage:
        """One page of published keys with their sizes; page on with ``next_start_after``."""
        limit = arguments.whole("limit", limit, most=arguments.UINT32_MAX)
        prefix = _prefix(prefix)
        start_after = arguments.text("start_after", start_after)
        request = pb.ListKeysRequest(prefix=prefix, limit=limit, start_after=start_after)
        return key_page(self._call("ListKeys", request))

    def stat(self, key: str) -> ObjectInfo:
        """Size, state, replicas and where they are, lease and pin of one object."""
        problem = key_problem(key)
        if problem is not None:
            raise InvalidKey(f"invalid key {shown_key(key)}: {problem}", key=key)
        info = self._call("Stat", pb.StatRequest(key=key))
        if info.status != KeyStatus.OK:
            raise error_for(info.status, key)
        return object_info(info)

    def cluster_status(self) -> ClusterStatus:
        """The master's segments (capacity, use, objects of each) and counts."""
        return cluster_status(self._call("ClusterStatus", pb.ClusterStatusRequest()))

    def story(self, key: str) -> list[StoryEvent]:
        """What happened to ``key`` lately, as the master noted it, oldest first: each put
        reserved, committed and published it, each move, removal, eviction or loss (reads
        are not noted). Empty when the master knows nothing of it, or no longer."""
        problem = key_problem(key)
        if problem is not None:
            raise InvalidKey(f"invalid key {shown_key(key)}: {problem}", key=key)
        return [story_event(e) for e in self._call("Story", pb.StoryRequest(key=key)).events]

    # ------------------------------------------------------------------ zero copy

    def register_buffer(self, buffer: Any) -> RegisteredRegion:
        """Registers a long-lived buffer (e.g. a pool of KV pages) once with UCX.

        Puts from and gets into any part of it then skip per-transfer registration. Keep the
        buffer alive until ``unregister_buffer``.
        """
        try:
            region = self._session.data.register(buffer)
        except (TypeError, ValueError, BufferError, ucp.UcxError) as error:
            raise InvalidArgument(f"cannot register this buffer: {error}") from None
        return RegisteredRegion(region.address, region.length, region)

    def unregister_buffer(self, region: RegisteredRegion) -> None:
        """Ends a registration ``register_buffer`` made; the buffer may go afterwards."""
        if not isinstance(region, RegisteredRegion):
            raise InvalidArgument(
                f"pass what register_buffer returned, not {type(region).__name__}"
            )
        try:
            self._session.data.unregister(region._region)
        except ValueError:
            raise InvalidArgument(
                "this region is not registered with this client: it was unregistered "
                "already, or another client registered it"
            ) from None

    # ------------------------------------------------------------------ internals

    def _write_options(
        self,
        replicas: int | None = None,
        preferred_hosts: Sequence[str] | None = None,
        pin: str | None = None,
        pin_ttl: float = 0.0,
        checksum: bool | None = None,
        tier: str | None = None,
    ) -> WriteOptions:
        if preferred_hosts is None:
            preferred_hosts = (self.host,) if self.prefer_local else ()
        _check_replicas(replicas)
        if checksum is not None:
            arguments.flag("checksum", checksum)
        if replicas is None:
            replicas = self.replicas
        return WriteOptions.build(
            replicas or 0,  # 0 on the wire: the master's default
            preferred_hosts,
            pin,
            pin_ttl,
            self.checksum if checksum is None else checksum,
            tier,
        )

    def _locate(
        self, keys: Sequence[str], valid: Sequence[int], results: list[Any], deadline: float
    ) -> tuple[dict[int, Any], float]:
        """``get_path.locate``, the keys it may have leased noted for ``close`` to give back:
        those located, and those whose master call failed (its answer may be lost, the lease
        taken; giving back a lease never taken is harmless)."""
        unanswered: list[int] = []
        try:
            located, lease_deadline = get_path.locate(
                self._session, keys, valid, results, deadline, unanswered
            )
        except BaseException:
            self._remember_leases([keys[i] for i in valid])
            raise
        if unanswered:
            self._remember_leases([keys[i] for i in (*located, *unanswered)])
        else:
            self._remember_leases(_located_keys(keys, located))
        return located, lease_deadline

    def _read_planned(
        self,
        keys: Sequence[str],
        results: list[Any],
        plan: Callable[[int, Any], Any],
        *,
        verify: bool = False,
    ) -> list[Any]:
        """Locates ``keys`` (those whose ``results`` entry is still None) and reads what
        ``plan(i, location)`` asks of each located one: (result, target, pieces), see
        get_path.read, or the error for it. Fills ``results`` and returns it."""
        verify = arguments.flag("verify", verify)
        deadline = time.monotonic() + self.timeout
        asked = {i for i, result in enumerate(results) if result is None}
        valid = [i for i in self._valid_keys(keys, results) if i in asked]
        located, lease_deadline = self._locate(keys, valid, results, deadline)
        targets: dict[int, tuple[int, int]] = {}
        pieces: dict[int, Sequence[tuple[int, int, int]]] = {}
        for i, location in located.items():
            planned = plan(i, location)
            if isinstance(planned, KVPoolError):
                results[i] = planned
                continue
            results[i], targets[i], pieces[i] = planned
        get_path.read(
            self._session, keys, located, targets, results, deadline, lease_deadline, pieces
        )
        if verify:
            get_path.verify(keys, located, targets, results, pieces)
        return results

    def _call(self, method: str, request: Any) -> Any:
        return self._session.link.call(method, request, time.monotonic() + self.timeout)

    def _keyed_call(
        self, method: str, keys: Sequence[str], *, explain_quota: bool = False, **fields: Any
    ) -> list[Any]:
        """A per-key master call: entry i is key i's status, or InvalidKey without asking.
        More keys than one master call takes go in parts, within one deadline; a part after
        the first that fails gives its error to its keys (``batch_split``).
        ``explain_quota``: a refused lease is its QuotaExceeded, with the master's figures
        (the response's ``quota_refusal``)."""
        request_of = getattr(pb, f"{method}Request")
        results: list[Any] = [None] * len(keys)
        valid = self._valid_keys(keys, results)
        if len(valid) == len(keys) and len(keys) <= lp.MAX_BATCH_KEYS:  # the common case
            request = request_of(client_id=self.client_id, keys=keys, **fields)
            response = self._call(method, request)
            if explain_quota and response.quota_refusal:
                return _quota_explained(response, keys)
            return list(response.statuses)
        deadline = time.monotonic() + self.timeout

        def call_part(positions: Sequence[int]) -> bool:
            part = [keys[i] for i in positions]
            request = request_of(client_id=self.client_id, keys=part, **fields)
            response = self._session.link.call(method, request, deadline)
            statuses = response.statuses
            if explain_quota and response.quota_refusal:
                statuses = _quota_explained(response, part)
            for i, status in zip(positions, statuses, strict=True):
                results[i] = status
            return True

        batch_split.answer_each_part(valid, keys.__getitem__, results, call_part)
        return results

    @staticmethod
    def _valid_keys(keys: Sequence[str], results: list[Any]) -> list[int]:
        """Positions of the valid keys; each invalid one's error goes into ``results``."""
        if plainly_valid(keys):  # the common case, in one pass
            return list(range(len(keys)))
        valid = []
        for i, key in enumerate(keys):
            problem = key_problem(key)
            if problem is None:
                valid.append(i)
            else:
                results[i] = InvalidKey(f"invalid key {shown_key(key)}: {problem}", key=key)
        return valid

    # ------------------------------------------------------------------ torch tensors
    # (client/tensors.py; torch is imported there, on first use, never by ``import kvpool``)

    def put_tensor(self, key: str, tensor: Any, **options: Any) -> int:
        """Stores a CPU ``torch.Tensor`` with its dtype and shape (a small header, then its
        bytes, in one object) for ``get_tensor``; returns the replicas stored, as ``put``.
        Options as for ``put_many``. (Its bytes are staged once: a copy.)"""
        _check_options("put_tensor", options)
        return _raise_if_error(self.put_tensors([(key, tensor)], **options)[0])

    def put_tensors(
        self, items: Mapping[str, Any] | Iterable[tuple[str, Any]], **options: Any
    ) -> list[int | KVPoolError]:
        """``put_tensor`` for every (key, tensor) pair, in one batch, as ``put_many`` (a key
        given twice included: its later entries get InvalidArgument)."""
        from kvpool.client import tensors

        return tensors.put_tensors(self, items, **options)

    def get_tensor(self, key: str, *, verify: bool = False) -> Any:
        """A new CPU ``torch.Tensor`` of the dtype and shape ``put_tensor`` stored (no copy)."""
        return _raise_if_error(self.get_tensors([key], verify=verify)[0])

    def get_tensors(self, keys: Sequence[str], *, verify: bool = False) -> list[Any]:
        """``get_tensor`` of every key in one batch; entry i is a tensor or key i's error."""
        from kvpool.client import tensors

        return tensors.get_tensors(self, keys, verify)

    def get_tensor_into(self, key: str, tensor: Any, *, verify: bool = False) -> Any:
        """Reads what ``put_tensor`` stored into ``tensor`` (contiguous, CPU, same dtype and
        shape, else InvalidArgument) and returns it. (Staged once: a copy.)"""
        from kvpool.client import tensors

        return tensors.get_tensor_into(self, key, tensor, verify)


#: The options of a put (``put_many``'s keyword arguments), which the single calls pass on.
WRITE_OPTIONS = ("replicas", "preferred_hosts", "pin", "pin_ttl", "checksum", "tier")


def _check_options(call: str, options: Mapping[str, Any]) -> None:
    """A misspelt option is named with the call it was given to (not the batch call that
    the single one passes its options on to)."""
    for name in options:
        if name not in WRITE_OPTIONS:
            raise TypeError(
                f"{call}() got an unexpected keyword argument {name!r}; its options are "
                f"{', '.join(WRITE_OPTIONS)}"
            )


def _check_replicas(replicas: object) -> None:
    """A replica count is a whole number of copies, at least 1 (None: the default). The
    master has its own upper limit, and answers InvalidArgument beyond it."""
    if replicas is None:
        return
    if (
        isinstance(replicas, bool)
        or not isinstance(replicas, int)
        or not 1 <= replicas <= arguments.UINT32_MAX
    ):
        raise InvalidArgument(
            f"replicas must be a whole number of copies, at least 1, got {replicas!r}: pass "
            "1 or more (the master answers InvalidArgument above its own limit), or None for "
            "the master's default (kvpool master --default-replicas)"
        )


#: A part of a large put is not sent once less time is left than this share of what it would
#: take at the time per key of the part before: it would most likely run out in its writes,
#: or leave its keys reserved (being written) with PutStart's answer come too late, for no
#: object stored.
PART_TIME_SHARE = 0.5


def _too_late(left: float, expected: float) -> bool:
    """Whether a part of a large put, with ``left`` seconds to go, is better not sent;
    ``expected``: what it would take, at the last (whole) part's time per key."""
    return left <= 0 or left < expected * PART_TIME_SHARE


def _distinct(keys: Sequence[Any]) -> bool:
    """Whether no key is given twice (keys that cannot be hashed are not valid keys: the key
    check refuses them later, so they count as distinct here)."""
    try:
        return len(set(keys)) == len(keys)
    except TypeError:
        return False  # (then looked at one by one)


def _refuse_repeats(keys: Sequence[Any], sent: dict[int, Any], results: list[Any]) -> None:
    """Takes each entry whose key an earlier one of ``sent`` has out of ``sent``, its result
    an InvalidArgument. Why: the master would answer the later entry ObjectBeingWritten, whose
    advice (remove with force=True, put again) would remove what the first entry stored."""
    if len(sent) == len(keys) and _distinct(keys):  # the common case, in one pass
        return
    first: dict[Any, int] = {}
    for i in list(sent):
        key = keys[i]
        try:
            j = first.setdefault(key, i)
        except TypeError:  # (no valid key: refused by the key check)
            continue
        if j != i:
            del sent[i]
            results[i] = InvalidArgument(
                f"key {shown_key(key)} appears more than once in this batch (entry {j}, "
                f"and again entry {i}): entry {j} puts it, this entry was not sent. Objects "
                "are immutable: give each key once",
                key=key,
            )


def _check_range(offset: object, length: object, verify: bool) -> None:
    """A range is a whole number of bytes from a whole offset, neither negative; a ranged
    read cannot be verified (the writer's checksum is of the whole object)."""
    for name, value in (("offset", offset), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"{name} must be a whole number of bytes >= 0, got {value!r}")
    if verify:
        raise InvalidArgument(
            "verify=True cannot check a ranged read: the writer's checksum covers the whole "
            "object. Read it whole (get, get_into, get_into_parts) to verify it"
        )


def _outside(key: str, size: int, offset: int, length: int) -> InvalidArgument | None:
    """The error for a range that does not lie inside an object of ``size`` bytes."""
    if offset + length <= size:
        return None
    return InvalidArgument(
        f"the range of {length} byte(s) from offset {offset} (bytes {offset} to "
        f"{offset + length}) falls outside object {shown_key(key)}, which is {size} bytes: "
        f"ask for a range within 0 to {size}",
        key=key,
    )


def _parts_of(parts: object, name: str) -> Sequence[Any]:
    """``parts`` when it is a list (or other sequence) of buffers, not one buffer."""
    if isinstance(parts, list | tuple):  # (the common case, at once)
        return parts
    # (one buffer is refused: an array.array, say, is a Sequence too)
    one = isinstance(parts, str) or arguments.one_buffer(parts)
    if isinstance(parts, Sequence) and not one:
        return parts
    raise InvalidArgument(
        f"{name} must be a list of buffers, not {type(parts).__name__}: for one buffer, "
        f"pass [{name[:-1]}]"
    )


def _quota_explained(response: Any, keys: Sequence[str]) -> list[Any]:
    """``response``'s statuses, each refused lease (QUOTA_EXCEEDED) as its QuotaExceeded
    saying the master's figures of the tenant's quota (``quota_refusal``)."""
    refused, why = KeyStatus.QUOTA_EXCEEDED.value, response.quota_refusal
    return [
        error_for(s, k, why) if s == refused else s
        for s, k in zip(response.statuses, keys, strict=True)
    ]


def _found(statuses: list[Any], keys: Sequence[str]) -> list[bool | KVPoolError]:
    """True where published; an error where the lease asked for was refused (quota)."""
    ok, refused = KeyStatus.OK.value, KeyStatus.QUOTA_EXCEEDED.value
    if refused not in statuses and set(map(type, statuses)) <= {int}:  # (the common case)
        return [s == ok for s in statuses]
    return [
        s if isinstance(s, KVPoolError) else error_for(s, k) if s == refused else s == ok
        for s, k in zip(statuses, keys, strict=True)
    ]


def _leased_keys(keys: Sequence[str], found: Sequence[Any]) -> list[str]:
    """The keys an Exists may have leased, of those it asked about: those it found, and
    those of a part of the batch that failed (its answer may be lost, the leases taken);
    not an invalid key (it may not even be hashable) nor one whose lease was refused."""
    return [
        key
        for key, f in zip(keys, found, strict=True)
        if f is True or (f is not False and not isinstance(f, InvalidKey | QuotaExceeded))
    ]


def _located_keys(keys: Sequence[str], located: Mapping[int, Any]) -> Sequence[str]:
    """The keys of ``located`` (positions in ``keys``): as a rule all of them, as they are."""
    return keys if len(located) == len(keys) else [keys[i] for i in located]


def _prefix(prefix: object) -> str:
    """``prefix`` checked: text, and no longer than a key (an admin names keys behind their
    tenant's name: up to STORED_KEY_BYTES). A longer one can match no key; refused by name,
    else the request is too large for the master, whose refusal speaks of batches."""
    checked = arguments.text("prefix", prefix)
    if len(checked) > STORED_KEY_BYTES // 4 and (size := len(checked.encode())) > STORED_KEY_BYTES:
        raise InvalidArgument(
            f"prefix {shown_key(checked)} is {size} bytes of UTF-8, longer than the longest key "
            f"({MAX_KEY_BYTES} bytes; {STORED_KEY_BYTES} with its tenant's name, as an admin "
            "names keys): it can match no key; give a shorter prefix"
        )
    return checked


def _close_dropped(session: Session, master: str) -> None:
    """Lets go of what a Client collected without ``close()`` held (its finalizer). Its
    leases and reservations are left to run out at the master (no call from a collection).
    The session is closed on a thread of its own: a collection runs on whichever thread
    happens to drop the last reference, which may be one of the session's own (that would
    join itself) or hold a lock its close takes."""
    if session.forked:  # (a fork child's copy of the parent's: left alone)
        return
    # (closed first: a warning turned into an error, -W error, must not keep it open)
    threading.Thread(target=session.close, name="kvpool-client-close", daemon=True).start()
    warnings.warn(
        f"a kvpool Client of {master} was never closed: use `with Client(...)` or close() "
        "(its connections and memory are let go of now)",
        ResourceWarning,
        stacklevel=1,  # (a collection has no caller worth naming)
    )


def _raise_if_error(result: Any) -> Any:
    if isinstance(result, KVPoolError):
        raise result
    return result
