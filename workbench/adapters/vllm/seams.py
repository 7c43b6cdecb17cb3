"""The seams every vLLM plan shares (``plan26.py``, ``plan.py``, ``plan34.py``): module names,
the block pool's common check and the patches whose target did not move between releases. A plan
adds the checks that pin its own release's seams; no plan imports another."""

from __future__ import annotations

from types import ModuleType

from workbench.adapters.patching import need_attrs, need_params, replace_class, wrap_method

POOL = "vllm.v1.core.block_pool"
MGR = "vllm.v1.core.kv_cache_manager"
WORKER_UTILS = "vllm.v1.worker.utils"
GPU_WORKER = "vllm.v1.worker.gpu_worker"


def check_pool(m: ModuleType, *params: str) -> str | None:
    """``BlockPool`` with the methods ``ElasticBlockPool`` overrides, the constructor
    parameters it passes through (``params``: a release's own), and the free queue it walks."""
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


def apply_pool(m: ModuleType):
    from workbench.adapters.vllm.pool import ElasticBlockPool

    return replace_class(m, "BlockPool", ElasticBlockPool, "vllm")


def check_mgr(m: ModuleType) -> str | None:
    cls = getattr(m, "KVCacheManager", None)
    return f"{MGR} has no KVCacheManager" if cls is None else need_attrs(cls, "allocate_slots")


def apply_mgr(m: ModuleType):
    from workbench.adapters.vllm.pool import allocate_slots_or_none

    return wrap_method(m.KVCacheManager, "allocate_slots", allocate_slots_or_none)


POOL_DOC = "BlockPool -> ElasticBlockPool (vLLM's prefix caching kept; pages follow held blocks)"
MGR_DOC = "KVCacheManager.allocate_slots: a failed page map is None (preempt), not a crash"
