"""``KVPoolTierManager``: kvpool as a secondary tier of vLLM's native KV offloading.

vLLM's ``TieringOffloadingSpec`` keeps a primary tier in CPU memory and cascades chunks to
secondary tiers, promoting them back on a hit. This tier is loaded the way vLLM loads any
out-of-tree tier, from its ``secondary_tiers`` entry::

    {"type": "KVPoolTierManager", "module_path": "kvpool.vllm", "master": "HOST:PORT"}

(``config.py`` lists every setting.) What each call becomes:

- construction: the longest key the tier can make is checked against kvpool's 1024-byte
  limit (a model name too long for it fails the engine's start, a ``ValueError``); then one
  ``exists_many`` of a probe key, so that credentials the master refuses, or a master whose
  TLS certificate the tier's CA does not vouch for, fail the engine's start (a
  ``ValueError``); a master that does not answer is logged, and the engine starts.
- ``lookup``: vLLM's own ``AsyncLookupManager``: keys gathered during a scheduler step go to
  the lookup thread after the step (RETRY until then), which asks kvpool one ``exists_many``
  per request of the step, one request after the other. A hit takes a read lease of
  ``lookup_lease_s``, so the chunk is not evicted between the lookup and its load (a key
  kvpool refuses, e.g. beyond the tenant's leases quota, is a miss and a warning, throttled).
  After a batch failed as a whole
  (master unreachable or silent), the next ``lookup_timeout_s`` of lookups are misses
  without asking: else every request would wait out the timeout, in series, behind the
  others.
- ``submit_store``: one ``put_many`` of the job's slots on the store thread, with a deadline
  counted from the submission (a job still queued then fails without starting). A key that
  is already stored counts as stored: objects are immutable and the key names the content.
- ``submit_load``: one ``get_into_many`` into the job's slots on the load thread, with a
  deadline counted from the submission. Chunks that arrived are the job's
  ``successful_keys``; the others are misses for the request (recomputed, never looked up
  again by it, so a dead node cannot make the scheduler retry forever). When the job ends,
  its read leases are given back (``release_leases``): the chunks can be evicted or removed
  at once, and stop counting against the tenant's leases quota.
- after a store or load got no answer from the master, jobs starting within the next second
  (at most their timeout) fail at once without calling it (``common/master_stall.py``);
  failures are logged at most once per kind and error every 10 s, with the count of lines
  left out.
- ``get_finished_jobs``: the results finished since the last poll; never blocks.
- ``drain_jobs``: waits until every submitted job is answered (bounded by their deadlines).
- ``shutdown``: cancels queued jobs (answered as failures, their slots untouched), waits for
  the running ones, and only then lets go of kvpool: after it returns nothing touches the
  primary tier's memory.

Keys are vLLM's own file names for chunks (``FileMapper``: model, KV layout, chunk size,
parallelism, block hash, group) under ``key_prefix`` (and the engine's KV cache layout where
its blocks are stored as the engine holds them: ``key_namespace``): two engines of the same
model and layout share chunks through kvpool, engines of anything else never read them. The model is
its name as vLLM was given it (a path or a Hugging Face id), not its weights: another
checkpoint served under the same name needs a ``key_prefix`` of its own.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import (
    JobId,
    JobResult,
    SecondaryTierManager,
    TransferJob,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvpool import Client
from kvpool.common.keys import MAX_KEY_BYTES, key_problem
from kvpool.common.log_throttle import LogThrottle
from kvpool.common.master_stall import MasterStall
from kvpool.errors import (
    KVPoolError,
    MasterNotTrusted,
    NotAuthenticated,
    PermissionDenied,
    QuotaExceeded,
)
from kvpool.vllm import transfers
from kvpool.vllm.config import KVPoolTierConfig
from kvpool.vllm.jobs import Finished, Job, Worker
from kvpool.vllm.stats import TierStats
from kvpool.vllm.transfers import PrimarySlots

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

logger = init_logger(__name__)

#: A load with less time than this left is answered as failed without starting.
MIN_LOAD_BUDGET = 0.001
#: Likewise a store.
MIN_STORE_BUDGET = 0.001
#: Deadline of the call that gives a load job's read leases back, after the job.
RELEASE_TIMEOUT_S = 1.0
#: Bytes of the longest block hash vLLM makes (sha256; xxhash's are shorter): keys are named
#: by its hex digits, so the longest key the tier can make has 64 of them.
LONGEST_BLOCK_HASH = 32
#: A failure line of each kind and error at most this often (the others counted in it).
LOG_INTERVAL = 10.0


def key_namespace(key_prefix: str, offloading_spec: Any) -> str:
    """Where the tier's chunk names live (``FileMapper``'s root): ``key_prefix``; then a CPU
    engine's namespace (``KVPoolCPUTieringSpec``: its chunks follow its own block layout);
    then, where chunks are the engine's blocks as it holds them (not vLLM's canonical
    layout, which ``FileMapper`` names itself), the engine's KV cache layout: engines of the
    same model on other attention backends (NHD against HND) hold blocks of the same size
    with the heads in another order, and must not load each other's."""
    namespace = key_prefix + getattr(offloading_spec, "kvpool_key_namespace", "")
    config = offloading_spec.config
    layout = getattr(config, "kv_cache_layout", None)
    if layout and not getattr(config, "canonical_layout", False):
        namespace += f"/layout-{layout}"
    return namespace


class KVPoolLookups(AsyncLookupManager):
    """vLLM's asynchronous lookups, answered by one kvpool ``exists_many`` per batch.

    vLLM's lookup thread calls ``batch_lookup`` once per request, one request after the
    other, and posts a step's answers only when all of its requests are done. A master that
    cannot be reached costs each call the whole ``lookup_timeout_s``: asked anyway, the
    requests of one step would wait that long times their number (and ``shutdown``, which
    joins the thread, as long as the backlog). So after a batch fails as a whole, lookups
    are misses without asking until ``lookup_timeout_s`` has passed (then one batch asks
    again), and once the tier is shut down they are misses at once."""

    def __init__(self, tier: KVPoolTierManager, client: Client, tier_type: str) -> None:
        self._tier = tier
        self._client = client
        #: Monotonic time before which lookups answer misses without asking kvpool (the
        #: lookup thread's own: only it reads and writes it).
        self._quiet_until = 0.0
        self._missed_unasked = 0
        super().__init__(tier_type=tier_type)  # starts the lookup thread: set fields first

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        if self._tier.closed:
            return [False] * len(keys)
        if time.monotonic() < self._quiet_until:
            self._missed_unasked += len(keys)
            self._tier.stats.count_lookup(len(keys), 0, failed=True)
            return [False] * len(keys)
        names = [self._tier.name(key) for key in keys]
        try:
            found = self._client.exists_many(names)
        except KVPoolError as error:
            pause = self._tier.config.lookup_timeout_s
            self._quiet_until = time.monotonic() + pause
            logger.warning(
                "kvpool tier: lookup of %d chunk(s): %s (%slookups miss for the next %g s "
                "without asking)",
                len(names),
                error,
                f"{self._missed_unasked} chunk(s) missed unasked before this; "
                if self._missed_unasked
                else "",
                pause,
            )
            self._missed_unasked = 0
            self._tier.stats.count_lookup(len(names), 0, failed=True)
            return [False] * len(names)
        hits = [result is True for result in found]
        refused = [result for result in found if isinstance(result, KVPoolError)]
        self._tier.stats.count_lookup(len(names), sum(hits), refused=len(refused))
        if refused:
            self._tier.warn_refused_lookups(len(names), refused)
        return hits


class KVPoolTierManager(SecondaryTierManager):
    """A secondary tier whose chunks live in a kvpool cluster (remote DRAM or NVMe)."""

    #: CPU memory of storage nodes (most often other hosts'; NVMe behind it where nodes have
    #: it). Hits are reported as a remote store's, not as the engine's own host memory.
    medium: ClassVar[Medium] = Medium.CPU
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.config = config = KVPoolTierConfig.from_settings(settings)
        self.locality = Locality(config.locality) if config.locality else None
        self.stats = TierStats()
        self._events: list[OffloadingEvent] | None = None
        if config.enable_kv_events:
            if offloading_spec.kv_events_config.enable_kv_cache_events:
                self._events = []
            else:
                logger.warning(
                    "kvpool tier %s: enable_kv_events is set but vLLM's KV cache events are "
                    "off: no events",
                    tier_type,
                )
        namespace = key_namespace(config.key_prefix, offloading_spec)
        # (blocks_per_file: a chunk of 4 blocks is other bytes than a chunk of 1 ending with
        # the same block hash, as vLLM's own file-system tier keys them apart)
        self._names = FileMapper.from_offloading_spec(
            namespace,
            offloading_spec,
            blocks_per_file=offloading_spec.blocks_per_chunk,
            parallel_agnostic=True,
        )
        self._check_key_length(tier_type, offloading_spec)
        self._slots = PrimarySlots(primary_kv_view)
        #: Keys of in-flight store jobs (events only) and load jobs (scheduler thread only).
        self._store_keys: dict[JobId, list[OffloadKey]] = {}
        self._load_keys: dict[JobId, list[OffloadKey]] = {}
        self._closed = False
        #: Jobs whose deadline passed while queued: a line now and then, not one per job.
        self._expired_log = LogThrottle(burst=1, interval=LOG_INTERVAL)
        #: Failed jobs and refused lookups: a line per kind and error now and then.
        self._failure_log = LogThrottle(burst=1, interval=LOG_INTERVAL)
        #: Stores and loads fail at once for a moment after the master did not answer one.
        self._stall = MasterStall()
        options = config.client_options()
        with ExitStack() as undo:
            # (a failed start lets go of the primary's memory, so that vLLM can unmap it)
            undo.callback(self._let_go_of_primary)
            self._store_client = Client(
                config.master,
                replicas=config.replicas or None,  # 0: the master's default
                timeout=config.store_timeout_s,
                **options,
            )
            undo.callback(self._store_client.close)
            self._load_client = Client(
                config.master,
                timeout=config.load_timeout_s,
                # The lease, timed from before the request like the deadline, outlasts it.
                lease_ttl=config.load_timeout_s,
                **options,
            )
            undo.callback(self._load_client.close)
            self._lookup_client = Client(
                config.master,
                timeout=config.lookup_timeout_s,
                # A hit's lease only has to last until its load starts (the load leases the
                # chunk itself, and gives that back when it ends): vLLM submits the load at
                # the end of the scheduler step that next looks the request up, and the load
                # waits in the queue at most load_timeout_s. The master's default (10 s)
                # would keep every chunk looked up pinned, and counted against the tenant's
                # leases quota, long after it was loaded (or never loaded).
                lease_ttl=config.lookup_lease_s,
                **options,
            )
            undo.callback(self._lookup_client.close)
            self._check_credentials(tier_type)
            undo.callback(self._slots.unregister)  # (also what a failed registration did)
            if config.register_primary:
                self._slots.register_with([self._store_client, self._load_client])
            self._finished: Finished[JobResult] = Finished()
            self._stores: Worker[JobResult] = Worker("kvpool-tier-store", self._finished)
            undo.callback(self._stores.stop)
            self._loads: Worker[JobResult] = Worker("kvpool-tier-load", self._finished)
            undo.callback(self._loads.stop)
            self._lookups = KVPoolLookups(self, self._lookup_client, tier_type)
            undo.pop_all()
        logger.info(
            "kvpool tier %s: master %s, %d slots of %d bytes%s, keys under %r",
            tier_type,
            config.master,
            self._slots.count,
            self._slots.stride,
            " (registered for zero copy)" if self._slots.registered else "",
            self._names.base_path,
        )

    def _let_go_of_primary(self) -> None:
        try:
            self._slots.release()
        except BufferError as error:  # (never hides why the start failed)
            logger.warning("kvpool tier: the primary memory is still in use: %s", error)

    def _check_key_length(self, tier_type: str, offloading_spec: OffloadingSpec) -> None:
        """Fails the engine's start when the tier's longest key (the longest block hash, the
        last KV cache group) is over kvpool's key limit: a long model name or key_prefix
        would else make every lookup a miss and every store a failure."""
        groups = len(offloading_spec.config.groups)
        longest = self.name(make_offload_key(b"\xff" * LONGEST_BLOCK_HASH, max(groups - 1, 0)))
        problem = key_problem(longest)
        if problem is not None:
            raise ValueError(
                f"kvpool tier {tier_type}: its keys would be too long for kvpool ({problem}; "
                f"kvpool keys are at most {MAX_KEY_BYTES} bytes): they are named by the "
                f"key_prefix {self.config.key_prefix!r} and the model name "
                f"{offloading_spec.config.model.name[:80]!r}"
                f"{'...' if len(offloading_spec.config.model.name) > 80 else ''} "
                f"({len(offloading_spec.config.model.name.encode())} bytes). Serve the model "
                "from a shorter path or name (vLLM's --model; --served-model-name does not "
                "count), or give the tier a shorter key_prefix."
            )

    def _check_credentials(self, tier_type: str) -> None:
        """One cheap authenticated call while the engine starts: credentials the master
        refuses, or a master whose certificate the tier's CA does not vouch for, fail the
        start (else every lookup, store and load would fail, each with a warning); a master
        that does not answer is only logged (engines start while the cluster is down, and
        find it once it is up)."""
        probe = f"{self._names.base_path}/kvpool-credentials-probe"
        try:
            self._lookup_client.exists_many([probe], lease=False)
        except (NotAuthenticated, PermissionDenied) as error:
            raise ValueError(
                f"kvpool tier {tier_type}: the master {self.config.master} refuses this "
                f"engine's credentials ({error}). Give the tier a valid client token of the "
                'tenant whose chunks it shares: "token" in its secondary_tiers entry (the '
                'token or "@/path/to/file"), else $KVPOOL_TOKEN or $KVPOOL_TOKEN_FILE.'
            ) from None
        except MasterNotTrusted as error:
            raise ValueError(
                f"kvpool tier {tier_type}: the master {self.config.master} is not trusted: its "
                f"TLS certificate fails this engine's check ({error}). Give the tier the CA "
                'that signed the master\'s certificate ("tls_ca" in its secondary_tiers '
                "entry, else $KVPOOL_TLS_CA), and name the master by an address its "
                "certificate holds."
            ) from None
        except KVPoolError as error:
            logger.warning(
                "kvpool tier %s: could not check the engine's credentials while it starts "
                "(%s); starting anyway: lookups miss and stores fail until the master answers",
                tier_type,
                error,
            )

    def name(self, key: OffloadKey) -> str:
        """The kvpool key of a chunk."""
        return self._names.get_file_name(key)

    # ------------------------------------------------------------------ requests and lookups

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def has_pending_work(self) -> bool:
        return self._finished.unanswered() > 0

    # ------------------------------------------------------------------ stores and loads

    def submit_store(self, job_metadata: TransferJob) -> None:
        job_id = job_metadata.job_id
        keys = list(job_metadata.keys)
        slots = [int(c) for c in job_metadata.chunk_ids]
        if self._refused(job_id, slots, keys, "store"):
            return
        if self._events is not None:
            self._store_keys[job_id] = keys
        deadline = time.monotonic() + self.config.store_timeout_s
        self._stores.submit(
            Job(
                run=lambda: self._run_store(job_id, keys, slots, deadline),
                cancel=lambda: JobResult(job_id=job_id, success=False),
            )
        )

    def submit_load(self, job_metadata: TransferJob) -> None:
        job_id = job_metadata.job_id
        keys = list(job_metadata.keys)
        slots = [int(c) for c in job_metadata.chunk_ids]
        self._load_keys[job_id] = keys
        if self._refused(job_id, slots, keys, "load"):
            return
        deadline = time.monotonic() + self.config.load_timeout_s
        self._loads.submit(
            Job(
                run=lambda: self._run_load(job_id, keys, slots, deadline),
                cancel=lambda: JobResult(job_id=job_id, success=False),
            )
        )

    def _refused(self, job_id: JobId, slots: list[int], keys: list[OffloadKey], kind: str) -> bool:
        """Answers a job that cannot run (closed tier, bad slots) as failed, at once."""
        problem = "the tier is shut down" if self._closed else self._slots.problem(slots, len(keys))
        if problem is None:
            return False
        logger.warning("kvpool tier: %s job %d refused: %s", kind, job_id, problem)
        self._finished.opened()
        self._finished.finish(JobResult(job_id=job_id, success=False))
        return True

    def _run_store(
        self, job_id: JobId, keys: list[OffloadKey], slots: list[int], deadline: float
    ) -> JobResult:
        budget = deadline - time.monotonic()
        if budget < MIN_STORE_BUDGET:
            # Queued behind slower stores past its deadline: failed at once, so that
            # drain_jobs waits at most store_timeout_s, not one timeout per queued job.
            self.stats.count_store(0, 0, len(keys), 0, skipped="expired")
            self._log_expired("store", len(keys))
            return JobResult(job_id=job_id, success=False)
        if self._stall.stalled():
            # The master just did not answer a store or load: failed at once (vLLM keeps the
            # chunks in its primary tier), not one more call to wait out.
            self.stats.count_store(0, 0, len(keys), 0, skipped="unasked")
            self._log_expired("store", len(keys), "stall")
            return JobResult(job_id=job_id, success=False)
        # Only this thread uses the store client: its timeout can be this job's budget.
        self._store_client.timeout = budget
        names = [self.name(key) for key in keys]
        outcome = transfers.store(self._store_client, names, [self._slots.slot(s) for s in slots])
        self._stall.note(outcome.errors.values(), budget)
        failed = len(outcome.errors)
        self.stats.count_store(len(outcome.new), len(outcome.existing), failed, outcome.bytes)
        if failed:
            first = next(iter(outcome.errors.values()))
            self._warn(
                ("store", type(first).__name__),
                "kvpool tier: %d of %d chunk(s) not stored, first: %s",
                failed,
                len(keys),
                first,
            )
        return JobResult(
            job_id=job_id,
            success=not failed,
            transfer_time=outcome.seconds,
            transfer_bytes=outcome.bytes,
        )

    def _run_load(
        self, job_id: JobId, keys: list[OffloadKey], slots: list[int], deadline: float
    ) -> JobResult:
        budget = deadline - time.monotonic()
        if budget < MIN_LOAD_BUDGET:
            self.stats.count_load(0, len(keys), 0, late=True, skipped="expired")
            self._log_expired("load", len(keys))
            return JobResult(job_id=job_id, success=False)
        if self._stall.stalled():
            self.stats.count_load(0, len(keys), 0, late=False, skipped="unasked")
            self._log_expired("load", len(keys), "stall")
            return JobResult(job_id=job_id, success=False)
        names = [self.name(key) for key in keys]
        try:
            return self._load(job_id, keys, names, slots, deadline, budget)
        finally:
            # Success, failure or an exception: the job is done with the chunks, so its read
            # leases end now, not load_timeout_s later (they would pin the chunks against
            # eviction and removal, and count against the tenant's leases quota). (A job that
            # never ran, cancelled or failed unasked, took no lease to give back.)
            self._release_leases(names)

    def _load(
        self,
        job_id: JobId,
        keys: list[OffloadKey],
        names: list[str],
        slots: list[int],
        deadline: float,
        budget: float,
    ) -> JobResult:
        # Only this thread uses the load client: its timeout can be this job's budget.
        self._load_client.timeout = budget
        outcome = transfers.load(self._load_client, names, [self._slots.slot(s) for s in slots])
        self._stall.note(outcome.errors.values(), budget)
        late = time.monotonic() >= deadline
        self.stats.count_load(len(outcome.hits), len(outcome.errors), outcome.bytes, late)
        if outcome.errors:
            first = next(iter(outcome.errors.values()))
            self._warn(
                ("load", type(first).__name__),
                "kvpool tier: %d of %d chunk(s) not loaded%s, first: %s",
                len(outcome.errors),
                len(keys),
                " (deadline passed)" if late else "",
                first,
            )
            return JobResult(
                job_id=job_id,
                success=False,
                successful_keys=tuple(keys[i] for i in outcome.hits) or None,
                transfer_time=outcome.seconds,
                transfer_bytes=outcome.bytes,
            )
        return JobResult(
            job_id=job_id,
            success=True,
            transfer_time=outcome.seconds,
            transfer_bytes=outcome.bytes,
        )

    def _release_leases(self, names: list[str]) -> None:
        """Ends the load client's read leases on ``names`` (best effort: a lease not given
        back runs out by itself, within load_timeout_s). Not while the master is not
        answering: the call would only wait out its deadline, before the next job."""
        if self._stall.stalled():
            return
        self._load_client.timeout = RELEASE_TIMEOUT_S
        try:
            self._load_client.release_leases(names)
        except KVPoolError as error:
            self._stall.note([error], RELEASE_TIMEOUT_S)
            self._warn(
                ("release", type(error).__name__),
                "kvpool tier: could not give back the read leases of %d loaded chunk(s) "
                "(they run out by themselves): %s",
                len(names),
                error,
            )

    def warn_refused_lookups(self, asked: int, refused: list[KVPoolError]) -> None:
        """Lookups kvpool answered with an error for some keys (a quota, an invalid key):
        misses for vLLM, and a line per error type now and then, so that they are not
        silent."""
        first = refused[0]
        why = (
            " (a quota of the tenant: a hit takes a read lease, which the leases quota "
            "counts; see `kvpool quota`)"
            if isinstance(first, QuotaExceeded)
            else ""
        )
        self._warn(
            ("lookup", type(first).__name__),
            "kvpool tier: %d of %d chunk(s) looked up were refused, missed: %s%s",
            len(refused),
            asked,
            first,
            why,
        )

    def _warn(self, key: tuple[str, str], message: str, *args: object) -> None:
        """``message``, unless a line of the same ``key`` (kind, error type) went out less
        than ``LOG_INTERVAL`` ago: then counted, and the count said with the next one."""
        self._failure_log.log(logger, key, message, *args, stacklevel=2)

    def _log_expired(self, kind: str, chunks: int, reason: str = "deadline") -> None:
        """A job not run: its deadline passed while it waited behind others (a stalled
        master or storage node), or the master had just not answered a call. Says so, at
        most once per kind and reason every 10 s."""
        self._expired_log.log(
            logger,
            (kind, reason),
            "kvpool tier: a %s job of %d chunk(s) %s and was not run",
            kind,
            chunks,
            "came just after the master did not answer a call"
            if reason == "stall"
            else "waited past its deadline in the queue",
            stacklevel=2,
        )

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = self._finished.take()
        for result in results:
            stored = self._store_keys.pop(result.job_id, None)
            if stored and result.success and self._events is not None:
                self._events.append(
                    OffloadingEvent(
                        keys=stored, medium=self.medium, removed=False, locality=self.locality
                    )
                )
            loaded = self._load_keys.pop(result.job_id, None)
            if loaded is not None and not result.success:
                # The chunks that did not arrive are misses for their requests from now on
                # (recomputed), so the scheduler does not promote them again and again.
                arrived = set(result.successful_keys or ())
                self._lookups.mark_miss([key for key in loaded if key not in arrived])
        return results

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events:
            events, self._events = self._events, []
            yield from events

    def drain_jobs(self) -> None:
        self._finished.wait_answered()

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Workers first: queued jobs are answered as failed without touching their slots,
        # the running ones end by their deadlines. Only then may kvpool let go of the memory.
        self._loads.stop()
        self._stores.stop()
        self._lookups.shutdown()
        self._slots.unregister()
        for client in (self._lookup_client, self._load_client, self._store_client):
            client.close()
        # Views of the primary's memory may still sit in reference cycles (a failed
        # transfer's frames): freed now, while vLLM still has the memory mapped, not by a
        # later collection after it unmapped it.
        gc.collect()
        try:
            self._slots.release()
        except BufferError as error:  # something still holds a slot: vLLM will say so too
            logger.warning("kvpool tier: the primary memory is still in use: %s", error)
        logger.info("kvpool tier %s closed: %s", self.tier_type, self.stats.snapshot())

    @property
    def closed(self) -> bool:
        return self._closed
