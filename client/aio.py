"""``kvpool.aio.AsyncClient``: the calls of ``Client`` as coroutines, many in flight at once.

Why threads, not a second client: ``Client`` is thread-safe with calls that overlap (each
master call on a lane connection of its own, each transfer on a UCX worker of its own), and
its calls spend most of their time waiting without the GIL (on the master's answers, on UCX,
in memory copies). So each coroutine hands its call to a small pool of threads (``threads``,
the calls in flight at most; more wait for a thread) and awaits it: one implementation of
every rule, error and deadline, and the event loop never blocks. Any running loop will do
(uvloop's too), and one client may serve several loops.

Cancellation. A call under way cannot be interrupted mid-step (a master round trip, a
transfer), but it is told to take no further step (client/cancellation.py), and a cancelled
coroutine raises ``CancelledError`` only once its call has stopped. Hence:

* a cancelled read (``get_into``, ``get_range_into``, ``get_into_parts``, ...) never writes
  into the caller's buffers after ``CancelledError`` is raised. Reads go straight into those
  buffers (zero copy, no bounce buffer), so a read cancelled during its transfer leaves them
  holding some or all of the object; one cancelled before its transfer leaves them as they
  were;
* a cancelled put reads the caller's buffers no more after ``CancelledError``, and its keys
  are then free (their reservations given back: PutRevoke) unless its commit was already
  sent, in which case each key is published whole. Nothing is ever half-visible;
* a cancelled ``reserve`` or ``register_buffer`` that got through is undone (revoked,
  unregistered); a cancelled ``Reservation.write`` revokes its reservation;
* a call cancelled while it waits for a thread never runs, and CancelledError comes at once.

Waiting for a call to stop is bounded by the client's ``timeout``, like the call itself. The
timeout runs from when a thread takes the call up: time spent waiting for a free thread does
not count (wrap calls in ``asyncio.timeout`` to bound that too).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kvpool.client.cancellation import CancelScope, run_in_scope
from kvpool.client.client import Client
from kvpool.client.reservation import Reservation
from kvpool.client.types import (
    ClusterStatus,
    KeyPage,
    ObjectInfo,
    PrefixRemoval,
    RegisteredRegion,
    StoryEvent,
)
from kvpool.errors import ClientClosed, InvalidArgument, KVPoolError

T = TypeVar("T")

#: Calls in flight at most, by default (each on a thread of its own; more wait for one).
DEFAULT_THREADS = 8


class AsyncClient:
    """A kvpool client for asyncio code: ``async with AsyncClient(...) as client``.

    ``master`` and every keyword argument but ``threads`` are those of ``Client`` (timeout,
    replicas, credentials, ...); calls, their results and their errors are ``Client``'s, as
    coroutines. ``threads`` is how many calls run at once; further calls wait for one of
    them to finish. See the module's docstring for what cancelling a call does.
    ``timeout``, ``replicas``, ``checksum`` and ``prefer_local`` may be set later, as on
    ``Client`` (checked there; calls started afterwards follow them).
    """

    # (no __dict__: an attribute the client does not have, set by mistake, e.g. a setting of
    # the Client's misspelt, would take no effect and say nothing)
    __slots__ = ("__weakref__", "_client", "_closed", "_threads")

    def __init__(
        self, master: str | None = None, *, threads: int = DEFAULT_THREADS, **options: Any
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidArgument(f"threads must be an integer >= 1, got {threads!r}")
        self._client = Client(master, **options)
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="kvpool-aio")
        self._closed = False

    @property
    def master(self) -> str:
        return self._client.master

    # (the settings ``Client`` lets be set later pass through to it, checked there: calls
    # run on the wrapped client, so a value kept here would change nothing)

    @property
    def timeout(self) -> float:
        """As ``Client.timeout``; settable (checked as the constructor's)."""
        return self._client.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._client.timeout = value

    @property
    def replicas(self) -> int | None:
        """As ``Client.replicas``; settable (checked as the constructor's)."""
        return self._client.replicas

    @replicas.setter
    def replicas(self, value: int | None) -> None:
        self._client.replicas = value

    @property
    def checksum(self) -> bool:
        """As ``Client.checksum``; settable (True or False)."""
        return self._client.checksum

    @checksum.setter
    def checksum(self, value: bool) -> None:
        self._client.checksum = value

    @property
    def prefer_local(self) -> bool:
        """As ``Client.prefer_local``; settable (True or False)."""
        return self._client.prefer_local

    @prefer_local.setter
    def prefer_local(self, value: bool) -> None:
        self._client.prefer_local = value

    @property
    def client_id(self) -> str:
        return self._client.client_id

    @property
    def host(self) -> str:
        return self._client.host

    @property
    def retries(self) -> int:
        """Master calls retried because the master was unreachable or shedding load."""
        return self._client.retries

    @property
    def mapped_segments(self) -> list[str]:
        """As ``Client.mapped_segments``."""
        return self._client.mapped_segments

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Waits for the calls in flight, then closes as ``Client.close`` does."""
        if self._closed:
            return
        self._closed = True
        if self._client._session.forked:  # a fork child's copy: its threads never ran here
            self._client.close()
            return
        future = asyncio.get_running_loop().run_in_executor(None, self._close)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            await _outlast(future)  # (closing is not undone halfway)
            raise

    def _close(self) -> None:
        self._threads.shutdown(wait=True)
        self._client.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ single-key API

    async def put(self, key: str, data: Any, **options: Any) -> int:
        """As ``Client.put``: the replicas stored. Keep ``data`` unchanged until it returns."""
        return await self._call(functools.partial(self._client.put, key, data, **options))

    async def get(self, key: str, *, verify: bool = False) -> bytes:
        return await self._call(functools.partial(self._client.get, key, verify=verify))

    async def get_into(self, key: str, buffer: Any, *, verify: bool = False) -> int:
        """As ``Client.get_into``: the object's size, its bytes in ``buffer`` (zero copy)."""
        return await self._call(
            functools.partial(self._client.get_into, key, buffer, verify=verify)
        )

    async def get_range(self, key: str, offset: int, length: int, *, verify: bool = False) -> bytes:
        return await self._call(
            functools.partial(self._client.get_range, key, offset, length, verify=verify)
        )

    async def get_range_into(
        self,
        key: str,
        buffer: Any,
        offset: int = 0,
        length: int | None = None,
        *,
        verify: bool = False,
    ) -> int:
        return await self._call(
            functools.partial(
                self._client.get_range_into, key, buffer, offset, length, verify=verify
            )
        )

    async def put_parts(self, key: str, parts: Sequence[Any], **options: Any) -> int:
        return await self._call(functools.partial(self._client.put_parts, key, parts, **options))

    async def get_into_parts(
        self, key: str, buffers: Sequence[Any], *, verify: bool = False
    ) -> int:
        return await self._call(
            functools.partial(self._client.get_into_parts, key, buffers, verify=verify)
        )

    async def exists(self, key: str, *, lease: bool = True) -> bool:
        return await self._call(functools.partial(self._client.exists, key, lease=lease))

    async def remove(self, key: str, *, force: bool = False) -> None:
        await self._call(functools.partial(self._client.remove, key, force=force))

    # ------------------------------------------------------------------ batch API

    async def put_many(
        self, items: Mapping[str, Any] | Iterable[tuple[str, Any]], **options: Any
    ) -> list[int | KVPoolError]:
        """As ``Client.put_many``: entry i the replicas stored for key i, or its error."""
        items = _materialised(items)
        return await self._call(functools.partial(self._client.put_many, items, **options))

    async def put_parts_many(
        self,
        items: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]],
        **options: Any,
    ) -> list[int | KVPoolError]:
        items = _materialised(items)
        return await self._call(functools.partial(self._client.put_parts_many, items, **options))

    async def get_many(
        self, keys: Sequence[str], *, verify: bool = False
    ) -> list[bytes | KVPoolError]:
        return await self._call(functools.partial(self._client.get_many, keys, verify=verify))

    async def get_into_many(
        self, keys: Sequence[str], buffers: Sequence[Any], *, verify: bool = False
    ) -> list[int | KVPoolError]:
        return await self._call(
            functools.partial(self._client.get_into_many, keys, buffers, verify=verify)
        )

    async def get_into_parts_many(
        self,
        items: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]],
        *,
        verify: bool = False,
    ) -> list[int | KVPoolError]:
        items = _materialised(items)
        return await self._call(
            functools.partial(self._client.get_into_parts_many, items, verify=verify)
        )

    async def exists_many(
        self, keys: Sequence[str], *, lease: bool = True
    ) -> list[bool | KVPoolError]:
        return await self._call(functools.partial(self._client.exists_many, keys, lease=lease))

    async def release_leases(self, keys: Sequence[str]) -> int:
        return await self._call(functools.partial(self._client.release_leases, keys))

    async def remove_many(
        self, keys: Sequence[str], *, force: bool = False
    ) -> list[KVPoolError | None]:
        return await self._call(functools.partial(self._client.remove_many, keys, force=force))

    async def remove_prefix(self, prefix: str, *, force: bool = False) -> PrefixRemoval:
        return await self._call(functools.partial(self._client.remove_prefix, prefix, force=force))

    async def remove_all(self, *, force: bool = False) -> PrefixRemoval:
        return await self._call(functools.partial(self._client.remove_all, force=force))

    # ------------------------------------------------------------------ listing and status

    async def list_keys(
        self, prefix: str = "", *, limit: int = 0, start_after: str = ""
    ) -> KeyPage:
        return await self._call(
            functools.partial(self._client.list_keys, prefix, limit=limit, start_after=start_after)
        )

    async def stat(self, key: str) -> ObjectInfo:
        return await self._call(functools.partial(self._client.stat, key))

    async def cluster_status(self) -> ClusterStatus:
        return await self._call(self._client.cluster_status)

    async def story(self, key: str) -> list[StoryEvent]:
        return await self._call(functools.partial(self._client.story, key))

    # ------------------------------------------------------------------ zero copy

    async def register_buffer(self, buffer: Any) -> RegisteredRegion:
        """As ``Client.register_buffer`` (registering a large buffer takes a while)."""

        def undo(region: RegisteredRegion | None, error: BaseException | None) -> None:
            if region is not None and error is None:
                self._client.unregister_buffer(region)

        return await self._call(functools.partial(self._client.register_buffer, buffer), undo)

    async def unregister_buffer(self, region: RegisteredRegion) -> None:
        await self._call(functools.partial(self._client.unregister_buffer, region))

    # ------------------------------------------------------------------ explicit steps

    async def reserve(self, key: str, size: int, **options: Any) -> AsyncReservation:
        """As ``Client.reserve``; a reserve cancelled once the space was reserved revokes it."""

        def undo(reservation: Reservation | None, error: BaseException | None) -> None:
            if reservation is not None and error is None:
                _revoke_quietly(reservation)

        reservation = await self._call(
            functools.partial(self._client.reserve, key, size, **options), undo
        )
        return AsyncReservation(self, reservation)

    # ------------------------------------------------------------------ torch tensors

    async def put_tensor(self, key: str, tensor: Any, **options: Any) -> int:
        return await self._call(functools.partial(self._client.put_tensor, key, tensor, **options))

    async def put_tensors(
        self, items: Mapping[str, Any] | Iterable[tuple[str, Any]], **options: Any
    ) -> list[int | KVPoolError]:
        items = _materialised(items)
        return await self._call(functools.partial(self._client.put_tensors, items, **options))

    async def get_tensor(self, key: str, *, verify: bool = False) -> Any:
        return await self._call(functools.partial(self._client.get_tensor, key, verify=verify))

    async def get_tensors(self, keys: Sequence[str], *, verify: bool = False) -> list[Any]:
        return await self._call(functools.partial(self._client.get_tensors, keys, verify=verify))

    async def get_tensor_into(self, key: str, tensor: Any, *, verify: bool = False) -> Any:
        return await self._call(
            functools.partial(self._client.get_tensor_into, key, tensor, verify=verify)
        )

    # ------------------------------------------------------------------ internals

    async def _call(
        self,
        call: Callable[[], T],
        undo: Callable[[T | None, BaseException | None], None] | None = None,
    ) -> T:
        """Runs ``call`` on one of the client's threads and returns what it returns.

        Cancelled, it tells the call to stop, waits until it has, runs ``undo`` (when given,
        on a thread) with what the call returned or raised, and only then lets
        CancelledError through."""
        if self._closed:
            raise ClientClosed("this AsyncClient is closed: make a new one")
        # (in a fork child, the pool's threads are the parent's: a call handed to them would
        # wait for ever)
        self._client._session.check_process()
        loop = asyncio.get_running_loop()
        scope = CancelScope()
        started = self._threads.submit(run_in_scope, scope, call)
        future = asyncio.wrap_future(started, loop=loop)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            never_ran = started.cancel()  # (it had no thread yet)
            if not never_ran:
                scope.cancel()
                await _outlast(future)
            if undo is not None:
                result, error = (None, asyncio.CancelledError()) if never_ran else _outcome(future)
                await _outlast(loop.run_in_executor(None, undo, result, error))
            raise


class AsyncReservation:
    """``Client.reserve``'s Reservation, its steps as coroutines. A write that is cancelled
    revokes the reservation; so does a commit cancelled before it was sent (one cancelled
    later leaves the object published whole, or not at all)."""

    def __init__(self, client: AsyncClient, reservation: Reservation) -> None:
        self._client = client
        self._reservation = reservation
        self.key = reservation.key
        self.size = reservation.size
        self.put_id = reservation.put_id
        self.replicas = reservation.replicas

    async def write(self, data: Any) -> None:
        reservation = self._reservation
        await self._client._call(
            functools.partial(reservation.write, data), lambda _, __: _revoke_quietly(reservation)
        )

    async def commit(self) -> int:
        reservation = self._reservation

        def undo(replicas: int | None, error: BaseException | None) -> None:
            if error is not None:
                _revoke_quietly(reservation)  # (not committed: nothing to keep)

        return await self._client._call(reservation.commit, undo)

    async def revoke(self) -> None:
        await self._client._call(self._reservation.revoke)


async def _outlast(future: asyncio.Future[Any]) -> None:
    """Waits until ``future`` is done, whatever cancels the waiting meanwhile (the caller is
    on its way out with a CancelledError already)."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait((future,))
    if not future.cancelled():
        future.exception()  # (retrieved: how a cancelled call ended is nobody's news)


def _outcome(future: asyncio.Future[Any]) -> tuple[Any, BaseException | None]:
    """What a finished call returned, or what it raised."""
    if future.cancelled():
        return None, asyncio.CancelledError()
    error = future.exception()
    return (None, error) if error is not None else (future.result(), None)


def _revoke_quietly(reservation: Reservation) -> None:
    """Gives a reservation up; where the master cannot be told, it runs out by itself."""
    with contextlib.suppress(KVPoolError):
        reservation.revoke()


def _materialised(items: Any) -> Any:
    """``items`` as a list when it is a one-shot iterator (it is consumed on another thread)."""
    if isinstance(items, Mapping | list | tuple | str | bytes) or not isinstance(items, Iterable):
        return items  # (what is not a batch is refused by the call, which says why)
    return list(items)
