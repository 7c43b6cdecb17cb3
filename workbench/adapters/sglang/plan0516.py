"""SGLang 0.5.16's patch plan (the release pinned to torch 2.11, the H200 image's torch).

Seams, read from the 0.5.16 wheel against 0.5.23's:

* ``MHATokenToKVPool``/``MLATokenToKVPool``: the same buffer seams (``_create_buffers_normal``,
  ``_kv_buffer_shapes``, ``_create_buffers``); the same elastic pools serve both.
* The allocators: free groups by flag, the paged allocator frees token indices and always runs
  its Triton kernels (see ``allocator0516.py``).
* ``RadixCache`` has no ``on_release``: the bound follows ``cache_finished_req``.
* ``KVCacheConfigurator._profile_available_bytes`` reads ``server_args.mem_fraction_static``
  (0.5.23: ``get_schedule()``); the invariant checker's ``_check_full_pool`` is unchanged.
"""

from __future__ import annotations

from types import ModuleType

from workbench.adapters.patching import (
    need_attrs,
    need_params,
    need_source,
    replace_class,
    wrap_method,
)
from workbench.adapters.registry import EnginePlan, Patch
from workbench.adapters.sglang.seams import (
    ALLOC,
    CONFIGURATOR,
    FIX,
    RADIX,
    pool_patches,
    scheduler_patches,
)

RANGE = ">=0.5.16,<0.5.17"


def _check_token(m: ModuleType) -> str | None:
    from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator as Base

    cls = getattr(m, "TokenToKVPoolAllocator", None)
    if cls is None:
        return f"{ALLOC} has no TokenToKVPoolAllocator"
    return (need_attrs(cls, "alloc", "free", "available_size", "clear", "free_group_begin",
                       "free_group_end", "merge_and_sort_free")
            or need_params(cls.__init__, "size", "dtype", "device", "kvcache", "need_sort")
            or need_source(Base.free_group_end, "is_not_in_free_group", "self.free("))


def _apply_token(m: ModuleType):
    from workbench.adapters.sglang.allocator0516 import ElasticTokenToKVPoolAllocator0516

    return replace_class(m, "TokenToKVPoolAllocator", ElasticTokenToKVPoolAllocator0516,
                         "sglang")


def _check_paged(m: ModuleType) -> str | None:
    from sglang.srt.mem_cache.allocator import paged

    cls = getattr(m, "PagedTokenToKVPoolAllocator", None)
    if cls is None:
        return f"{ALLOC} has no PagedTokenToKVPoolAllocator"
    return (need_attrs(paged, "get_num_new_pages", "alloc_extend_naive", "alloc_extend_kernel",
                       "alloc_decode_kernel", "next_power_of_2")
            or need_attrs(cls, "alloc", "alloc_extend", "alloc_decode", "free", "clear")
            or need_params(cls.__init__, "size", "page_size", "dtype", "device", "kvcache",
                           "need_sort")
            or need_params(cls.alloc_extend, "prefix_lens", "prefix_lens_cpu", "seq_lens",
                           "seq_lens_cpu", "last_loc", "extend_num_tokens", "num_new_pages")
            or need_params(cls.alloc_decode, "seq_lens", "seq_lens_cpu", "last_loc")
            or need_params(paged.alloc_extend_naive, "prefix_lens", "seq_lens", "last_loc",
                           "free_pages", "out_indices", "page_size", "device"))


def _apply_paged(m: ModuleType):
    from workbench.adapters.sglang.allocator0516 import ElasticPagedTokenToKVPoolAllocator0516

    return replace_class(m, "PagedTokenToKVPoolAllocator",
                         ElasticPagedTokenToKVPoolAllocator0516, "sglang")


def _check_radix(m: ModuleType) -> str | None:
    cls = getattr(m, "RadixCache", None)
    if cls is None:
        return f"{RADIX} has no RadixCache"
    return (need_attrs(cls, "evict", "evictable_size")
            or ("RadixCache defines no cache_finished_req of its own"
                if "cache_finished_req" not in cls.__dict__ else None)
            or need_params(cls.cache_finished_req, "req", "is_insert", "kv_len_to_handle"))


def _apply_radix(m: ModuleType):
    from workbench.adapters import runtime
    from workbench.adapters.sglang.radix import make_cache_finished

    bound = runtime.pool_config().max_cached_tokens
    return wrap_method(m.RadixCache, "cache_finished_req",
                       lambda orig: make_cache_finished(orig, bound))


def _check_budget(m: ModuleType) -> str | None:
    cls = getattr(m, "KVCacheConfigurator", None)
    if cls is None:
        return f"{CONFIGURATOR} has no KVCacheConfigurator"
    return (need_params(cls._profile_available_bytes, "pre_model_load_memory")
            or need_source(cls._profile_available_bytes, "server_args.mem_fraction_static"))


def _apply_budget(m: ModuleType):
    from workbench.adapters.sglang.budget import make_profile

    return wrap_method(m.KVCacheConfigurator, "_profile_available_bytes", lambda orig: make_profile(
        orig, m, fraction_of=lambda cfg: cfg.server_args.mem_fraction_static))


def build_plan() -> EnginePlan:
    def p(name, module, apply, check, doc, required=True, server_side=False):
        return Patch(name, module, RANGE, apply, check, fix=FIX, doc=doc, required=required,
                     server_side=server_side)

    return EnginePlan("sglang", "sglang", ("sglang",), [
        *pool_patches(p),
        p("elastic-token-allocator", ALLOC, _apply_token, _check_token,
          "TokenToKVPoolAllocator -> elastic (page_size 1; miss -> None; 0.5.16 free groups)"),
        p("elastic-paged-allocator", ALLOC, _apply_paged, _check_paged,
          "PagedTokenToKVPoolAllocator -> elastic (token-index frees; miss -> None)"),
        p("radix-cache-bound", RADIX, _apply_radix, _check_radix,
          "RadixCache.cache_finished_req evicts down to WORKBENCH_KV_MAX_CACHED_TOKENS"),
        p("kv-budget", CONFIGURATOR, _apply_budget, _check_budget,
          "KV pool sized from a per-process virtual budget, not the GPU's free memory",
          required=False),
        *scheduler_patches(p),
    ])
