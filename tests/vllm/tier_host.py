"""A vLLM scheduler's side of the kvpool tier, driven by the tests over a pipe.

Runs in .venv-vllm (vLLM's own virtualenv, see scripts/install_vllm.sh), not in the tests'
process: it builds vLLM's ``TieringOffloadingSpec`` from an ``OffloadingConfig`` whose
``secondary_tiers`` entry names ``kvpool.vllm`` by module path, exactly as an engine does
(``get_manager``: the shared primary region, the primary tier, the tier factory), and then
calls the secondary tier the way vLLM's ``TieringOffloadingManager`` does: lookups across
scheduler steps, store and load jobs naming primary slots, polls for finished jobs, drain,
shutdown. Every call the scheduler would make is timed, so the tests can tell a call that
returned at once from one that waited on the network.

One JSON object per line in (``{"op": ..., ...}``), one per line out (``{"ok": true, ...}``
or ``{"ok": false, "error": TYPE, "message": ...}``). vLLM's logs go to stderr.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import sys
import time
import traceback
from typing import Any

# The answers go to the original stdout; everything printed by vLLM or kvpool to stderr.
_ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import numpy as np  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402
from vllm.v1.kv_offload.file_mapper import FileMapper  # noqa: E402
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402

STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


class _Lines(logging.Handler):
    """The kvpool tier's log lines (warnings and up), kept for ``op_logs`` as well as
    printed to stderr by the loggers' own handlers."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


LINES = _Lines()
logging.getLogger("kvpool").addHandler(LINES)


def key(n: int, group: int = 0) -> OffloadKey:
    return make_offload_key(n.to_bytes(8, "big"), group)


def key_number(k: OffloadKey) -> int:
    return int.from_bytes(k[:-4], "big")


class Host:
    def __init__(self) -> None:
        self.engines: dict[int, Any] = {}  # tier id -> (spec, manager, tier, slots view)
        self.next_id = 0

    # ------------------------------------------------------------------ building

    def op_tier_class(self, tier: dict) -> dict:
        cls = SecondaryTierFactory.get_tier_class(tier)
        return {"class": f"{cls.__module__}.{cls.__qualname__}"}

    def op_create(
        self,
        tier: dict,
        slots: int = 8,
        slot_bytes: int = 64 * 1024,
        model: str = "kvpool-test/tiny",
        kv_events: bool = False,
        unset_env: tuple[str, ...] = (),
        blocks_per_chunk: int = 1,
        kv_cache_layout: str | None = None,
    ) -> dict:
        """vLLM's own path from configuration to tier: spec factory, ``get_manager``.
        ``slot_bytes``: the bytes of one engine block, ``blocks_per_chunk`` of which make
        a primary slot (a chunk). ``unset_env``: variables missing from the environment
        while the tier is built. ``kv_cache_layout``: the engine's, as vLLM resolves it from
        its attention backend."""
        config = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
            worker_kv_bytes_per_block=slot_bytes,
            enable_kv_cache_events=kv_events,
            extra_config={
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": slots * slot_bytes * blocks_per_chunk,
                "secondary_tiers": [dict(tier)],
            },
            engine_id=f"kvpool-test-{os.getpid()}-{self.next_id}",
            kv_cache_layout=kv_cache_layout,
            model=OffloadingModelConfig(name=model, dtype="bfloat16"),
            cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
            parallel=OffloadingParallelConfig(
                rank=0,
                world_size=1,
                tp_size=1,
                pp_size=1,
                pcp_size=1,
                dcp_size=1,
                data_parallel_index=0,
                data_parallel_size=1,
                data_parallel_rank_local=None,
                is_parallelism_agnostic=False,
            ),
        )
        saved = {name: os.environ.pop(name) for name in unset_env if name in os.environ}
        try:
            started = time.monotonic()
            spec = OffloadingSpecFactory.create_spec(config)
            manager = spec.get_manager()
            seconds = time.monotonic() - started
        finally:
            os.environ.update(saved)
        (tier_obj,) = manager.secondary_tiers
        view = manager.primary_tier.get_kv_memoryview()
        array = np.frombuffer(view.cast("B"), dtype=np.uint8).reshape(view.shape)
        tier_id = self.next_id
        self.next_id += 1
        self.engines[tier_id] = (spec, manager, tier_obj, array)
        cls = type(tier_obj)
        return {
            "tier_id": tier_id,
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "tier_type": tier_obj.tier_type,
            "locality": tier_obj.locality.value if tier_obj.locality else None,
            "medium": tier_obj.medium.value if tier_obj.medium else None,
            "cache_hit_source": str(tier_obj.cache_hit_source.value),
            "slots": array.shape[0],
            "slot_bytes": tier_obj.block_size_bytes,
            "chunk_bytes": array.shape[1],
            "seconds": seconds,
        }

    def _tier(self, tier_id: int) -> Any:
        return self.engines[tier_id][2]

    def _slots(self, tier_id: int) -> np.ndarray:
        return self.engines[tier_id][3]

    # ------------------------------------------------------------------ primary memory

    def op_fill(self, tier_id: int, slots: list[int], seed: int) -> dict:
        """Random bytes in each slot, different per (seed, slot); their digests."""
        array = self._slots(tier_id)
        for s in slots:
            array[s] = np.random.default_rng([seed, s]).integers(0, 256, array.shape[1], np.uint8)
        return self.op_digest(tier_id, slots)

    def op_set(self, tier_id: int, slots: list[int], byte: int) -> dict:
        array = self._slots(tier_id)
        for s in slots:
            array[s] = byte
        return {}

    def op_digest(self, tier_id: int, slots: list[int]) -> dict:
        array = self._slots(tier_id)
        return {"digests": [hashlib.sha256(array[s].tobytes()).hexdigest() for s in slots]}

    def op_uniform(self, tier_id: int, slots: list[int]) -> dict:
        """For each slot, its one byte value if every byte is the same, else None."""
        array = self._slots(tier_id)
        return {
            "bytes": [int(array[s][0]) if (array[s] == array[s][0]).all() else None for s in slots]
        }

    # ------------------------------------------------------------------ the scheduler's calls

    def op_names(self, tier_id: int, keys: list[int]) -> dict:
        return {"names": [self._tier(tier_id).name(key(k)) for k in keys]}

    def op_file_names(self, tier_id: int, keys: list[int], **mapper: Any) -> dict:
        """vLLM's own ``FileMapper`` names of ``keys`` under the tier's spec and the default
        ``vllm`` prefix, ``mapper`` being the rest of its arguments."""
        spec = self.engines[tier_id][0]
        names = FileMapper.from_offloading_spec("vllm", spec, parallel_agnostic=True, **mapper)
        return {"names": [names.get_file_name(key(k)) for k in keys]}

    def op_lookup(
        self, tier_id: int, keys: list[int], req_id: str = "req", timeout: float = 10.0
    ) -> dict:
        """Looks ``keys`` up step after step, as the scheduler does, until none is RETRY."""
        tier = self._tier(tier_id)
        context = ReqContext(req_id=req_id)
        longest = 0.0

        def timed(call: Any, *args: Any) -> Any:
            nonlocal longest
            started = time.monotonic()
            result = call(*args)
            longest = max(longest, time.monotonic() - started)
            return result

        first = [timed(tier.lookup, key(k), context).name for k in keys]
        final, steps = first, 0
        deadline = time.monotonic() + timeout
        while "RETRY" in final and time.monotonic() < deadline:
            timed(tier.on_schedule_end, STEP)
            steps += 1
            time.sleep(0.005)
            final = [timed(tier.lookup, key(k), context).name for k in keys]
        return {"first": first, "final": final, "steps": steps, "longest_call_s": longest}

    def op_lookup_steps(
        self,
        tier_id: int,
        steps: list[dict[str, list[int]]],
        wait: bool = True,
        timeout: float = 60.0,
    ) -> dict:
        """Several requests per scheduler step, as the scheduler makes them: each step looks
        up every key of its requests (request id -> keys) and ends; then, with ``wait``,
        steps on until no request sees RETRY. Answers, per request, its final verdicts and
        the seconds from the first step until they came."""
        tier = self._tier(tier_id)
        started = time.monotonic()
        asked: dict[str, list[int]] = {}
        for step in steps:
            for req_id, keys in step.items():
                for k in keys:
                    tier.lookup(key(k), ReqContext(req_id=req_id))
                asked[req_id] = keys
            tier.on_schedule_end(STEP)
        seconds: dict[str, float] = {}
        final: dict[str, list[str]] = {}
        while wait and len(final) < len(asked) and time.monotonic() - started < timeout:
            for req_id, keys in asked.items():
                if req_id in final:
                    continue
                verdicts = [tier.lookup(key(k), ReqContext(req_id=req_id)).name for k in keys]
                if "RETRY" not in verdicts:
                    final[req_id] = verdicts
                    seconds[req_id] = time.monotonic() - started
            tier.on_schedule_end(STEP)
            time.sleep(0.005)
        return {"final": final, "seconds": seconds}

    def op_lookup_again(self, tier_id: int, keys: list[int], req_id: str = "req") -> dict:
        """One lookup per key for a request, without a step in between (cached verdicts)."""
        tier = self._tier(tier_id)
        context = ReqContext(req_id=req_id)
        return {"results": [tier.lookup(key(k), context).name for k in keys]}

    def op_request_finished(self, tier_id: int, req_id: str) -> dict:
        self._tier(tier_id).on_request_finished(ReqContext(req_id=req_id))
        return {}

    def _submit(self, tier_id: int, job_id: int, keys: list[int], slots: list[int], load: bool):
        tier = self._tier(tier_id)
        job = TransferJob(
            job_id=job_id,
            keys=[key(k) for k in keys],
            chunk_ids=np.array(slots, dtype=np.int32),
            is_promotion=load,
            req_context=ReqContext(req_id=f"job-{job_id}"),
        )
        started = time.monotonic()
        (tier.submit_load if load else tier.submit_store)(job)
        return {"submit_s": time.monotonic() - started}

    def op_store(self, tier_id: int, job_id: int, keys: list[int], slots: list[int]) -> dict:
        return self._submit(tier_id, job_id, keys, slots, load=False)

    def op_load(self, tier_id: int, job_id: int, keys: list[int], slots: list[int]) -> dict:
        return self._submit(tier_id, job_id, keys, slots, load=True)

    def op_wait(self, tier_id: int, job_ids: list[int], timeout: float = 30.0) -> dict:
        """Polls ``get_finished_jobs`` until every job of ``job_ids`` is answered."""
        tier = self._tier(tier_id)
        results: list[JobResult] = []
        longest, polls = 0.0, 0
        started = time.monotonic()
        waiting = set(job_ids)
        while waiting and time.monotonic() - started < timeout:
            poll_start = time.monotonic()
            finished = list(tier.get_finished_jobs())
            longest = max(longest, time.monotonic() - poll_start)
            polls += 1
            results.extend(finished)
            waiting -= {r.job_id for r in finished}
            if waiting:
                time.sleep(0.002)
        return {
            "results": [_result(r) for r in results],
            "unanswered": sorted(waiting),
            "elapsed_s": time.monotonic() - started,
            "longest_poll_s": longest,
            "polls": polls,
            "pending_work": tier.has_pending_work(),
        }

    def op_finished(self, tier_id: int) -> dict:
        return {"results": [_result(r) for r in self._tier(tier_id).get_finished_jobs()]}

    def op_drain(self, tier_id: int) -> dict:
        started = time.monotonic()
        self._tier(tier_id).drain_jobs()
        return {"seconds": time.monotonic() - started}

    def op_events(self, tier_id: int) -> dict:
        return {
            "events": [
                {
                    "keys": [key_number(k) for k in event.keys],
                    "removed": event.removed,
                    "medium": event.medium.value,
                    "locality": event.locality.value if event.locality else None,
                }
                for event in self._tier(tier_id).take_events()
            ]
        }

    def op_stats(self, tier_id: int) -> dict:
        tier = self._tier(tier_id)
        return {"stats": tier.stats.snapshot(), "pending_work": tier.has_pending_work()}

    def op_logs(self, tier_id: int | None = None) -> dict:
        """The kvpool log lines (warnings and up) since the last call, of every tier (the
        one named or not)."""
        lines, LINES.lines = LINES.lines, []
        return {"lines": lines}

    def op_collect(self) -> dict:
        """A full garbage collection, as the engine's collector makes at some point."""
        return {"collected": gc.collect()}

    def op_shutdown(self, tier_id: int) -> dict:
        """The engine's shutdown: the manager shuts the tier down, then the primary tier."""
        _, manager, tier, array = self.engines.pop(tier_id)
        del array  # (this host's view of the primary memory: vLLM unmaps it now)
        started = time.monotonic()
        manager.shutdown()
        return {"seconds": time.monotonic() - started, "closed": getattr(tier, "closed", None)}


def _result(result: JobResult) -> dict:
    keys = result.successful_keys
    return {
        "job_id": result.job_id,
        "success": result.success,
        "successful_keys": None if keys is None else sorted(key_number(k) for k in keys),
        "transfer_bytes": result.transfer_bytes,
    }


def main() -> None:
    host = Host()
    _ANSWERS.write(json.dumps({"ok": True, "ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            answer = {"ok": True, **getattr(host, f"op_{op}")(**request)}
        except Exception as error:
            traceback.print_exc()
            answer = {"ok": False, "error": type(error).__name__, "message": str(error)}
        _ANSWERS.write(json.dumps(answer) + "\n")
    for tier_id in list(host.engines):
        host.op_shutdown(tier_id)


if __name__ == "__main__":
    main()
