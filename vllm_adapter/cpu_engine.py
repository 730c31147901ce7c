"""vLLM's native tiered offloading for engines that run on CPU (``KVPoolCPUTieringSpec``).

vLLM 0.32's offloading worker moves blocks between accelerator memory and the CPU primary
tier with device streams and copy kernels, and refuses engines without an accelerator
("CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"). An engine on CPU
already holds its KV cache in host memory: moving a block to the primary tier is a memory
copy. This spec is vLLM's ``TieringOffloadingSpec`` (same scheduler side, same primary tier,
same secondary tiers, kvpool's among them) with a worker that makes those copies directly.
Select it with ``"spec_name": "KVPoolCPUTieringSpec", "spec_module_path": "kvpool.vllm"``;
engines on GPUs use vLLM's own ``TieringOffloadingSpec``.

Supported: the direct layout with one engine block per offloaded chunk (the default: leave
``block_size`` out of the extra config), any number of KV cache groups and layers. The copies
run synchronously when the connector submits them: on CPU the model has finished writing the
blocks a store reads, and a load's blocks are in place before the forward pass that uses them.

Chunks written by CPU engines live under their own key namespace (``KEY_NAMESPACE`` after the
tier's key prefix): their bytes follow the CPU attention backend's block layout, which no
GPU engine of the same model could read.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

#: Appended to the kvpool tier's key prefix under this spec.
KEY_NAMESPACE = "/cpu-engine"


class KVPoolCPUTieringSpec(TieringOffloadingSpec):
    """``TieringOffloadingSpec`` whose worker copies between a CPU engine's KV cache and the
    primary tier (see the module's docstring)."""

    kvpool_key_namespace = KEY_NAMESPACE
    _worker: OffloadingWorker | None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = self.create_worker(kv_caches)
        return self._worker

    def create_worker(self, kv_caches: CanonicalKVCaches) -> HostCopyWorker:
        if self.config.canonical_layout:
            raise ValueError(
                "KVPoolCPUTieringSpec supports the direct KV layout only: remove "
                "canonical_layout from kv_connector_extra_config"
            )
        if self.blocks_per_chunk != 1:
            raise ValueError(
                f"KVPoolCPUTieringSpec moves one engine block per chunk, but block_size makes "
                f"{self.blocks_per_chunk}: leave block_size out of kv_connector_extra_config"
            )
        rank = 0 if self.replicated_layout else self.config.parallel.rank
        region = SharedOffloadRegion(
            engine_id=self._engine_id,
            num_chunks=self.num_chunks,
            rank=rank,
            kv_bytes_per_chunk=self.kv_bytes_per_chunk,
            cpu_page_size=self.cpu_page_size_per_worker,
        )
        try:
            return HostCopyWorker(kv_caches, region)
        except Exception:
            region.cleanup()
            raise


class HostCopyWorker(OffloadingWorker):
    """Copies blocks between a CPU engine's KV cache tensors and the primary tier's region,
    one tensor (layer or layer group) at a time, all of a job's blocks in one indexed copy."""

    def __init__(self, kv_caches: CanonicalKVCaches, region: SharedOffloadRegion) -> None:
        self._region: SharedOffloadRegion | None = region
        self._engine: list[torch.Tensor] = []
        self._primary: list[torch.Tensor] = []
        for cache in kv_caches.tensors:
            if cache.tensor.device.type != "cpu":
                raise ValueError(
                    f"KVPoolCPUTieringSpec is for engines on CPU; this KV cache is on "
                    f"{cache.tensor.device}: use vLLM's TieringOffloadingSpec"
                )
            page = cache.page_size_bytes
            self._engine.append(cache.tensor.view(torch.int8).view(-1, page))
            self._primary.append(region.create_next_worker_view(page))
        self._refs = kv_caches.group_data_refs
        self._finished: list[TransferResult] = []

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        assert isinstance(dst_spec, CPULoadStoreSpec)
        return self._copy(job_id, src_spec, dst_spec.chunk_ids, to_primary=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        assert isinstance(src_spec, CPULoadStoreSpec)
        return self._copy(job_id, dst_spec, src_spec.chunk_ids, to_primary=False)

    def _copy(
        self, job_id: int, engine: GPULoadStoreSpec, chunks: np.ndarray, to_primary: bool
    ) -> bool:
        started = time.perf_counter()
        assert len(chunks) == len(engine.block_ids), "one engine block per chunk"
        moved = offset = 0
        for group, size in enumerate(engine.group_sizes):
            if size == 0:
                continue
            blocks = torch.from_numpy(engine.block_ids[offset : offset + size].astype(np.int64))
            slots = torch.from_numpy(chunks[offset : offset + size].astype(np.int64))
            offset += size
            for ref in self._refs[group]:
                page = ref.page_size_bytes
                cache, primary = self._engine[ref.tensor_idx], self._primary[ref.tensor_idx]
                if to_primary:
                    primary[slots, :page] = cache[blocks, :page]
                else:
                    cache[blocks, :page] = primary[slots, :page]
                moved += size * page
        seconds = time.perf_counter() - started
        self._finished.append(TransferResult(job_id, True, moved, seconds))
        return True

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return  # every copy finished within its submit

    def shutdown(self) -> None:
        self._engine.clear()
        self._primary.clear()
        if self._region is not None:
            self._region.cleanup()
            self._region = None
