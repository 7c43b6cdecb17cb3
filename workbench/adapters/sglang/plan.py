"""SGLang 0.5.23's patch plan (the range says so). SGLang 0.5.16 has its own (``plan0516.py``);
``plans.py`` picks one by the installed version, and refuses other versions with the reason
rather than patching on hope. The seams both share are in ``seams.py``."""

from __future__ import annotations

from types import ModuleType

from workbench.adapters.patching import (
    need_attrs,
    need_params,
    override_method,
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

RANGE = ">=0.5.23,<0.5.24"


def _check_budget(m: ModuleType) -> str | None:
    cls = getattr(m, "KVCacheConfigurator", None)
    if cls is None:
        return f"{CONFIGURATOR} has no KVCacheConfigurator"
    return (need_attrs(m, "get_schedule")
            or need_params(cls._profile_available_bytes, "pre_model_load_memory"))


def _apply_budget(m: ModuleType):
    from workbench.adapters.sglang.budget import make_profile

    return wrap_method(m.KVCacheConfigurator, "_profile_available_bytes",
                       lambda orig: make_profile(orig, m))


def _check_token(m: ModuleType) -> str | None:
    cls = getattr(m, "TokenToKVPoolAllocator", None)
    if cls is None:
        return f"{ALLOC} has no TokenToKVPoolAllocator"
    return (need_attrs(cls, "alloc", "free", "available_size", "clear", "free_group_begin",
                       "free_group_end", "_copy_for_free_group")
            or need_params(cls.__init__, "size", "dtype", "device", "kvcache", "need_sort"))


def _apply_token(m: ModuleType):
    from workbench.adapters.sglang.allocator import ElasticTokenToKVPoolAllocator

    return replace_class(m, "TokenToKVPoolAllocator", ElasticTokenToKVPoolAllocator, "sglang")


def _check_paged(m: ModuleType) -> str | None:
    from sglang.srt.mem_cache.allocator import paged

    cls = getattr(m, "PagedTokenToKVPoolAllocator", None)
    if cls is None:
        return f"{ALLOC} has no PagedTokenToKVPoolAllocator"
    return (need_attrs(paged, "get_num_new_pages", "alloc_extend_naive", "alloc_decode_naive",
                       "alloc_extend_kernel", "alloc_decode_kernel", "next_power_of_2",
                       "current_platform")
            or need_attrs(cls, "free_page_ids", "free_segment", "_release_page_ids")
            or need_params(cls.alloc_extend, "prefix_lens", "prefix_lens_cpu", "seq_lens",
                           "seq_lens_cpu", "last_loc", "extend_num_tokens", "num_new_pages")
            or need_params(paged.alloc_extend_naive, "prefix_lens", "seq_lens", "last_loc",
                           "free_pages", "out_indices", "page_size", "device")
            or need_params(paged.alloc_decode_naive, "seq_lens", "last_loc", "free_pages",
                           "out_indices", "page_size", "num_new_pages"))


def _apply_paged(m: ModuleType):
    from workbench.adapters.sglang.allocator import ElasticPagedTokenToKVPoolAllocator

    return replace_class(m, "PagedTokenToKVPoolAllocator", ElasticPagedTokenToKVPoolAllocator,
                         "sglang")


def _check_radix(m: ModuleType) -> str | None:
    cls = getattr(m, "RadixCache", None)
    if cls is None:
        return f"{RADIX} has no RadixCache"
    return (need_attrs(cls, "on_release", "evict", "evictable_size")
            or need_params(cls.on_release, "req", "checkpointed"))


def _apply_radix(m: ModuleType):
    from workbench.adapters import runtime
    from workbench.adapters.sglang.radix import make_on_release

    bound = runtime.pool_config().max_cached_tokens
    return override_method(m.RadixCache, "on_release", lambda orig: make_on_release(orig, bound))


def build_plan() -> EnginePlan:
    def p(name, module, apply, check, doc, required=True, server_side=False):
        return Patch(name, module, RANGE, apply, check, fix=FIX, doc=doc, required=required,
                     server_side=server_side)

    return EnginePlan("sglang", "sglang", ("sglang",), [
        *pool_patches(p),
        p("elastic-token-allocator", ALLOC, _apply_token, _check_token,
          "TokenToKVPoolAllocator -> elastic (page_size 1; miss -> None)"),
        p("elastic-paged-allocator", ALLOC, _apply_paged, _check_paged,
          "PagedTokenToKVPoolAllocator -> elastic (alloc/alloc_extend/alloc_decode; miss -> None)"),
        p("radix-cache-bound", RADIX, _apply_radix, _check_radix,
          "RadixCache.on_release evicts down to WORKBENCH_KV_MAX_CACHED_TOKENS"),
        # optional: server-side modules a test box without SGLang's server stack cannot import
        p("kv-budget", CONFIGURATOR, _apply_budget, _check_budget,
          "KV pool sized from a per-process virtual budget, not the GPU's free memory",
          required=False),
        *scheduler_patches(p),
    ])
