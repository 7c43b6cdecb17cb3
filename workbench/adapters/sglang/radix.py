"""The cached-token bound on SGLang's RadixCache (``WORKBENCH_KV_MAX_CACHED_TOKENS``).

Applied in ``on_release``, the hook SGLang 0.5.23 calls after a request's row is freed and its
tree lock dropped: there the request's own nodes are unlocked and evictable, and no request is
between an unlock and a relock (``checkpoint`` unlocks the old node and locks the new one; a bound
applied inside it could evict the node about to be locked). SGLang 0.5.16 has no such hook: its
``cache_finished_req`` inserts the finished request and drops its lock last, so the bound applies
right after it returns (chunked prefill's ``cache_unfinished_req`` relocks and is left alone).
"""

from __future__ import annotations

from sglang.srt.mem_cache.base_prefix_cache import EvictParams


def enforce_bound(cache, bound: int) -> int:
    """Evict down to ``bound`` evictable tokens (-1: no bound). Returns tokens evicted."""
    if bound < 0 or getattr(cache, "disable", False):
        return 0
    excess = cache.evictable_size() - bound
    if excess <= 0:
        return 0
    return cache.evict(EvictParams(num_tokens=excess)).num_tokens_evicted


def make_on_release(orig, bound: int):
    def on_release(self, req, *, checkpointed: bool) -> None:
        orig(self, req, checkpointed=checkpointed)
        enforce_bound(self, bound)

    on_release.workbench_bound = bound
    return on_release


def make_cache_finished(orig, bound: int):
    """SGLang 0.5.16: ``RadixCache.cache_finished_req`` followed by the bound."""

    def cache_finished_req(self, req, is_insert: bool = True, **kwargs) -> None:
        orig(self, req, is_insert, **kwargs)
        enforce_bound(self, bound)

    cache_finished_req.workbench_bound = bound
    return cache_finished_req
