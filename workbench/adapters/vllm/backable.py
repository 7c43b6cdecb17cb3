"""What the elastic BlockPool (``pool.py``) decides on the ledger, engine-free: how many of
vLLM's free blocks memory can back now, and which ones to hand out under a limit. vLLM is not
imported here, so a chapter cell runs the pool's own decisions on any machine."""

from __future__ import annotations

from collections.abc import Iterable

from workbench.adapters.vllm.ledger import BlockLedger, PoolExhausted


def backable_count(kv: BlockLedger, queue_free: int, cached: int) -> int:
    """Under a limit, the free-block count vLLM is told: of its ``queue_free`` free blocks, only
    the free ones on backed pages below the limit, the ``cached`` ones (held, ref 0) and the
    unheld blocks of the pages the limit and the device leave room for."""
    return min(queue_free, kv.num_free + cached + kv.room_blocks())


def hold_backable(kv: BlockLedger, num: int,
                  cached_free: Iterable[int]) -> tuple[list[int], list[int]]:
    """Hold ``num`` blocks memory can back: free ones on backed pages, then pages opened one at
    a time, then cached ones (``cached_free``, least recently freed first). Returns (the ids in
    the order vLLM should pop them, the ids held here); all or nothing: on a shortfall every
    block held here is released and ``PoolExhausted`` raised."""
    ids = kv.free_on_backed_pages(num)
    kv.hold(ids)  # no map: their pages are backed
    fresh = list(ids)
    try:
        while len(ids) < num:
            page = kv.next_open_page()
            if page is None:
                break
            take = list(kv.geometry.page_blocks(page)[:num - len(ids)])
            kv.hold(take)  # maps (or reuses) this page only
            ids += take
            fresh += take
        limit, page_of = kv.pages.limit_pages, kv.geometry.block_page
        for bid in cached_free:  # oldest first; all held already
            if len(ids) >= num:
                break
            if page_of(bid) < limit:
                ids.append(bid)
        if len(ids) < num:
            raise PoolExhausted(f"Cannot back {num} blocks under the limit: {len(ids)} can "
                                "be; free blocks (or preempt a request) first")
    except BaseException:
        kv.release(fresh)
        raise
    return ids, fresh
