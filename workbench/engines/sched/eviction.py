"""Which cached blocks to evict (seed 001 §6; kvcached #359/#390).

Physical memory comes back only when *every* block on a VMM page is free. Evicting by LRU alone
scatters holes over many pages and frees none; page-aware eviction prefers victims that empty whole
pages: keep the pages whose occupied blocks are all evictable, take the cheapest (fewest cached
blocks lost per page freed) first, break ties by the oldest LRU rank. Shortage (an allocation that
cannot be met) still evicts by LRU: there any free block helps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def page_aware_victims(candidates: Iterable[int], need: int, page_of: Callable[[int], int],
                       occupancy: Callable[[int], int]) -> list[int]:
    """Up to roughly ``need`` blocks from ``candidates`` (oldest first), whole pages first.

    ``occupancy(page)`` is the number of allocated blocks on the page (cached or live). A page is
    *emptiable* when all its allocated blocks are candidates. Returns emptiable pages' blocks,
    cheapest page first, until ``need`` is met; then the oldest remaining candidates (LRU) if
    emptiable pages are not enough.
    """
    if need <= 0:
        return []
    by_page: dict[int, list[int]] = {}
    rank: dict[int, int] = {}
    order: list[int] = []
    for i, b in enumerate(candidates):
        p = page_of(b)
        if p not in by_page:
            by_page[p] = []
            rank[p] = i
        by_page[p].append(b)
        order.append(b)
    pages = [p for p, bs in by_page.items() if occupancy(p) == len(bs)]
    pages.sort(key=lambda p: (len(by_page[p]), rank[p]))
    out: list[int] = []
    for p in pages:
        if len(out) >= need:
            break
        out.extend(by_page[p])
    if len(out) < need:
        taken = set(out)
        for b in order:
            if len(out) >= need:
                break
            if b not in taken:
                out.append(b)
    return out


def cap_blocks(max_cached_tokens: int, block_size: int) -> int:
    """kvcached's bound: -1 unlimited, 0 evict at once, N -> max(1, N // block_size) blocks."""
    if max_cached_tokens < 0:
        return -1
    if max_cached_tokens == 0:
        return 0
    return max(1, max_cached_tokens // block_size)
