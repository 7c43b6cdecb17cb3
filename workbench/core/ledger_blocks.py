"""The ledger's block bookkeeping on pages, and its whole-page lanes (a mixin of
:class:`~workbench.core.ledger.KVCacheManager`).

A page's blocks are one run of ids. Opening a page hands some out and stacks the rest (lowest on
top); a page whose every block is back goes to the page allocator. The lanes take the common case
of ``bench vmm`` and of an engine that sizes requests by pages: an alloc that one new page covers
(nothing free, nothing held, no reserved page) asks the page allocator directly, whose checks
are then the pre-check's; a free of exactly the list a whole-page alloc returned empties that
page without per-id work. Both end in the same state, events and refusals as the general path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.core.blockset import _ONES, ones, zeros

if TYPE_CHECKING:
    from workbench.core.blockset import BlockSet
    from workbench.core.control import ControlSegment
    from workbench.core.geometry import KVGeometry
    from workbench.core.limits import LimitResult
    from workbench.core.pages import PageAllocator


class LedgerBlocks:
    geometry: KVGeometry
    pages: PageAllocator
    allocated: BlockSet
    free_blocks: dict[int, list[int]]
    num_free: int
    misses: int
    control: ControlSegment | None
    _block_ids: dict[int, tuple[int, ...]]
    _page_run: dict[int, list[int]]
    _block_bytes: int
    _page_size: int
    _capacity: list[int]
    _pending: LimitResult | None
    # _rollback (the ledger) and _converge (PoolLimits) come from the class this is mixed into

    def _alloc_new_page(self, n: int) -> list[int] | None:
        """``alloc(n)`` when one new page covers it and nothing else can (no free block, no held
        block, no reserved page): the page allocator's own checks are the pre-check's (limit,
        shrinking, free ids, device headroom, read once), so it is asked directly."""
        alloc = self.allocated
        if self.geometry.num_blocks - alloc._n < n:  # the pre-check's other bound
            self.misses += 1
            return None
        page = self.pages.alloc_page()
        if page is None:
            self.misses += 1
            return None
        run = self._page_run.get(page)
        if run is not None and len(run) == n:  # the whole page (opened before): _open_page
            self.free_blocks[page] = []
            b0 = run[0]
            alloc._bits[b0:b0 + n] = _ONES.get(n) or ones(n)
            alloc._n += n
            if self.control is not None:
                self.control.publish()
            return run.copy()
        out = self._open_page(page, n)
        if len(out) < n:  # a short last page: the general path takes the rest (or rolls back)
            try:
                while len(out) < n:
                    page = self.pages.alloc_page()
                    if page is None:
                        self._rollback(out, 0)
                        return None
                    out += self._open_page(page, n - len(out))
            except Exception:
                self._rollback(out, 0)
                raise
        if self.control is not None:
            self.control.publish()
        return out

    def _open_page(self, page: int, take: int) -> list[int]:
        """Start the free stack of a page just handed out and take ``take`` blocks off it.

        The same as stacking the page's blocks lowest on top and popping ``take`` of them, but
        the taken blocks never enter the stack (an alloc of a whole page builds no stack at all).
        """
        blocks = self._block_ids.get(page)
        if blocks is None:
            blocks = self._block_ids[page] = tuple(self.geometry.page_blocks(page))
            self._page_run[page] = list(blocks)
        k = len(blocks)
        if take >= k:  # a whole page: no stack to build
            self.free_blocks[page] = []
            if k:
                b0 = blocks[0]
                alloc = self.allocated
                alloc._bits[b0:b0 + k] = ones(k)  # BlockSet.add_run, inlined
                alloc._n += k
            return self._page_run[page].copy()
        stack = list(blocks[take:])
        stack.reverse()  # the lowest free block on top
        self.free_blocks[page] = stack
        self.num_free += k - take
        if take:
            self.allocated.add_run(blocks[0], blocks[0] + take)  # a page's ids are one run
        return list(blocks[:take])

    def _pick_page(self, need: int) -> int | None:
        best, best_n, most, most_n = None, 1 << 62, None, 0
        limit = self.pages.limit_pages
        for page, stack in self.free_blocks.items():
            k = len(stack)
            if not k or page >= limit:
                continue
            if need <= k < best_n:
                best, best_n = page, k
            if k > most_n:
                most, most_n = page, k
        return best if best is not None else most

    def _all_allocated(self, ids: list[int]) -> bool:
        """Every id (ints, distinct) is an allocated block: one C-level pass over the bitmap."""
        bits = self.allocated._bits
        return not ids or (0 <= min(ids) and max(ids) < len(bits)
                and 0 not in bytes(map(bits.__getitem__, ids)))

    def _free_whole_page(self, ids: list[int]) -> bool:
        """``free`` of exactly the list a whole-page alloc returned (the same ids in the same
        order, all still allocated): the page empties at once. False: take the general path."""
        b0 = ids[0]
        if type(b0) is not int or b0 < 2:  # (page 0 holds the null block and the id 1 == True)
            return False
        page = b0 * self._block_bytes // self._page_size
        run = self._page_run.get(page)
        if (run is None or ids != run or type(sum(ids)) is not int
                or self.free_blocks.get(page) != []):
            return False
        # every block of the page is out (its free stack is empty): all are allocated
        k = len(run)
        alloc = self.allocated
        alloc._bits[b0:b0 + k] = zeros(k)  # BlockSet.discard_run, inlined
        alloc._n -= k
        del self.free_blocks[page]  # it had no free block: num_free is unchanged
        self.pages.free_page(page)
        if self._pending is not None:
            self._converge()
        return True

    def _free_ids(self, ids: list[int]) -> None:
        bb, ps, cap, limit = self._block_bytes, self._page_size, self._capacity, \
            self.pages.limit_pages
        free_blocks, emptied = self.free_blocks, []
        if not ids:
            return
        self.allocated.discard_known(ids)
        # The common case is one page; block -> page is monotone, so the lowest and the highest
        # id decide it. sorted() finds them ~3x faster than min() + max() here: it compares ints
        # on a fast path and takes alloc's ascending runs (or their reverse) in one pass.
        order = sorted(ids)
        first = order[0] * bb // ps
        if order[-1] * bb // ps == first:
            groups = {first: ids}
        else:
            groups: dict[int, list[int]] = {}
            for b in ids:
                groups.setdefault(b * bb // ps, []).append(b)
        for page, blocks in groups.items():
            stack = free_blocks[page]
            stack.extend(blocks)
            if page < limit:
                self.num_free += len(blocks)
            if len(stack) == cap[page]:
                emptied.append(page)
        for page in emptied:
            if page < limit:
                self.num_free -= len(free_blocks[page])
            del free_blocks[page]
            self.pages.free_page(page)
        if self._pending is not None:
            self._converge()
