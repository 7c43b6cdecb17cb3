"""The block ledger (KVCacheD's KV cache manager): logical blocks on top of VMM pages (seed 001 §5).

``alloc(n)`` returns n block ids or ``None``: a miss is never partial. If a page cannot be backed
midway, every block this call took goes back, and the ledger is exactly as before (pages emptied by
the rollback follow the normal free path). ``free`` validates every id before touching anything.

Choosing a page is best fit: the page with the fewest free blocks that still covers the rest of the
request, else the emptiest one, so requests pack into few pages and whole pages empty sooner.

A page's blocks are one run of ids. Opening a page hands some out and stacks the rest (lowest on
top); a page whose every block is back goes to the page allocator. Two whole-page lanes take the
common case of ``bench vmm`` and of an engine that sizes requests by pages: an alloc that one new
page covers (nothing free, nothing held, no reserved page) asks the page allocator directly, whose
checks are then the pre-check's; a free of exactly the list a whole-page alloc returned empties
that page without per-id work. Both end in the same state, events and refusals as the general
path.

A memory limit is revisioned (:mod:`workbench.core.limits` says which requests are refused): every
request is answered with a :class:`LimitResult` and recorded as an event; impossible values are
rejected, never raised, so a remote caller always gets an answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workbench.config import PoolConfig
from workbench.core.blockset import _ONES, BlockSet, ones, zeros
from workbench.core.device import Device
from workbench.core.events import Event, EventLog
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger_state import PoolSnapshot, check_invariants, checked_free_ids
from workbench.core.limits import LimitOutcome, LimitResult, refusal
from workbench.core.pages import PageAllocator
from workbench.core.vspace import KVSpace
from workbench.errors import ConfigError, PoolClosedError, WorkbenchError

NULL_BLOCK = 0


class KVCacheManager:
    def __init__(self, geometry: KVGeometry, device: Device | None = None, *, name: str = "pool",
                 config: PoolConfig | None = None, events: EventLog | None = None,
                 reserve_null_block: bool = True, defer_release: bool = False,
                 space: KVSpace | None = None):
        """``space``: back pages through this object instead of a KVSpace on ``device`` (a
        coordinator's FanOutSpace applies every page decision on several workers)."""
        if space is None and device is None:
            raise ConfigError("KVCacheManager()", "needs a device or a space",
                              "pass a Device, or space=FanOutSpace(...)")
        self.config = config or PoolConfig(page_size=geometry.page_size)
        if self.config.page_size != geometry.page_size:
            raise ConfigError(f"page size {geometry.page_size} in the geometry",
                              f"differs from the config's {self.config.page_size}",
                              "build both from the same page size")
        want = Layout.CONTIGUOUS if self.config.contiguous_layout else Layout.PER_LAYER
        if geometry.layout is not want:
            raise ConfigError(f"layout {geometry.layout.value}",
                              f"the config asks for {want.value}",
                              "set contiguous_layout to match the geometry")
        self.name = name
        self.geometry = geometry
        self.device = space.device if space is not None else device
        self.events = events if events is not None else EventLog()
        self.space = space if space is not None else KVSpace(geometry, device)
        self.closed = False
        self.control = None  # a ControlSegment when an IPC name is set
        try:
            self._start(reserve_null_block, defer_release)
        except BaseException:
            self.close()  # a pool that failed to start gives back what it took
            raise

    def _start(self, reserve_null_block: bool, defer_release: bool) -> None:
        name, geometry = self.name, self.geometry
        self.pages = PageAllocator(
            self.space, pool=name, events=self.events,
            min_reserved=self.config.min_reserved_pages if self.config.prealloc else 0,
            max_reserved=self.config.max_reserved_pages, defer_release=defer_release,
            gpu_utilization=self.config.gpu_utilization)
        bind = getattr(self.space, "bind_allocator", None)
        if bind is not None:  # a coordinator's failure must fail this pool too
            bind(self.pages)
        g = geometry  # hot-path constants, computed once
        self._block_bytes, self._page_size = g.block_bytes, g.page_size
        self._bpp = g.page_size // g.block_bytes  # blocks per page, a floor: some hold 1 more
        self._capacity = [g.blocks_per_page(p) for p in range(g.num_pages)]
        # page -> its block ids, made once per page on first use: making 64 fresh int objects
        # per page opened (and freeing them again) was ~1 us of a ~10 us grow + shrink. Keeps at
        # most one int per block, the objects the free lists and ``allocated`` hold anyway.
        self._block_ids: dict[int, tuple[int, ...]] = {}
        # page -> its block ids as the list a whole-page alloc returns: ``free`` of exactly that
        # list (compared element by element, the same int objects) skips the per-id checks
        self._page_run: dict[int, list[int]] = {}
        self.free_blocks: dict[int, list[int]] = {}  # in-use page -> its free blocks (a stack)
        self.num_free = 0  # free blocks on in-use pages below the limit
        self.allocated = BlockSet(g.num_blocks)
        self.reserved_blocks: list[int] = []
        self.misses = 0
        self.limit_bytes = self.capacity_bytes
        self.revision = 0
        self._pending: LimitResult | None = None
        self.null_block: int | None = None
        if self.config.memory_limit is not None:  # above capacity is no limit; below a page
            r = self.set_limit(min(self.config.memory_limit, self.capacity_bytes))  # refused
            if r.outcome is LimitOutcome.REJECTED:
                raise ConfigError(f"memory_limit={self.config.memory_limit} for pool {name!r}",
                                  r.reason, "raise it to at least one page id or leave it unset")
        if reserve_null_block:
            ids = self.alloc(1)
            if ids != [NULL_BLOCK]:
                raise ConfigError(f"pool {name!r}", "could not back the null block's page",
                                  "free device memory or raise the memory limit")
            self.null_block = NULL_BLOCK
        if self.config.ipc_name:
            from workbench.core.control import ControlSegment

            self.control = ControlSegment.create(self.config.ipc_name, self)
        self.pages.refill_hook = None
        if self.config.prealloc:
            self.pages.refill()

    # -- capacity ----------------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        return self.geometry.num_pages * self.geometry.page_id_bytes

    @property
    def used_blocks(self) -> int:
        return len(self.allocated) - (1 if self.null_block is not None else 0)

    def page_occupancy(self, page: int) -> int:
        """Allocated blocks on ``page`` (0 when no block of it is out): what pins it mapped."""
        free = self.free_blocks.get(page)
        return 0 if free is None else self._capacity[page] - len(free)

    def available_size(self) -> int:
        """Blocks alloc() can hand out now without a miss (device headroom included)."""
        return self._available()[0]

    def _available(self) -> tuple[int, int | None]:
        """``available_size()``, and the device headroom reading it took (None if it took none)."""
        p = self.pages
        if p.failed:
            return 0, None
        room = self.num_free + len(self.reserved_blocks)
        if p.reserved:
            cap, limit = self._capacity, p.limit_pages
            room += sum(cap[q] for q in p.reserved if q < limit)
        new_pages, headroom = p.new_pages_and_headroom()
        room += new_pages * self._bpp
        # the last page may hold fewer blocks than bpp: never promise more than exist
        unallocated = self.geometry.num_blocks - len(self.allocated) + len(self.reserved_blocks)
        return min(room, unallocated), headroom

    # -- alloc / free ------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int] | None:
        if self.closed:
            raise PoolClosedError(self.name)
        if type(n) is not int and (not isinstance(n, int) or isinstance(n, bool)) or n < 0:
            raise ConfigError(f"alloc({n!r})", "needs a count of 0 or more blocks",
                              "pass a non-negative int")
        if self.control is not None:
            self.control.poll()
        pages = self.pages
        if pages.failed is not None:
            pages.check_ok()
        if n == 0:
            return []
        held = self.reserved_blocks
        if not (held or self.num_free or pages.reserved) and n <= self._bpp:  # (n > 0 here)
            return self._alloc_new_page(n)
        headroom = None  # the pre-check's device headroom reading, for the first new page
        out: list[int] = []
        if n > self.num_free + len(held):
            available, headroom = self._available()
            if n > available:
                self.misses += 1
                return None
        if held:
            out = held[:n]
            del held[:n]
        taken = len(out)
        try:
            while len(out) < n:
                need = n - len(out)
                # num_free counts the free blocks of in-use pages below the limit: at 0 there is
                # nothing to pick, so skip scanning every in-use (full) page
                page = self._pick_page(need) if self.num_free else None
                if page is not None:
                    stack = self.free_blocks[page]
                    k = min(len(stack), need)
                    got = stack[len(stack) - k:]
                    del stack[len(stack) - k:]
                    got.reverse()
                    self.num_free -= k
                    self.allocated.update(got)
                else:
                    # Nothing touched the device since the pre-check read its headroom, so the
                    # first page taken reuses that reading; later ones read it afresh.
                    page = self.pages.alloc_page(headroom=headroom)
                    headroom = None
                    if page is None:
                        self._rollback(out, taken)
                        return None
                    got = self._open_page(page, need)
                if out:
                    out += got
                else:
                    out = got
        except Exception:
            if len(out) > taken:
                self._rollback(out, taken)
            raise
        self._publish()
        return out

    def _rollback(self, out: list[int], taken: int) -> None:
        """Undo a partial alloc: page blocks go back to their pages, held blocks to the front."""
        self.misses += 1
        fresh = out[taken:]
        if fresh:
            self._free_ids(fresh)
        self.reserved_blocks[:0] = out[:taken]

    def free(self, ids: Iterable[int]) -> None:
        """Free block ids alloc returned. Every id is checked before anything is touched."""
        if self.closed:
            raise PoolClosedError(self.name)
        if self.pages.failed is not None:
            self.pages.check_ok()
        held = self.reserved_blocks  # allocated, but the pool's (free_reserved gives them back)
        if type(ids) is list and ids and not held and self._free_whole_page(ids):
            if self.control is not None:
                self.control.poll()
                self.control.publish()
            return
        given = ids
        try:
            ids = list(ids)
            unique = set(ids)
            # 2.0 and True hash and compare like 2 and 1, so membership alone would let them in:
            # a float (or numpy int) makes the sum's type differ; True can only pass as 1
            ok = (len(unique) == len(ids) and type(sum(ids)) is int
                  and self.null_block not in unique
                  and (1 not in unique or type(ids[ids.index(1)]) is int)
                  and self._all_allocated(ids)
                  and (not held or unique.isdisjoint(held)))
        except TypeError:  # not iterable, or an unhashable id
            ok = False
        if not ok:  # the slow path names the first bad id, or normalises integer types
            ids = checked_free_ids(self, given if isinstance(given, (str, bytes)) else ids)
        self._free_ids(ids)
        self.poll_control()
        self._publish()

    # -- blocks on pages, and the whole-page lanes -------------------------------------------
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

    # -- reserve (SGLang-style try_to_reserve) -----------------------------------------------
    def try_to_reserve(self, n: int) -> bool:
        ids = self.alloc(n)
        if ids is None:
            return False
        self.reserved_blocks.extend(ids)
        return True

    def free_reserved(self) -> None:
        self._check_open()
        ids, self.reserved_blocks = self.reserved_blocks, []
        if ids:
            self._free_ids(ids)
            self._publish()

    # -- limits ------------------------------------------------------------------------------
    def set_limit(self, limit: int, revision: int | None = None) -> LimitResult:
        """Ask the pool to hold at most ``limit`` bytes. See :class:`LimitOutcome`."""
        self._check_open()
        why = refusal(limit, revision, revision_now=self.revision, limit_now=self.limit_bytes,
                      capacity=self.capacity_bytes, page_id_bytes=self.geometry.page_id_bytes,
                      failed=bool(self.pages.failed))
        if why is None:
            return self._apply_limit(limit, limit // self.geometry.page_id_bytes, revision)
        outcome, reason = why
        if outcome is LimitOutcome.APPLIED:  # the revision in force, asked again: no event
            return self.limit_state
        return self._limit_event(outcome, reason)

    def _apply_limit(self, limit: int, target: int, revision: int | None) -> LimitResult:
        self.revision = revision if revision is not None else self.revision + 1
        self.limit_bytes = limit
        self.free_reserved()  # held blocks must not pin the tail
        done = self.pages.set_limit_pages(target)
        self.num_free = sum(len(s) for p, s in self.free_blocks.items() if p < target)
        self._pending = None if done else self._state(LimitOutcome.DEFERRED)
        result = self._pending or self._state(LimitOutcome.APPLIED)
        self._emit_limit(result)
        self._publish()
        return result

    def _state(self, outcome: LimitOutcome, reason: str = "") -> LimitResult:
        return LimitResult(outcome, self.limit_bytes, self.revision, self.pages.limit_pages,
                           reason)

    def _limit_event(self, outcome: LimitOutcome, reason: str) -> LimitResult:
        result = self._state(outcome, reason)
        self._emit_limit(result)
        return result

    def _emit_limit(self, r: LimitResult) -> None:
        self.events.emit(Event(self.device.now(), self.name, -1, f"limit@{r.revision}",
                               r.outcome.value, f"limit {r.limit} bytes -> {r.target_pages} pages"
                               + (f": {r.reason}" if r.reason else "")))

    def _converge(self) -> None:
        if self.pages.enforce_limit():
            self._pending = None
            self._emit_limit(self._state(LimitOutcome.APPLIED, "converged"))

    @property
    def limit_state(self) -> LimitResult:
        return self._pending or self._state(LimitOutcome.APPLIED)

    def trim(self) -> int:
        self._check_open()
        n = self.pages.trim()
        if self._pending is not None:
            self._converge()
        self._publish()
        return n

    # -- async release -----------------------------------------------------------------------
    def refill(self) -> int:
        """Map free pages into the reserve up to ``min_reserved``; returns how many."""
        self._check_open()
        n = self.pages.refill()
        self._publish()
        return n

    def capture_marker(self) -> int:
        self._check_open()
        return self.pages.capture_marker()

    def release_retired_through(self, marker: int) -> int:
        self._check_open()
        n = self.pages.release_retired_through(marker)
        if self._pending is not None:
            self._converge()
        self._publish()
        return n

    def _check_open(self) -> None:
        if self.closed:
            raise PoolClosedError(self.name)

    # -- control plane -----------------------------------------------------------------------
    def poll_control(self) -> None:
        if self.control is not None:
            self.control.poll()

    def _publish(self) -> None:
        if self.control is not None:
            self.control.publish()

    # -- observation -------------------------------------------------------------------------
    def snapshot(self, with_pages: bool = True) -> PoolSnapshot:
        p = self.pages
        return PoolSnapshot(
            name=self.name, page_id_bytes=self.geometry.page_id_bytes, num_pages=p.num_pages,
            block_size=self.geometry.block_size, used_blocks=self.used_blocks,
            available_blocks=self.available_size(),
            counts={s.value: n for s, n in p.counts.items()}, limit_bytes=self.limit_bytes,
            limit_pages=p.limit_pages, revision=self.revision, shrinking=p.shrinking,
            failed=p.failed, misses=self.misses,
            page_states=[s.value for s in p.state] if with_pages else [])

    @property
    def mapped_bytes(self) -> int:
        return self.pages.mapped_pages * self.geometry.page_id_bytes

    def check_invariants(self) -> None:
        """Raise StateConsistencyError if the ledger and the page states disagree (tests use it)."""
        check_invariants(self)

    def close(self) -> list[str]:
        """Give every page and the reservation back (best effort on a failed pool); returns what
        could not be undone. Every later call on the pool raises PoolClosedError."""
        if self.closed:
            return []
        self.closed = True
        try:
            if getattr(self, "pages", None) is not None:  # None: the constructor failed early
                self.pages.close()
        except WorkbenchError:
            pass  # the space below cleans up what the page allocator could not
        problems = self.space.close() or []
        if self.control is not None:
            self.control.close()
            self.control = None
        return problems


def local_pools(geometry: KVGeometry, devices: list[Device], *, name: str = "pool",
                **kw: Any) -> list[KVCacheManager]:
    """SGLang-style: one independent pool per rank, each mapping its own pages on its own
    device. Nothing is broadcast; a page decision on one rank never touches another."""
    return [KVCacheManager(geometry, dev, name=f"{name}.tp{rank}", **kw)
            for rank, dev in enumerate(devices)]
