"""``KVPoolL2Adapter``: kvpool as LMCache's remote KV tier (an ``L2AdapterInterface``).

What each LMCache call becomes:

- ``submit_store_task``: one ``put_many`` on the store client (one master round trip to
  reserve, the writes straight out of L1, one to commit), with a deadline counted from
  submission: a store still queued then fails without starting, so that a stalled master
  cannot keep LMCache's L1 objects (read-locked until the store reports) for longer than
  ``store_timeout_s``. A key that already exists counts as stored: objects are immutable
  and the key names the content. A key that another put is still writing does not: that
  write may yet fail (``ObjectBeingWritten``).
- ``submit_lookup_and_lock_task``: one ``GetReplicas`` with a lease; the lease is the lock,
  renewed until ``submit_unlock`` and given back then (see ``locks.py``). Only a key the
  master answers NOT_FOUND is gone; one refused a lease (a tenant's leases quota) is a
  failed lookup of a chunk that is still there. A key that is no valid kvpool key (too
  long, not UTF-8) is a miss, never sent.
- ``submit_load_task``: one ``get_into_many`` on the load client, straight into L1, with a
  deadline counted from submission: whatever has not arrived by then is a miss. When the call
  returns, kvpool guarantees no transfer still writes into the buffers.
- ``delete``, ``list_l2_keys``, ``report_status``: metadata calls with their own deadlines.
  Listeners hear of the keys a delete removed (and of stored ones found gone), no others.
- ``get_usage``: the bytes this adapter stored; the capacity configured, else the cluster's.

Both data clients open their connections (master, every storage node) when the adapter is
built, so that the first load is as fast as later ones (``connections.py``).

Stores, lookups and loads each run on their own worker thread, and stores and loads on their
own kvpool client (so their own UCX worker): a long store never delays a prefetch. The three
event fds are distinct, and every result is handed out once. A stalled master must not cost
a call and a log line per queued task: a task left with less than ``MIN_BUDGET_SHARE`` of its
timeout is not started, tasks starting just after a call the master did not answer fail at
once (``common/master_stall.py``), and failures are logged once per kind and error every 10 s.

``close`` stops accepting work, cancels queued tasks without touching their buffers, waits
for the running ones (bounded by their deadlines), gives back the lock leases, and only then
releases UCX: after it returns nothing writes into L1.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.logging import init_logger
from lmcache.v1.distributed.api import (
    KeyEntry,
    KeyListPage,
    MemoryLayoutDesc,
    ObjectKey,
)
from lmcache.v1.distributed.internal_api import L1MemoryDesc, L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import (
    AdapterUsage,
    L2AdapterInterface,
    L2TaskId,
)
from lmcache.v1.memory_management import MemoryObj

from kvpool import Client
from kvpool.common.kept_errors import forget_tracebacks
from kvpool.common.keys import key_problem, plainly_valid
from kvpool.common.log_throttle import LogThrottle
from kvpool.common.master_stall import MasterStall
from kvpool.common.status import KeyStatus
from kvpool.errors import (
    ClientClosed,
    KVPoolError,
    MasterNotTrusted,
    NotAuthenticated,
    ObjectBeingWritten,
    ObjectExists,
    ObjectNotFound,
    ObjectNotReady,
    PermissionDenied,
)
from kvpool.lmcache.arena import L1Arena
from kvpool.lmcache.config import KVPoolL2AdapterConfig
from kvpool.lmcache.connections import open_connections
from kvpool.lmcache.control import ControlPlane, Leased
from kvpool.lmcache.health import Health, HealthProbe
from kvpool.lmcache.keys import KeyCodec
from kvpool.lmcache.locks import LockTable
from kvpool.lmcache.stats import Stats
from kvpool.lmcache.tasks import Completions, Task, TaskIds, Worker

logger = init_logger(__name__)

#: A load with less time than this left is reported as misses without starting.
MIN_LOAD_BUDGET = 0.001
#: A store with less time than this left is reported failed without starting.
MIN_STORE_BUDGET = 0.001
#: A store or lookup left with less than this share of its timeout when its turn comes
#: (queued behind calls to a stalled master) is failed without starting: its call would
#: only wait out the rest of its deadline.
MIN_BUDGET_SHARE = 0.25
#: Lookup statuses that are plain misses; any other (a quota) fails the lookup.
MISSES = frozenset({KeyStatus.NOT_FOUND, KeyStatus.NOT_READY, KeyStatus.INVALID_KEY})
#: Keys whose stored size the adapter remembers at most (about 200 bytes each).
MAX_SIZES_KEPT = 1 << 18


class KVPoolL2Adapter(L2AdapterInterface):
    config_class_name = "KVPoolL2AdapterConfig"

    def __init__(
        self,
        config: KVPoolL2AdapterConfig | Mapping[str, Any],
        l1_memory_desc: L1MemoryDesc | None = None,
    ) -> None:
        if not isinstance(config, KVPoolL2AdapterConfig):
            config = KVPoolL2AdapterConfig.from_dict(dict(config))
        super().__init__(max_capacity_bytes=config.max_capacity_bytes)
        self.config = config
        self._codec = KeyCodec(config.key_prefix)
        self.stats = Stats()
        #: Bytes accounted (``_notify_keys_stored``) per kvpool key this adapter stored, the
        #: latest ``MAX_SIZES_KEPT`` (kvpool evicts without telling the adapter: the oldest
        #: go, and a deletion of one of them is reported as 0 bytes).
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._sizes_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._closed = False
        #: Tasks whose deadline passed while queued: one line per kind now and then, not one
        #: per task (a stalled master expires them by the thousand).
        self._expired_log = LogThrottle(burst=1, interval=10.0)
        #: Failed tasks: one line per kind and error class every 10 s, with the count dropped.
        self._failure_log = LogThrottle(burst=1, interval=10.0)
        #: Keys that are no valid kvpool key: said once per model name (and kind).
        self._invalid_log = LogThrottle(burst=1, interval=3600.0)
        self._stall = MasterStall()
        ucx = config.ucx_config or None
        with ExitStack() as undo:
            credentials = config.credentials
            self._store_client = Client(
                config.master,
                replicas=config.replicas or None,  # 0 in the config: the master's default
                timeout=config.store_timeout_s,
                ucx_config=ucx,
                same_host_mapping=config.same_host_mapping,
                metadata_lane=config.metadata_lane,
                **credentials.client_arguments(),
            )
            undo.callback(self._store_client.close)
            self._load_client = Client(
                config.master,
                timeout=config.load_timeout_s,
                # The lease, counted from before the request, then covers the whole load
                # deadline (also counted from before it): it cannot expire mid-transfer.
                lease_ttl=config.load_timeout_s,
                ucx_config=ucx,
                same_host_mapping=config.same_host_mapping,
                metadata_lane=config.metadata_lane,
                **credentials.client_arguments(),
            )
            undo.callback(self._load_client.close)
            # Lock leases under the load client's id: the master gives back only the lease
            # of the client that leased last, and a load re-leases what a lookup locked.
            self._control = ControlPlane(
                config.master, config.metadata_lane, credentials, self._load_client.client_id
            )
            undo.callback(self._control.close)
            self._arena = L1Arena.of(l1_memory_desc)
            if config.register_l1 and l1_memory_desc is not None:
                self._arena.register_with(
                    [self._store_client, self._load_client],
                    l1_memory_desc.stable_registration_size,
                )
            undo.callback(self._arena.unregister)
            self._locks = LockTable(self._control, config.lock_ttl_s, config.control_timeout_s)
            undo.callback(self._locks.stop)
            self._health = HealthProbe(self._control, config.health_timeout_s)
            self._ids = TaskIds()
            self._stores: Completions[L2StoreResult] = Completions()
            undo.callback(self._stores.close)
            self._lookups: Completions[Bitmap] = Completions()
            undo.callback(self._lookups.close)
            self._loads: Completions[Bitmap] = Completions()
            undo.callback(self._loads.close)
            self._store_worker = Worker("kvpool-l2-store")
            undo.callback(self._store_worker.stop)
            self._lookup_worker = Worker("kvpool-l2-lookup")
            undo.callback(self._lookup_worker.stop)
            self._load_worker = Worker("kvpool-l2-load")
            undo.callback(self._load_worker.stop)
            undo.pop_all()
        health = self._health.check()
        if isinstance(health.error, (NotAuthenticated, PermissionDenied, MasterNotTrusted)):
            self.close()
            raise ValueError(_refused_at_start(config.master, health.error))
        if health.healthy:
            # The first load after the start is as fast as later ones: no connecting then.
            open_connections([self._store_client, self._load_client], health.nodes)
        else:
            logger.warning(
                "kvpool L2 adapter: master %s not usable yet (%s); loads will miss and "
                "stores fail until it is",
                config.master,
                health.reason,
            )

    # ------------------------------------------------------------------ event fds

    def get_store_event_fd(self) -> int:
        return self._stores.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookups.fileno()

    def get_load_event_fd(self) -> int:
        return self._loads.fileno()

    # ------------------------------------------------------------------ store

    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        _check_pairs(keys, objects)
        task_id = self._ids.next()
        keys, objects = list(keys), list(objects)
        deadline = time.monotonic() + self.config.store_timeout_s
        self._store_worker.submit(
            Task(
                run=lambda: self._run_store(task_id, keys, objects, deadline),
                cancel=lambda: self._stores.finish(task_id, L2StoreResult(False, 0)),
            )
        )
        return task_id

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        return self._stores.pop_all()

    def _run_store(
        self, task_id: int, keys: list[ObjectKey], objects: list[MemoryObj], deadline: float
    ) -> None:
        budget = deadline - time.monotonic()
        skip = self._skip_reason(budget, self.config.store_timeout_s, MIN_STORE_BUDGET)
        if keys and skip:
            # Queued behind slower stores until (nearly) its deadline, or the master just did
            # not answer: failed at once (LMCache keeps the chunks in L1), instead of adding
            # another pointless call to the queue.
            self.stats.count_store(len(keys), 0, len(keys), 0)
            self._log_expired("store", len(keys), skip)
            self._stores.finish(task_id, L2StoreResult(False, 0))
            return
        names = self._codec.encode_all(keys)
        buffers = [self._arena.buffer(obj) for obj in objects]
        # Only this thread uses the store client, so its timeout can be the task's budget.
        self._store_client.timeout = max(budget, MIN_STORE_BUDGET)
        # Entry i is key i's error, or its success (None or the replicas written).
        results: list[Any]
        try:
            results = self._store_client.put_many(list(zip(names, buffers, strict=True)))
        except KVPoolError as error:
            results = [error] * len(names)
        forget_tracebacks(results)  # (else they pin L1 views in a cycle: common/kept_errors.py)
        self._stall.note(results, budget)
        stored_keys: list[ObjectKey] = []
        stored_sizes: list[int] = []
        failures: list[KVPoolError] = []
        for key, name, buffer, result in zip(keys, names, buffers, results, strict=True):
            if isinstance(result, ObjectExists) and not isinstance(result, ObjectBeingWritten):
                continue  # stored before (here or by another instance): same key, same bytes
            if isinstance(result, KVPoolError):
                failures.append(result)
                continue
            stored_keys.append(key)
            stored_sizes.append(len(buffer))
            with self._sizes_lock:
                sizes = self._sizes
                sizes[name] = len(buffer)
                sizes.move_to_end(name)
                if len(sizes) > MAX_SIZES_KEPT:
                    sizes.popitem(last=False)
        written = sum(stored_sizes)
        self.stats.count_store(len(keys), len(stored_keys), len(failures), written)
        if failures:
            self._log_failure(
                "store", failures[0], f"{len(failures)} of {len(keys)} chunk(s) not stored"
            )
        if stored_keys:
            self._notify_keys_stored(stored_keys, stored_sizes)
        self._stores.finish(task_id, L2StoreResult(not failures, written))

    # ------------------------------------------------------------------ lookup and lock

    def submit_lookup_and_lock_task(
        self,
        keys: list[ObjectKey],
        group_layout_descs: dict[int, MemoryLayoutDesc] | None = None,
    ) -> L2TaskId:
        task_id = self._ids.next()
        keys = list(keys)
        deadline = time.monotonic() + self.config.lookup_timeout_s
        self._lookup_worker.submit(
            Task(
                run=lambda: self._run_lookup(task_id, keys, deadline),
                cancel=lambda: self._lookups.finish(task_id, Bitmap(len(keys))),
            )
        )
        return task_id

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        return self._lookups.pop(task_id)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        self._locks.unlock(self._codec.encode_all(keys))

    def _run_lookup(self, task_id: int, keys: list[ObjectKey], deadline: float) -> None:
        bitmap = Bitmap(len(keys))
        names = self._codec.encode_all(keys)
        self._warn_invalid("lookup", keys, names)
        budget = deadline - time.monotonic()
        skip = self._skip_reason(budget, self.config.lookup_timeout_s, 0.0)
        if names and skip:
            self.stats.count_lookup(len(names), 0, failed=True)
            self._log_expired("lookup", len(names), skip)
        elif names:
            try:
                # (invalid keys are misses the master is never asked about: control.py)
                leased = self._locks.lease_and_lock(names, budget)
            except KVPoolError as error:
                self._stall.note([error], budget)
                self._log_failure("lookup", error, f"lookup of {len(names)} key(s)")
                self.stats.count_lookup(len(names), 0, failed=True)
            else:
                self._lookup_found(keys, names, leased, bitmap)
        self._lookups.finish(task_id, bitmap)

    def _lookup_found(
        self, keys: list[ObjectKey], names: list[str], leased: Leased, bitmap: Bitmap
    ) -> None:
        """Sets the hits (already locked), forgets chunks the master says are gone, and
        counts a lookup whose keys the master refused to lease (a tenant's leases quota) as
        failed: those chunks are still there, not gone."""
        hits = [i for i, size in enumerate(leased.sizes) if size is not None]
        bitmap.batched_set(hits)
        self._forget_ghosts([(keys[i], names[i]) for i in range(len(names)) if leased.gone(i)])
        refused = [
            i
            for i, size in enumerate(leased.sizes)
            if size is None and leased.statuses and leased.statuses[i] not in MISSES
        ]
        if refused:
            status = _status_name(leased.statuses[refused[0]])
            name = names[refused[0]]
            why = f": {leased.quota_refusal}" if leased.quota_refusal else ""
            error = KVPoolError(f"the master answered {status} for {name!r}{why}", key=name)
            self._log_failure(
                f"lookup {status}",
                error,
                f"{len(refused)} of {len(names)} key(s) refused a lease, so missed (they "
                "may still exist)",
            )
        self.stats.count_lookup(len(names), len(hits), failed=bool(refused))

    # ------------------------------------------------------------------ load

    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        _check_pairs(keys, objects)
        task_id = self._ids.next()
        keys, objects = list(keys), list(objects)
        deadline = time.monotonic() + self.config.load_timeout_s
        self._load_worker.submit(
            Task(
                run=lambda: self._run_load(task_id, keys, objects, deadline),
                cancel=lambda: self._loads.finish(task_id, Bitmap(len(keys))),
            )
        )
        return task_id

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        return self._loads.pop(task_id)

    def _run_load(
        self, task_id: int, keys: list[ObjectKey], objects: list[MemoryObj], deadline: float
    ) -> None:
        bitmap = Bitmap(len(keys))
        budget = deadline - time.monotonic()
        skip = "deadline" if budget < MIN_LOAD_BUDGET else "stall" if self._stall.stalled() else ""
        if not keys or skip:
            self.stats.count_load(len(keys), 0, 0, timed_out=bool(keys))
            if keys:
                self._log_expired("load", len(keys), skip)
            self._loads.finish(task_id, bitmap)
            return
        names = self._codec.encode_all(keys)
        buffers = [self._arena.buffer(obj) for obj in objects]
        # Only this thread uses the load client, so its timeout can be the task's budget.
        self._load_client.timeout = budget
        try:
            results: list[Any] = self._load_client.get_into_many(names, buffers)
        except KVPoolError as error:
            results = [error] * len(names)
        forget_tracebacks(results)
        self._stall.note(results, budget)
        hits: list[int] = []
        errors: list[KVPoolError] = []
        ghosts: list[tuple[ObjectKey, str]] = []
        for i, result in enumerate(results):
            if isinstance(result, int) and result == len(buffers[i]):
                hits.append(i)
            elif isinstance(result, ObjectNotFound) and not isinstance(result, ObjectNotReady):
                ghosts.append((keys[i], names[i]))
            elif isinstance(result, KVPoolError):
                errors.append(result)
            else:  # an object of another size than its L1 buffer: not this layout's chunk
                errors.append(KVPoolError(f"{names[i]!r} is {result} bytes", key=names[i]))
        bitmap.batched_set(hits)
        timed_out = time.monotonic() >= deadline
        self.stats.count_load(len(keys), len(hits), sum(len(buffers[i]) for i in hits), timed_out)
        if errors:
            late = " (deadline passed)" if timed_out else ""
            self._log_failure(
                "load", errors[0], f"{len(errors)} of {len(keys)} chunk(s) not loaded{late}"
            )
        self._forget_ghosts(ghosts)
        if hits:
            self._notify_keys_accessed([keys[i] for i in hits])
        self._loads.finish(task_id, bitmap)

    # ------------------------------------------------------------------ delete, usage, listing

    def delete(self, keys: list[ObjectKey]) -> None:
        """Removes ``keys`` from kvpool, except those this adapter holds locked (in use)."""
        names = self._codec.encode_all(keys)
        self._warn_invalid("delete", keys, names)  # (never sent: control.py)
        chosen = [(k, n) for k, n in zip(keys, names, strict=True) if not self._locks.is_locked(n)]
        if not chosen or self._closed:
            return
        try:
            statuses = self._control.remove(
                [n for _, n in chosen], self.config.control_timeout_s, force=True
            )
        except (KVPoolError, ValueError) as error:  # (closed meanwhile: ClientClosed)
            self._log_failure("delete", error, f"delete of {len(chosen)} key(s)")
            return
        removed = [p for p, status in zip(chosen, statuses, strict=True) if status == KeyStatus.OK]
        vanished = [
            p for p, status in zip(chosen, statuses, strict=True) if status == KeyStatus.NOT_FOUND
        ]
        self.stats.count_delete(len(removed))
        self._report_deleted(removed)
        # Not there to remove: listeners hear of those this adapter stored (gone meanwhile,
        # evicted or lost), never of keys it did not store.
        self._forget_ghosts(vanished)

    def get_usage(self) -> AdapterUsage:
        """Bytes this adapter stored (per ``cache_salt`` too), and the capacity: the
        configured ``max_capacity_gb``, else the cluster's as the master reports it (0 while
        the master cannot be asked). Only the configured one turns LMCache's own L2
        eviction on (``supports_global_eviction``)."""
        usage = super().get_usage()
        if usage.total_capacity_bytes > 0 or self._closed:
            return usage
        return dataclasses.replace(usage, total_capacity_bytes=self._health.check().capacity)

    def list_l2_keys(
        self,
        model_name: str | None = None,
        page_size: int = 500,
        cursor: str | None = None,
    ) -> KeyListPage:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"page_size must be a positive integer (got {page_size!r})")
        if self._closed:
            raise ClientClosed("the kvpool L2 adapter is closed")
        prefix = self._codec.model_prefix(model_name)
        if cursor is not None and (not isinstance(cursor, str) or not cursor.startswith(prefix)):
            raise ValueError(f"malformed cursor {cursor!r}: pass next_page_token as it came")
        page = self._control.list_keys(
            prefix, page_size, cursor or "", self.config.control_timeout_s
        )
        entries = []
        for name, size in zip(page.keys, page.sizes, strict=True):
            try:
                key = self._codec.decode(name)
            except ValueError:
                continue  # not an LMCache key, though under our prefix
            entries.append(KeyEntry(key=key.to_encoded_object_key(), size_bytes=size))
        return KeyListPage(entries=tuple(entries), next_page_token=page.next_start_after or None)

    # ------------------------------------------------------------------ status and close

    def report_status(self) -> dict:
        health = Health(False, False, "closed") if self._closed else self._health.check()
        workers = {
            "store": self._store_worker,
            "lookup": self._lookup_worker,
            "load": self._load_worker,
        }
        usage = self.get_usage()
        threads_alive = all(w.alive() for w in workers.values()) and self._locks.alive()
        return {
            "is_healthy": not self._closed and threads_alive and health.healthy,
            "type": "KVPoolL2Adapter",
            "master": self.config.master,
            "master_reachable": health.reachable,
            "reason": health.reason,
            "storage_nodes": health.nodes,
            "cluster_objects": health.objects,
            "cluster_capacity_bytes": health.capacity,
            "cluster_used_bytes": health.used,
            "current_size_bytes": usage.total_bytes_used,
            "max_capacity_bytes": usage.total_capacity_bytes,
            "locked_keys": self._locks.locked_count(),
            "backlog": {name: w.backlog() for name, w in workers.items()},
            "l1_registered_bytes": self._arena.registered,
            "zero_copy_buffers": self._arena.arena_buffers,
            "unregistered_buffers": self._arena.other_buffers,
            **self.stats.snapshot(),
        }

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        # Workers first: queued tasks are cancelled without touching their buffers, running
        # ones end by their deadlines. Only then may UCX and the event fds go.
        for worker in (self._lookup_worker, self._load_worker, self._store_worker):
            worker.stop()
        self._locks.stop()
        self._arena.unregister()
        self._load_client.close()
        self._store_client.close()
        self._control.close()
        for completions in (self._stores, self._lookups, self._loads):
            completions.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ accounting

    def _skip_reason(self, budget: float, timeout: float, least: float) -> str:
        """Why a store or lookup with ``budget`` seconds left is not started ("": it is):
        "deadline" when it waited in the queue until less than ``MIN_BUDGET_SHARE`` of its
        ``timeout`` (or ``least``) is left, "stall" just after the master did not answer."""
        if budget <= least or budget < MIN_BUDGET_SHARE * timeout:
            return "deadline"
        return "stall" if self._stall.stalled() else ""

    def _log_expired(self, kind: str, keys: int, reason: str = "deadline") -> None:
        """A task not run: it waited (nearly) to its deadline behind others (a stalled master
        or storage node), or the master had just failed to answer. Says so, at most once
        per kind and reason every 10 s."""
        why = (
            "was not run: the master did not answer a call just before"
            if reason == "stall"
            else "waited (nearly) to its deadline in the queue and was not run"
        )
        self._expired_log.log(
            logger,
            (kind, reason),
            "kvpool L2 adapter: a %s task of %d key(s) %s",
            kind,
            keys,
            why,
            stacklevel=2,
        )

    def _log_failure(self, kind: str, error: Exception, what: str) -> None:
        """A failed task: at most one line per kind and error class every 10 s (a master or
        node away fails every task, each with the same error), with the count dropped."""
        self._failure_log.log(
            logger,
            (kind, type(error).__name__),
            "kvpool L2 adapter: %s, first: %s",
            what,
            error,
            stacklevel=2,
        )

    def _warn_invalid(self, kind: str, keys: list[ObjectKey], names: list[str]) -> None:
        """Keys that are no valid kvpool key (over 1024 bytes, lone surrogates) are misses
        the master is never asked about: said once per model name, not per call."""
        if plainly_valid(names):
            return
        for key, name in zip(keys, names, strict=True):
            problem = key_problem(name)
            if problem is not None and self._invalid_log.allow((kind, key.model_name)) is not None:
                logger.warning(
                    "kvpool L2 adapter: %s of keys of model %a: not kvpool keys (%s); they "
                    "always miss",
                    kind,
                    key.model_name[:100],
                    problem,
                )

    def _forget_ghosts(self, pairs: list[tuple[ObjectKey, str]]) -> None:
        """Keys this adapter stored that kvpool no longer has (lost with their storage node,
        or removed by someone else): report them deleted so that usage stays true."""
        self._report_deleted(pairs, only_known=True)

    def _report_deleted(self, pairs: list[tuple[ObjectKey, str]], *, only_known: bool = False):
        """``_notify_keys_deleted`` with the sizes this adapter accounted (0 when unknown)."""
        keys: list[ObjectKey] = []
        sizes: list[int] = []
        with self._sizes_lock:
            for key, name in pairs:
                size = self._sizes.pop(name, None)
                if size is not None or not only_known:
                    keys.append(key)
                    sizes.append(size or 0)
        if keys:
            self._notify_keys_deleted(keys, sizes)


def _status_name(status: int) -> str:
    try:
        return KeyStatus(status).name
    except ValueError:
        return f"status {status}"


def _check_pairs(keys: list[ObjectKey], objects: list[MemoryObj]) -> None:
    if len(keys) != len(objects):
        raise ValueError(f"{len(keys)} keys but {len(objects)} memory objects: pass one per key")


def _refused_at_start(master: str, error: KVPoolError) -> str:
    """Why an adapter is not built: the master refused its credentials, or is not the one
    its CA vouches for. Either fails every lookup, store and load until the engine is
    configured again, so it fails the start, as the vLLM and SGLang tiers do; a master that
    does not answer yet does not (engines start while the cluster is down)."""
    if isinstance(error, MasterNotTrusted):
        return (
            f"kvpool L2 adapter: the master {master} is not trusted: its TLS certificate "
            f"fails this engine's check ({error}). Give the adapter the CA that signed the "
            'master\'s certificate ("tls_ca" in adapter_params, else $KVPOOL_TLS_CA), and '
            "name the master by an address its certificate holds."
        )
    return (
        f"kvpool L2 adapter: the master {master} refuses this engine's credentials "
        f"({error}). Give the adapter a valid client token of the tenant whose chunks it "
        'shares: "token" in adapter_params (the token or "@/path/to/file"), else '
        "$KVPOOL_TOKEN or $KVPOOL_TOKEN_FILE."
    )
