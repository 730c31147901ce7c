"""``KVPoolHiCacheStorage``: kvpool as SGLang's HiCache storage tier (a ``HiCacheStorage``).

SGLang loads it as a "dynamic" backend (``backend_class(storage_config, kwargs)``), then
calls ``register_mem_pool_host`` with its host KV pool; with ``interface_v1`` its cache
controller moves pages through:

- ``batch_exists(keys)``: one ``Exists`` round trip for the batch, through a client of its
  own (each hit leased for ``lookup_lease_s``, so that the prefetch which follows finds
  it); the count of consecutive hits from the first key. Hits after the first miss, which
  SGLang never loads, have their leases given back.
- ``batch_get_v1(keys, host_indices)``: one ``get_into_parts_many`` straight into the host
  pool, with the load deadline; entry i is whether page i arrived whole. A page whose node
  died, that was evicted, or whose size differs from the pool's page is a miss (False);
  kvpool force-closes transfers at the deadline, so nothing lands in the pool after the
  call returned. Then one ``release_leases`` of the batch's keys: the load's own leases
  end (its lookup's run out by themselves, within ``lookup_lease_s``).
- ``batch_set_v1(keys, host_indices)``: one ``put_parts_many`` straight out of the host
  pool; a page that already exists counts as stored (pages are immutable, the key names
  the content).

Stores and loads each have their own kvpool client (their own UCX worker): SGLang's backup
thread never holds up a prefetch. The host pool is registered with both once. Lookups have
a client of their own, which moves no bytes (nothing is registered with it). The master
keeps one lessee per object: a client's ``release_leases`` ends its lease on an object only
where it leased the object last. Sharing one client, a load's release would end another
request's lookup lease on the same pages (which could then be evicted before that
request's load), and a lookup's release of its hits past the first miss could end the
lease of a load still reading one of them. Apart, a load's release ends only load leases
(SGLang loads on one io thread: those of a load that is over), a lookup's only lookup
leases (at worst another request's, on a page after this lookup's first miss: that request
may miss it, no load is cut short). ``get``, ``set`` and their batch forms (SGLang's older
interface) move one caller buffer per key.

While the engine starts, one ``exists_many`` of a probe key checks its credentials: a token
the master refuses, or a master whose certificate fails the TLS check (another CA, another
name), fails the start (a ``ValueError``), where it would otherwise fail every call; so does
a model name or key prefix so long that the page keys would exceed kvpool's 1024 bytes. A
master that does not answer is logged and the engine starts (it finds the cluster once it is
up). A master that cannot be reached costs every call its whole timeout, so after a lookup or
load failed as a whole for that reason, lookups and loads miss without asking for
``load_timeout_s``; after a store whose every page failed for it, stores are skipped (not
stored) for ``store_timeout_s``. Then one call asks again; any call the master answers ends
both quiet periods. Warnings (and the info lines of pages missed) go through a throttle: one
line per kind of failure every ``LOG_INTERVAL`` seconds at most.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from kvpool import Client
from kvpool.common.kept_errors import forget_tracebacks
from kvpool.common.log_throttle import LogThrottle
from kvpool.errors import (
    KVPoolError,
    MasterNotTrusted,
    MasterUnavailable,
    NotAuthenticated,
    ObjectBeingWritten,
    ObjectExists,
    ObjectNotFound,
    PermissionDenied,
)
from kvpool.sglang.config import KVPoolHiCacheConfig
from kvpool.sglang.keys import PageKeys
from kvpool.sglang.pages import HostPages, byte_view

logger = logging.getLogger(__name__)

#: At most one warning per kind of failure this often (seconds); the next one let through
#: says how many were dropped.
LOG_INTERVAL = 30.0


class KVPoolHiCacheStorage(HiCacheStorage):
    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None
    ) -> None:
        settings = KVPoolHiCacheConfig.from_extra_config(storage_config.extra_config)
        self.settings = settings
        self.storage_config = storage_config
        self._keys = PageKeys(settings.key_prefix, storage_config)
        self._pages: HostPages | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        #: Monotonic times before which lookups and loads (stores) answer misses (not
        #: stored) without asking kvpool: the master did not answer the last one that asked.
        #: (Set and read by SGLang's threads without a lock: a race costs one extra ask.)
        self._loads_quiet_until = 0.0
        self._stores_quiet_until = 0.0
        self._log = LogThrottle(burst=1, interval=LOG_INTERVAL)
        common: dict[str, Any] = {
            "ucx_config": settings.ucx_config or None,
            "same_host_mapping": settings.same_host_mapping,
            "metadata_lane": settings.metadata_lane,
            **settings.credentials.client_arguments(),
        }
        with ExitStack() as undo:
            self._store_client = Client(
                settings.master,
                replicas=settings.replicas or None,  # 0: the master's default
                timeout=settings.store_timeout_s,
                **common,
            )
            undo.callback(self._store_client.close)
            self._load_client = Client(
                settings.master,
                timeout=settings.load_timeout_s,
                # A lease counted from before the request covers the whole load deadline.
                lease_ttl=settings.load_timeout_s,
                **common,
            )
            undo.callback(self._load_client.close)
            self._lookup_client = Client(
                settings.master,
                timeout=settings.load_timeout_s,
                # A hit's lease has to last until its load starts (the load leases the page
                # for itself, and gives that lease back when it ends). SGLang's prefetch
                # thread looks a request's pages up, the scheduler hands the hits to the io
                # thread at its next step, and that thread loads one request after another:
                # a load may wait behind others, each bounded by load_timeout_s, hence the
                # default. Longer would pin pages (and count them against the tenant's leases
                # quota) long after their load, or after SGLang dropped the prefetch.
                lease_ttl=settings.lookup_lease_s,
                **common,
            )
            undo.callback(self._lookup_client.close)
            self._check_credentials()
            undo.pop_all()

    def _check_credentials(self) -> None:
        """One cheap authenticated call (a probe key's ``exists``, no lease), within
        ``load_timeout_s``: credentials the master refuses, or a master certificate that
        fails this engine's TLS check, fail the engine's start; a master that does not
        answer is logged, and lookups and loads start quiet."""
        probe = self._keys.namespace + "kvpool-credentials-probe"
        try:
            self._lookup_client.exists_many([probe], lease=False)
        except MasterNotTrusted as error:
            raise ValueError(
                f"kvpool: the master {self.settings.master} is not the one this engine trusts: "
                f"its certificate fails the TLS check ({error}). Give the backend the CA that "
                'signed the master\'s certificate: "tls_ca" in '
                "--hicache-storage-backend-extra-config, else $KVPOOL_TLS_CA; and name the "
                "master by a host name or address its certificate holds."
            ) from None
        except (NotAuthenticated, PermissionDenied) as error:
            raise ValueError(
                f"kvpool: the master {self.settings.master} refuses this engine's credentials "
                f"({error}). Give the backend a valid client token of the tenant whose pages it "
                'shares: "token" in --hicache-storage-backend-extra-config (the token or '
                '"@/path/to/file"), else $KVPOOL_TOKEN or $KVPOOL_TOKEN_FILE.'
            ) from None
        except KVPoolError as error:
            if isinstance(error, MasterUnavailable):
                self._loads_quiet_until = time.monotonic() + self.settings.load_timeout_s
            logger.warning(
                "kvpool: could not check this engine's credentials while it starts (%s); "
                "starting anyway: lookups and loads miss, and stores fail, until the master "
                "answers",
                error,
            )

    # ------------------------------------------------------------------ host pool

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        if self._pages is not None:
            self._pages.unregister()
        self._keys.bind(mem_pool_host)
        self._pages = HostPages(mem_pool_host)
        if self.settings.register_host_pool:
            # (the clients that move bytes; the lookup client moves none)
            self._pages.register_with([self._store_client, self._load_client])

    # ------------------------------------------------------------------ v1: pages

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        if not keys or self._closed or self._loads_quiet():
            return 0
        names = self._keys.names(keys)
        try:
            found = self._lookup_client.exists_many(names)
        except (KVPoolError, RuntimeError) as error:  # RuntimeError: closed meanwhile
            self._load_failed("lookup", len(keys), error)
            return 0
        self._master_answered()
        hits = next((i for i, hit in enumerate(found) if hit is not True), len(found))
        if hits < len(found):
            self._lookup_stopped(names, found, hits)
        return hits

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: Any,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        pieces = self._host_pages().pieces(len(keys), host_indices)
        if self._closed or not keys or self._loads_quiet():
            return [False] * len(keys)
        names = self._keys.names(keys)
        try:
            results = self._load_client.get_into_parts_many(list(zip(names, pieces, strict=True)))
        except (KVPoolError, RuntimeError) as error:
            self._load_failed("load", len(keys), error)
            self._loaded(names, error)
            return [False] * len(keys)
        forget_tracebacks(results)  # (per-key errors: see _put)
        self._master_answered()
        self._loaded(names)
        hits = [_is_count(r) for r in results]  # entry i: page i's size, or its error
        if not all(hits):
            first = next(r for r, hit in zip(results, hits, strict=True) if not hit)
            self._warn(
                ("miss", type(first).__name__),
                "kvpool: %d of %d page(s) missed, first: %s",
                hits.count(False),
                len(keys),
                first,
                # (evicted or never stored: the cache working as it does)
                level=logging.INFO if isinstance(first, ObjectNotFound) else logging.WARNING,
            )
        return hits

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: Any,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        pieces = self._host_pages().pieces(len(keys), host_indices)
        if self._closed or not keys or self._stores_quiet():
            return [False] * len(keys)
        return self._put(list(zip(self._keys.names(keys), pieces, strict=True)))

    # ------------------------------------------------------------------ one buffer per key

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Reads ``key`` into ``target_location``: a tensor (returned, or None on a miss) or
        a pointer with ``target_sizes`` bytes (True or False)."""
        return self.batch_get([key], [target_location], [target_sizes])[0]

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[Any]:
        targets = _targets(keys, target_locations, target_sizes)
        if self._closed or not keys or self._loads_quiet():
            return [None] * len(keys)
        results: list[Any]
        names = self._keys.names(keys)
        try:
            results = self._load_client.get_into_parts_many(
                [(name, [view]) for name, (view, _) in zip(names, targets, strict=True)]
            )
        except (KVPoolError, RuntimeError) as error:
            self._load_failed("get", len(keys), error)
            self._loaded(names, error)
            results = [error] * len(keys)
        else:
            self._master_answered()
            self._loaded(names)
        forget_tracebacks(results)  # (else they pin the targets in a cycle: see _put)
        hit = (_is_count(r) for r in results)
        return [(given if ok else None) for ok, (_, given) in zip(hit, targets, strict=True)]

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        """Stores ``value`` (a tensor), or ``target_sizes`` bytes at pointer
        ``target_location``, under ``key``."""
        locations = None if target_location is None else [target_location]
        sizes = None if target_sizes is None else [target_sizes]
        return self.batch_set([key], None if value is None else [value], locations, sizes)

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        sources = _targets(keys, values if values is not None else target_locations, target_sizes)
        if self._closed or not keys or self._stores_quiet():
            return False
        names = self._keys.names(keys)
        return all(self._put([(n, [view]) for n, (view, _) in zip(names, sources, strict=True)]))

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ------------------------------------------------------------------ admin and close

    def clear(self) -> bool:
        """Removes the pages of this engine's key namespace (shared by every engine of its
        model, rank and host pool layout) from kvpool: leased ones too (lookups lease the
        pages they find and never give the leases back, so without ``force`` the pages
        looked up lately would stay; a reader's transfer in flight still completes before
        their space is reused), and those being written (their store fails)."""
        if self._closed:
            return False
        try:
            self._store_client.remove_prefix(self._keys.namespace, force=True)
        except KVPoolError as error:
            logger.warning("kvpool: clear: %s", error)
            return False
        return True

    def close(self) -> None:
        """Idempotent. Calls still running end by their deadlines; later ones miss."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._pages is not None:
            self._pages.unregister()
        self._lookup_client.close()
        self._load_client.close()
        self._store_client.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def kvpool_keys(self, keys: list[str]) -> list[str]:
        """The kvpool keys of SGLang's page keys (``kvpool story KEY`` tells their story)."""
        return self._keys.names(keys)

    # ------------------------------------------------------------------ internals

    def _host_pages(self) -> HostPages:
        if self._pages is None:
            raise RuntimeError(
                "no host pool registered: SGLang calls register_mem_pool_host before any "
                "batch_get_v1 or batch_set_v1"
            )
        return self._pages

    def _put(self, items: list[tuple[str, list[memoryview]]]) -> list[bool]:
        try:
            results: list[Any] = self._store_client.put_parts_many(items)
        except (KVPoolError, RuntimeError) as error:
            results = [error] * len(items)
        # Kept with their tracebacks, the errors would hold this frame (whose ``results``
        # holds them: a cycle) and the client's, with views of the host pool and the cffi
        # buffers exported from them; the garbage collector crashes on those
        # (common/kept_errors.py).
        forget_tracebacks(results)
        # entry i: the replicas written, or key i's error (ObjectExists: stored before; not
        # ObjectBeingWritten: another engine's put, which may yet fail)
        stored = [_is_count(r) or _stored_before(r) for r in results]
        if all(stored):
            self._master_answered()
            return stored
        first = next(r for r, ok in zip(results, stored, strict=True) if not ok)
        if all(isinstance(r, MasterUnavailable) for r in results):
            pause = self.settings.store_timeout_s
            self._stores_quiet_until = time.monotonic() + pause
            self._warn(
                ("store", "unreachable"),
                "kvpool: %d page(s) not stored: %s (stores are skipped for the next %g s "
                "without asking)",
                len(items),
                first,
                pause,
            )
        else:
            self._master_answered()
            self._warn(
                ("store", type(first).__name__),
                "kvpool: %d of %d page(s) not stored, first: %s",
                stored.count(False),
                len(items),
                first,
            )
        return stored

    def _loads_quiet(self) -> bool:
        """Whether lookups and loads answer misses without asking (the master did not answer
        the last one that asked, less than ``load_timeout_s`` ago)."""
        return time.monotonic() < self._loads_quiet_until

    def _stores_quiet(self) -> bool:
        return time.monotonic() < self._stores_quiet_until

    def _master_answered(self) -> None:
        """A call that the master answered ends both quiet periods (stores need not wait out
        theirs once a lookup found the master back). A race with a thread starting one costs
        one more call that asks."""
        if self._loads_quiet_until or self._stores_quiet_until:
            self._loads_quiet_until = self._stores_quiet_until = 0.0

    def _lookup_stopped(self, names: list[str], found: list[Any], hits: int) -> None:
        """After ``batch_exists`` stopped at key ``hits``: a warning where the master refused
        a lookup (a leases quota, say: SGLang sees a miss, the page is there), and the
        lookup leases of the hits after the first miss given back (SGLang never loads
        those; a load's lease is the load client's, which this cannot end)."""
        refused = [r for r in found if isinstance(r, KVPoolError)]
        if refused:
            self._warn(
                ("lookup", type(refused[0]).__name__),
                "kvpool: lookup of %d page(s): %d refused (counted as misses), first: %s",
                len(found),
                len(refused),
                refused[0],
            )
        unused = [n for n, hit in zip(names[hits:], found[hits:], strict=True) if hit is True]
        if unused:
            self._release(self._lookup_client, unused)

    def _loaded(self, names: list[str], error: Exception | None = None) -> None:
        """Gives back the load client's read leases of a load's pages, whatever arrived: else
        they pin the pages and count against the tenant's leases quota until they run out.
        The lookup's leases are the lookup client's: another request's lookup of the same
        pages keeps its lease (they run out within ``lookup_lease_s``). Not after a load
        that the master did not answer (nor once closed)."""
        if isinstance(error, MasterUnavailable) or self._closed:
            return
        if error is not None and not isinstance(error, KVPoolError):
            return  # (a client closed meanwhile)
        self._release(self._load_client, names)

    def _release(self, client: Client, names: list[str]) -> None:
        """``release_leases``, best effort: a failure is a throttled warning (and one the
        master did not answer makes lookups and loads quiet, as a failed load does)."""
        try:
            client.release_leases(names)
        except (KVPoolError, RuntimeError) as error:
            self._load_failed("lease release", len(names), error)

    def _load_failed(self, kind: str, count: int, error: Exception) -> None:
        """A lookup or load that failed as a whole: a master that did not answer makes the
        next ``load_timeout_s`` of them quiet; a warning, throttled."""
        if isinstance(error, MasterUnavailable):
            pause = self.settings.load_timeout_s
            self._loads_quiet_until = time.monotonic() + pause
            self._warn(
                ("load", "unreachable"),
                "kvpool: %s of %d page(s): %s (lookups and loads miss for the next %g s "
                "without asking)",
                kind,
                count,
                error,
                pause,
                stacklevel=2,
            )
        elif not self._closed:  # (a RuntimeError of a client closed meanwhile: said nothing)
            self._warn(
                (kind, type(error).__name__),
                "kvpool: %s of %d page(s): %s",
                kind,
                count,
                error,
                stacklevel=2,
            )

    def _warn(
        self,
        key: tuple[str, str],
        message: str,
        *args: Any,
        level: int = logging.WARNING,
        stacklevel: int = 1,
    ) -> None:
        """``message``, unless one of the same ``key`` went out less than ``LOG_INTERVAL``
        ago (then counted, and said with the next one). The line names where ``_warn`` was
        called (``stacklevel`` 2: where its caller was)."""
        self._log.log(logger, key, message, *args, level=level, stacklevel=stacklevel + 1)


def _is_count(result: object) -> bool:
    """Whether a client's per-key result is a success (a size or a replica count)."""
    return isinstance(result, int) and not isinstance(result, bool)


def _stored_before(result: object) -> bool:
    """Whether a put's error says the key is stored already (objects are immutable and the
    key names the content): not one another engine is still writing, whose put may fail."""
    return isinstance(result, ObjectExists) and not isinstance(result, ObjectBeingWritten)


def _targets(keys: Sequence[str], locations: Any, sizes: Any) -> list[tuple[memoryview, Any]]:
    """(bytes view, what to hand back on a hit) of each key's buffer: a contiguous CPU tensor
    (handed back itself), or a pointer with its size in bytes (True)."""
    if locations is None or len(locations) != len(keys):
        raise ValueError(f"{len(keys)} key(s): pass one tensor or pointer per key")
    out: list[tuple[memoryview, Any]] = []
    for i, location in enumerate(locations):
        if hasattr(location, "data_ptr"):
            if not location.is_contiguous() or location.device.type != "cpu":
                raise ValueError("pass contiguous CPU tensors")
            nbytes = location.numel() * location.element_size()
            out.append((byte_view(location.data_ptr(), nbytes), location))
        else:
            size = None if sizes is None else sizes[i]
            if not isinstance(location, int) or not isinstance(size, int) or size <= 0:
                raise ValueError(
                    f"key {keys[i]!r}: a pointer target needs its size in bytes (target_sizes)"
                )
            out.append((byte_view(location, size), True))
    return out
