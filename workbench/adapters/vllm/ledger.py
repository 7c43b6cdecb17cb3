"""The core ledger with the engine choosing block ids: vLLM's BlockPool decides which block comes
next (its free-queue order is part of its prefix caching and of its own tests), the workbench
decides which pages are backed.

``BlockLedger`` is a :class:`~workbench.core.ledger.KVCacheManager`: one page state machine
(:class:`~workbench.core.pages.PageAllocator`), its events, limits (``set_limit``, deferred while
live blocks sit on the tail), the reserve (``PREALLOC``, ``MIN``/``MAX_RESERVED_PAGES``), async
release epochs (``defer_release``) and the control segment under ``WORKBENCH_KV_IPC_NAME`` (so
``workbench kvctl list`` shows the engine). It adds two calls for caller-chosen ids:

* :meth:`hold` backs every block of a list or none (a block is *held* while vLLM uses or caches
  it), mapping the page of each block that is not on a backed page yet;
* :meth:`release` gives blocks back; a page whose last block goes follows the core's free path
  (park in the reserve, unmap, or retire until the kernels that may touch it have finished).
"""

from __future__ import annotations

from collections.abc import Iterable

from workbench.core.events import PageState
from workbench.core.ledger import KVCacheManager
from workbench.errors import WorkbenchError

RESERVED, FREE, RETIRED = PageState.RESERVED, PageState.FREE, PageState.RETIRED


class PoolExhausted(WorkbenchError, ValueError):
    """No physical page for a block vLLM chose; the scheduler treats it as 'cannot schedule'."""


class BlockLedger(KVCacheManager):
    """A ledger whose block ids come from the engine. ``alloc`` (best fit) still works, but the
    vLLM adapter only uses :meth:`hold` / :meth:`release`.

    ``fence``: with ``defer_release`` (a GPU whose kernels run after the scheduler returns), a
    callable giving an object with ``query()`` / ``synchronize()`` (a CUDA event recorded on the
    stream the model runs on). A page emptied by :meth:`release` retires; it is parked or
    unmapped only once a fence recorded after the release has passed, i.e. once every kernel
    queued before it (the ones that may still touch the page) has finished."""

    fence = None
    runner: str | None = None  # the vLLM model runner whose KV seam built it (v1, v2)

    def __init__(self, *args, **kwargs):
        self._fences: list[tuple[int, object]] = []  # (epoch marker, fence), oldest first
        super().__init__(*args, **kwargs)

    # -- what can be backed now --------------------------------------------------------------
    def room_pages(self) -> int:
        """Pages below the limit that could start holding blocks now: reserved or retired ones
        (no map) plus new ones the limit and the device's headroom allow."""
        p = self.pages
        self.reap()
        parked = sum(1 for q in p.reserved if q < p.limit_pages)
        parked += sum(1 for q in p.retired if q < p.limit_pages)
        return parked + p.new_pages_possible()

    # -- async release -----------------------------------------------------------------------
    def room_blocks(self) -> int:
        """Blocks on the pages :meth:`room_pages` counts (new pages at the floor of blocks per
        page: never more than they hold). O(reserved + retired pages), not O(capacity)."""
        p, cap = self.pages, self._capacity
        if self._fences:
            self.reap()
        limit = p.limit_pages
        n = sum(cap[q] for q in p.reserved if q < limit) if p.reserved else 0
        if p.retired:
            n += sum(cap[q] for q in p.retired if q < limit)
        # new_pages_possible(), asking the device for its free memory only when the limit and
        # the free ids leave room for a page at all (a pool at its limit, the steady state
        # under one, reads nothing)
        if p.failed or p.shrinking:
            return n
        room = min(limit - p.mapped_pages, p.counts[FREE])
        return n + min(room, p.headroom_pages()) * self._bpp if room > 0 else n

    def free_on_backed_pages(self, n: int) -> list[int]:
        """Up to ``n`` free blocks on backed pages below the limit (each page's stack top
        first): blocks :meth:`hold` backs without a map. O(backed pages), not O(capacity)."""
        out: list[int] = []
        limit = self.pages.limit_pages
        for page, stack in self.free_blocks.items() if n > 0 else ():
            if page < limit and stack:
                out.extend(reversed(stack[-(n - len(out)):]))
                if len(out) >= n:
                    break
        return out

    def next_open_page(self) -> int | None:
        """A page below the limit with no held block that :meth:`hold` can back now: a parked
        or retired one first (no map), else the lowest free page if the limit and the device
        leave room for one; None when there is none."""
        p = self.pages
        limit = p.limit_pages
        for q in reversed(p.reserved):
            if q < limit:
                return q
        for q in p.retired:
            if q < limit:
                return q
        return p._peek_free() if p.new_pages_possible() > 0 else None

    def _fence_retired(self) -> None:
        """After a release that retired pages: close their epoch with a fence behind them."""
        if self.fence is not None and any(e == self.pages.epoch
                                          for e in self.pages.retired.values()):
            self._fences.append((self.capture_marker(), self.fence()))

    def reap(self, wait: bool = False) -> int:
        """Release retired pages whose fence has passed (``wait``: wait for every fence)."""
        fences, n = self._fences, 0
        while fences and (wait or fences[0][1].query()):
            marker, ev = fences.pop(0)
            if wait:
                ev.synchronize()
            n += self.release_retired_through(marker)
        return n

    def tidy(self) -> int:
        """The engine has no request in flight (its idle loop says so): release the retired
        pages, waiting for their fences (the last step's kernels, done by now), and refill the
        reserve, so that neither unmaps nor refills land on the next request's path. From the
        first tidy on, a reserve an allocation drains is refilled here, not inline in that
        allocation (the engine has shown it has idle moments). Returns the pages released."""
        p = self.pages
        if self.closed or p.failed is not None:
            return 0
        p.refill_hook = _refill_later
        self.poll_control()
        n = self.reap(wait=True) if self._fences else 0
        mapped = p.refill()
        if n or mapped:
            self._publish()
        return n

    def refill_in_step(self) -> int:
        """The step's forward pass is in flight (the worker is about to wait for its tokens):
        map the reserve back up to its minimum now, where the maps overlap the GPU's work, and
        from then on leave the refill an allocation makes due to this moment, not to that
        allocation. Releases stay where they were (idle, or the next allocation's reap): an unmap
        here could wait on the kernels still running. Returns the pages mapped."""
        p = self.pages
        if self.closed or p.failed is not None:
            return 0
        p.refill_hook = _refill_later
        if len(p.reserved) >= p.min_reserved:
            return 0
        mapped = p.refill()
        if mapped:
            self._publish()
        return mapped

    def unlimited(self) -> bool:
        """True when every block could be backed now (the cheap common case)."""
        p = self.pages
        if p.limit_pages < p.num_pages or p.shrinking:
            return False
        return self.room_pages() >= p.num_pages - len(self.free_blocks)

    def is_held(self, block: int) -> bool:
        return block in self.allocated

    @property
    def held_blocks(self) -> int:
        return self.used_blocks

    def count_events(self, cause: str) -> int:
        """Page transitions with this cause so far ("map", "unmap", "reuse", "park", ...)."""
        return sum(1 for e in self.events if e.cause == cause and e.page >= 0)

    # -- hold / release ----------------------------------------------------------------------
    def hold(self, block_ids: Iterable[int]) -> None:
        """Back every block or none (raises :class:`PoolExhausted`, nothing changed)."""
        self.poll_control()
        self.pages.check_ok()
        g = self.geometry
        by_page: dict[int, list[int]] = {}
        for b in dict.fromkeys(block_ids):
            if b not in self.allocated:
                by_page.setdefault(g.block_page(b), []).append(b)
        if not by_page:
            return
        pages, limit = self.pages, self.pages.limit_pages
        fresh = [p for p in by_page if p not in self.free_blocks]
        need = [p for p in fresh if pages.state[p] not in (RESERVED, RETIRED)]  # need a map
        if need and len(need) > pages.new_pages_possible():
            self._make_room(len(need), keep=set(fresh))
        if any(p >= limit for p in by_page) or (need and len(need) > pages.new_pages_possible()):
            self.misses += 1
            raise PoolExhausted(f"{len(need)} pages must be mapped for blocks "
                                f"{sorted(b for v in by_page.values() for b in v)[:8]}; "
                                f"{pages.new_pages_possible()} can be under the limit of "
                                f"{limit} pages and the device's headroom")
        opened: list[int] = []
        for p in fresh:
            if not self._open_at(p):
                self._close_opened(opened)
                self.misses += 1
                raise PoolExhausted(f"page {p} could not be mapped (device full or failed)")
            opened.append(p)
        for p, blocks in by_page.items():
            stack = self.free_blocks[p]
            for b in blocks:
                stack.remove(b)
            self.num_free -= len(blocks)
            self.allocated.update(blocks)
        self._publish()

    def _make_room(self, need: int, keep: set[int]) -> None:
        """Short of new pages: unmap reserved pages vLLM does not want now, then wait for the
        fences of retired ones (which park or unmap them) and unmap again."""
        p = self.pages
        for attempt in (0, 1):
            for q in [q for q in p.reserved if q not in keep]:
                if p.new_pages_possible() >= need:
                    return
                p.reserved.remove(q)
                p._unmap(q, FREE if q < p.limit_pages else PageState.RECLAIMED, "trim")
            if attempt or not self._fences or p.new_pages_possible() >= need:
                return
            self.reap(wait=True)

    def _open_at(self, page: int) -> bool:
        """Make ``page`` in use with all its blocks free: reuse it from the reserve or map it."""
        p = self.pages
        if p.state[page] is RESERVED:
            p.reserved.remove(page)
            p._move(page, PageState.IN_USE, "reuse")
        elif p.state[page] is RETIRED:  # still mapped; new kernels queue after the old ones
            del p.retired[page]
            p._move(page, PageState.IN_USE, "revive")
        elif p.state[page] is not FREE or not p._map(page, PageState.IN_USE, "map"):
            return False
        blocks = self._block_ids.get(page)
        if blocks is None:
            blocks = self._block_ids[page] = tuple(self.geometry.page_blocks(page))
        self.free_blocks[page] = list(reversed(blocks))
        self.num_free += len(blocks)
        p._maybe_refill()
        return True

    def _close_opened(self, opened: list[int]) -> None:
        for page in reversed(opened):
            self.num_free -= len(self.free_blocks.pop(page))
            self.pages.free_page(page)

    def release(self, block_ids: Iterable[int]) -> None:
        """Give held blocks back (ids not held, and the null block, are skipped)."""
        ids = [b for b in dict.fromkeys(block_ids) if b in self.allocated
               and b != self.null_block]
        if ids:
            self.pages.check_ok()
            self._free_ids(ids)
            self._fence_retired()
        self.poll_control()
        self._publish()


def _refill_later() -> None:
    """The page allocator's refill hook once the engine refills at its own moments (idle, or
    while a step's forward runs): nothing now."""
