"""``kvpool.Client``: put and get objects; metadata through the master, bytes over UCX.

Every operation is a batch underneath (a single op is a batch of one): one master round trip
to reserve or locate all keys, all transfers in flight together, one round trip to commit.
Batch methods return one entry per key, in order: the value, or the exception instance for
that key (they raise only for whole-call failures such as MasterUnavailable).
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvpool.client.buffers import new_bytes, readable_address, writable_address
from kvpool.client.data_path import DataPath, Transfer
from kvpool.client.master_link import MasterLink
from kvpool.client.outcomes import error_for
from kvpool.client.reservation import PendingPut, Reservation
from kvpool.common.keys import key_problem
from kvpool.common.master_address import resolve_master
from kvpool.common.status import KeyStatus
from kvpool.errors import (
    BufferTooSmall,
    InvalidArgument,
    InvalidKey,
    KVPoolError,
    LeaseExpired,
    TransferError,
)
from kvpool.proto import master_pb2 as pb
from kvpool.transport import ucp

DEFAULT_TIMEOUT = 10.0


class Client:
    """A kvpool client. Thread-safe; use one per process and close it (or use ``with``).

    ``master`` is ``HOST:PORT`` (default: ``$KVPOOL_MASTER``). ``replicas`` is the number of
    copies a put asks for (0: the master's default). ``timeout`` bounds every call, master
    round trips and transfers together. ``lease_ttl`` asks for read leases of that many
    seconds (0: the master's default). ``ucx_config`` overrides UCX settings by name without
    the ``UCX_`` prefix, e.g. ``{"TLS": "tcp"}``.
    """

    def __init__(
        self,
        master: str | None = None,
        *,
        replicas: int = 0,
        timeout: float = DEFAULT_TIMEOUT,
        lease_ttl: float = 0.0,
        ucx_config: Mapping[str, str] | None = None,
    ) -> None:
        try:
            address = resolve_master(master)
        except ValueError as error:
            raise InvalidArgument(str(error)) from None
        if replicas < 0:
            raise InvalidArgument(f"replicas must be 0 (master default) or more, got {replicas}")
        if timeout <= 0:
            raise InvalidArgument(f"timeout must be positive seconds, got {timeout}")
        self.master = address
        self.replicas = replicas
        self.timeout = timeout
        self.lease_ttl = lease_ttl
        self.client_id = uuid.uuid4().hex
        self.host = socket.gethostname()
        self._link = MasterLink(address)
        self._data = DataPath(ucx_config)
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._data.close()
            self._link.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ single-key API

    def put(self, key: str, data: Any, *, replicas: int | None = None) -> None:
        """Stores ``data`` (bytes or any contiguous buffer) under ``key``, zero-copy."""
        _raise_if_error(self.put_many([(key, data)], replicas=replicas)[0])

    def get(self, key: str) -> bytes:
        return _raise_if_error(self.get_many([key])[0])

    def get_into(self, key: str, buffer: Any) -> int:
        """Reads the object straight into ``buffer`` (writable, contiguous); returns its size."""
        return _raise_if_error(self.get_into_many([key], [buffer])[0])

    def exists(self, key: str) -> bool:
        return _raise_if_error(self.exists_many([key])[0])

    def remove(self, key: str, *, force: bool = False) -> None:
        _raise_if_error(self.remove_many([key], force=force)[0])

    # ------------------------------------------------------------------ batch API

    def put_many(
        self,
        items: Mapping[str, Any] | Iterable[tuple[str, Any]],
        *,
        replicas: int | None = None,
    ) -> list[KVPoolError | None]:
        """Stores every (key, data) pair; entry i is None on success or the error for key i."""
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        deadline = time.monotonic() + self.timeout
        results: list[KVPoolError | None] = [None] * len(pairs)
        sources: dict[int, tuple[int, int, Any]] = {}
        for i, (key, data) in enumerate(pairs):
            problem = key_problem(key)
            if problem is not None:
                results[i] = InvalidKey(f"invalid key {key!r}: {problem}", key=key)
                continue
            try:
                sources[i] = readable_address(data)
            except InvalidArgument as error:
                results[i] = InvalidArgument(f"{key!r}: {error}", key=key)
        if not sources:
            return results
        order = list(sources)
        keys = [pairs[i][0] for i in order]
        slots = self._reserve(keys, [sources[i][1] for i in order], replicas, deadline)
        puts = []
        for i, key, slot in zip(order, keys, slots, strict=True):
            if slot.status == KeyStatus.OK:
                puts.append(PendingPut(i, key, slot, sources[i]))
            else:
                results[i] = error_for(slot.status, key, slot.message)
        self._write(puts, deadline)
        for put, status in zip(puts, self._commit(puts, deadline), strict=True):
            if status != KeyStatus.OK:
                results[put.index] = error_for(status, put.key, "; ".join(filter(None, put.errors)))
        return results

    def reserve(self, key: str, size: int, *, replicas: int | None = None) -> Reservation:
        """Low-level put in explicit steps: reserve now, then ``write``, ``commit``/``revoke``.

        ``put`` does all three at once; this exists for callers that produce the bytes after
        reserving (and for tests of what readers see in between).
        """
        problem = key_problem(key)
        if problem is not None:
            raise InvalidKey(f"invalid key {key!r}: {problem}", key=key)
        deadline = time.monotonic() + self.timeout
        slot = self._reserve([key], [size], replicas, deadline)[0]
        if slot.status != KeyStatus.OK:
            raise error_for(slot.status, key, slot.message)
        return Reservation(self, PendingPut(0, key, slot, None), size)

    def get_many(self, keys: Sequence[str]) -> list[bytes | KVPoolError]:
        """Reads every key; entry i is the object's bytes or the error for key i."""
        deadline = time.monotonic() + self.timeout
        results: list[Any] = [None] * len(keys)
        located, lease_deadline = self._locate(keys, results, deadline)
        targets = {}
        for i, location in located.items():
            data, address = new_bytes(location.size)
            results[i] = data
            targets[i] = (address, location.size)
        self._read(keys, located, targets, results, deadline, lease_deadline)
        return [bytes(r) if isinstance(r, bytearray) else r for r in results]

    def get_into_many(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[int | KVPoolError]:
        """Reads key i into buffers[i]; entry i is the object's size or the error for key i."""
        if len(keys) != len(buffers):
            raise InvalidArgument(f"{len(keys)} keys but {len(buffers)} buffers: pass one per key")
        deadline = time.monotonic() + self.timeout
        results: list[Any] = [None] * len(keys)
        located, lease_deadline = self._locate(keys, results, deadline)
        targets = {}
        for i, location in list(located.items()):
            try:
                address, capacity, _ = writable_address(buffers[i])
            except InvalidArgument as error:
                results[i] = InvalidArgument(f"{keys[i]!r}: {error}", key=keys[i])
                del located[i]
                continue
            if capacity < location.size:
                results[i] = BufferTooSmall(
                    f"object {keys[i]!r} is {location.size} bytes but its buffer holds only "
                    f"{capacity}: pass a larger buffer",
                    key=keys[i],
                )
                del located[i]
                continue
            results[i] = location.size
            targets[i] = (address, location.size)
        self._read(keys, located, targets, results, deadline, lease_deadline)
        return results

    def exists_many(self, keys: Sequence[str]) -> list[bool | KVPoolError]:
        deadline = time.monotonic() + self.timeout
        results: list[Any] = [None] * len(keys)
        valid = self._valid_keys(keys, results)
        if valid:
            response = self._link.call(
                "Exists",
                pb.ExistsRequest(client_id=self.client_id, keys=[keys[i] for i in valid]),
                deadline,
            )
            for i, status in zip(valid, response.statuses, strict=True):
                results[i] = status == KeyStatus.OK
        return results

    def remove_many(self, keys: Sequence[str], *, force: bool = False) -> list[KVPoolError | None]:
        deadline = time.monotonic() + self.timeout
        results: list[Any] = [None] * len(keys)
        valid = self._valid_keys(keys, results)
        if valid:
            response = self._link.call(
                "Remove",
                pb.RemoveRequest(
                    client_id=self.client_id, keys=[keys[i] for i in valid], force=force
                ),
                deadline,
            )
            for i, status in zip(valid, response.statuses, strict=True):
                results[i] = None if status == KeyStatus.OK else error_for(status, keys[i])
        return results

    # ------------------------------------------------------------------ listing and status

    def list_keys(
        self, prefix: str = "", *, limit: int = 0, start_after: str = ""
    ) -> pb.ListKeysResponse:
        """One page of published keys with their sizes; page on with ``next_start_after``."""
        return self._link.call(
            "ListKeys",
            pb.ListKeysRequest(prefix=prefix, limit=limit, start_after=start_after),
            time.monotonic() + self.timeout,
        )

    def cluster_status(self) -> pb.ClusterStatusResponse:
        return self._link.call(
            "ClusterStatus", pb.ClusterStatusRequest(), time.monotonic() + self.timeout
        )

    # ------------------------------------------------------------------ zero copy

    def register_buffer(self, buffer: Any) -> ucp.MemoryRegion:
        """Registers a long-lived buffer (e.g. a pool of KV pages) once with UCX.

        Puts from and gets into any part of it then skip per-transfer registration. Keep the
        buffer alive until ``unregister_buffer``.
        """
        try:
            return self._data.register(buffer)
        except (TypeError, ValueError, BufferError) as error:
            raise InvalidArgument(f"cannot register this buffer: {error}") from None

    def unregister_buffer(self, region: ucp.MemoryRegion) -> None:
        self._data.unregister(region)

    # ------------------------------------------------------------------ internals

    def _reserve(
        self, keys: list[str], sizes: list[int], replicas: int | None, deadline: float
    ) -> Sequence[pb.PutSlot]:
        wanted = self.replicas if replicas is None else replicas
        if wanted < 0:
            raise InvalidArgument(f"replicas must be 0 (master default) or more, got {wanted}")
        response = self._link.call(
            "PutStart",
            pb.PutStartRequest(client_id=self.client_id, keys=keys, sizes=sizes, replicas=wanted),
            deadline,
        )
        self._data.learn(response.segments)
        return response.slots

    def _write(self, puts: Sequence[PendingPut], deadline: float) -> None:
        """Writes every replica of every put at once; records per-replica errors."""
        transfers: list[Transfer] = []
        owners: list[tuple[PendingPut, int]] = []
        for put in puts:
            assert put.source is not None
            address, length, _ = put.source
            put.errors = [""] * len(put.slot.replicas)
            for replica_index, replica in enumerate(put.slot.replicas):
                if length:
                    transfers.append(Transfer(replica.segment_id, replica.address, address, length))
                    owners.append((put, replica_index))
        errors = self._data.run(transfers, is_get=False, timeout=deadline - time.monotonic())
        for (put, replica_index), error in zip(owners, errors, strict=True):
            put.errors[replica_index] = error

    def _commit(self, puts: Sequence[PendingPut], deadline: float) -> list[int]:
        """Reports which replicas were written; the master publishes what it can."""
        if not puts:
            return []
        commits = [
            pb.PutCommit(
                key=put.key, put_id=put.slot.put_id, replica_ok=[not e for e in put.errors]
            )
            for put in puts
        ]
        response = self._link.call(
            "PutEnd", pb.PutEndRequest(client_id=self.client_id, commits=commits), deadline
        )
        return list(response.statuses)

    def _revoke(self, puts: Sequence[PendingPut], deadline: float) -> list[int]:
        response = self._link.call(
            "PutRevoke",
            pb.PutRevokeRequest(
                client_id=self.client_id,
                keys=[put.key for put in puts],
                put_ids=[put.slot.put_id for put in puts],
            ),
            deadline,
        )
        return list(response.statuses)

    def _valid_keys(self, keys: Sequence[str], results: list[Any]) -> list[int]:
        valid = []
        for i, key in enumerate(keys):
            problem = key_problem(key)
            if problem is None:
                valid.append(i)
            else:
                results[i] = InvalidKey(f"invalid key {key!r}: {problem}", key=key)
        return valid

    def _locate(
        self, keys: Sequence[str], results: list[Any], deadline: float
    ) -> tuple[dict[int, pb.ObjectLocation], float]:
        """Asks the master where each key lives; fills errors into ``results``.

        Returns the located keys and when their lease ends on our monotonic clock. The lease
        is counted from before the request was sent, so our estimate can only end early.
        """
        valid = self._valid_keys(keys, results)
        located: dict[int, pb.ObjectLocation] = {}
        if not valid:
            return located, 0.0
        sent_at = time.monotonic()
        response = self._link.call(
            "GetReplicas",
            pb.GetReplicasRequest(
                client_id=self.client_id,
                keys=[keys[i] for i in valid],
                lease_ms=int(self.lease_ttl * 1000),
            ),
            deadline,
        )
        lease_deadline = sent_at + response.lease_ms / 1000.0
        self._data.learn(response.segments)
        for i, location in zip(valid, response.objects, strict=True):
            if location.status == KeyStatus.OK:
                located[i] = location
            else:
                results[i] = error_for(location.status, keys[i])
        return located, lease_deadline

    def _read(
        self,
        keys: Sequence[str],
        located: Mapping[int, pb.ObjectLocation],
        targets: Mapping[int, tuple[int, int]],
        results: list[Any],
        deadline: float,
        lease_deadline: float,
    ) -> None:
        """Copies each located object into its target, trying replicas in order of nearness."""
        candidates = {i: self._by_nearness(located[i].replicas) for i in targets}
        failures: dict[int, list[str]] = {i: [] for i in targets}
        pending = [i for i in targets if targets[i][1] > 0]
        attempt = 0
        while pending:
            transfers = []
            for i in pending:
                replica = candidates[i][attempt]
                address, size = targets[i]
                transfers.append(Transfer(replica.segment_id, replica.address, address, size))
            budget = min(deadline, lease_deadline) - time.monotonic()
            errors = self._data.run(transfers, is_get=True, timeout=budget)
            attempt += 1
            retry = []
            for i, error in zip(pending, errors, strict=True):
                if not error:
                    continue
                failures[i].append(error)
                if attempt < len(candidates[i]) and time.monotonic() < deadline:
                    retry.append(i)
                else:
                    results[i] = TransferError(
                        f"could not read {keys[i]!r} from any of its "
                        f"{len(candidates[i])} replica(s): {'; '.join(failures[i])}",
                        key=keys[i],
                    )
            pending = retry
        if time.monotonic() > lease_deadline:
            for i in targets:
                if not isinstance(results[i], KVPoolError):
                    results[i] = LeaseExpired(
                        f"the read lease on {keys[i]!r} may have expired before its transfer "
                        "finished, so the bytes were discarded: read it again (or ask for a "
                        "longer lease_ttl)",
                        key=keys[i],
                    )

    def _by_nearness(self, replicas: Iterable[pb.Replica]) -> list[pb.Replica]:
        """Replicas on this host first: they move over shared memory."""
        return sorted(replicas, key=lambda r: self._data.host_of(r.segment_id) != self.host)


def _raise_if_error(result: Any) -> Any:
    if isinstance(result, KVPoolError):
        raise result
    return result
