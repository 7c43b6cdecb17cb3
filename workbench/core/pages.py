"""The page allocator: one pool's page ids and their VMM states (seed 001 §8, 000 §10.2).

The state array is the single source of truth; every transition goes through :meth:`_move`, which
emits one event. Free ids are handed out lowest first, so a shrink finds its tail of ids empty as
early as possible.

Limits work on the id range: a limit of ``T`` pages makes ids ``>= T`` the *retired logical tail*.
Free tail ids become RECLAIMED at once, reserved ones are unmapped, in-use ones are left alone
(a live block is never revoked) and become RECLAIMED when their last block is freed. While any
tail page is still in use the pool is *shrinking*: it maps no new page. A grow brings RECLAIMED
ids below the new limit back to FREE. Ids come from one fixed range, so no id is ever issued twice.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from workbench.core.events import Event, EventLog, PageState, event_from_tuple
from workbench.core.vspace import KVSpace
from workbench.errors import (
    DeviceError,
    MapQuarantinedError,
    PoolFailedError,
    StateConsistencyError,
)

S = PageState
# Enum class attribute lookups (``S.FREE``) cost ~60 ns each on Python 3.11; the hot path below
# uses these module constants instead, and the state names precomputed (``.value`` is a property).
FREE, RESERVED, IN_USE, RETIRED, RECLAIMED, QUARANTINED = (
    S.FREE, S.RESERVED, S.IN_USE, S.RETIRED, S.RECLAIMED, S.QUARANTINED)
_MAPPED = (IN_USE, RETIRED, RESERVED)
_NAME = {s: s.value for s in S}


class PageAllocator:
    def __init__(self, space: KVSpace, *, pool: str = "pool", events: EventLog | None = None,
                 min_reserved: int = 5, max_reserved: int = 10, gpu_utilization: float = 0.95,
                 defer_release: bool = False, clock: Callable[[], float] | None = None):
        self.space = space
        self.geometry = space.geometry
        self.pool = pool
        self.events = events if events is not None else EventLog()
        self.num_pages = self.geometry.num_pages
        self.min_reserved = min(min_reserved, self.num_pages)
        self.max_reserved = min(max_reserved, self.num_pages)
        self.gpu_utilization = gpu_utilization
        self.defer_release = defer_release
        self.clock = clock or space.device.now
        self._page_id_bytes = self.geometry.page_id_bytes  # the geometry is frozen
        self.state: list[PageState] = [FREE] * self.num_pages
        self.counts: dict[PageState, int] = {s: 0 for s in S}
        self.counts[FREE] = self.num_pages
        self._free_heap = list(range(self.num_pages))
        self.reserved: list[int] = []  # a stack: the most recently parked page is reused first
        self.retired: dict[int, int] = {}  # page -> epoch
        self.epoch = 0
        self.limit_pages = self.num_pages
        self._tail_mapped = 0  # mapped pages at or above the limit
        self.failed: str | None = None
        self.refill_hook: Callable[[], None] | None = None  # None = refill inline
        # a KVSpace may order an unmap's calls for the release that follows at once (a
        # coordinator's space takes no such hint: its phases run apart)
        self._release_next = isinstance(space, KVSpace)
        self._mem_info = space.device.mem_info  # asked before every new page

    # -- transitions -------------------------------------------------------------------------
    def _move(self, page: int, dst: PageState, cause: str) -> None:
        state, counts = self.state, self.counts
        src = state[page]
        state[page] = dst
        counts[src] -= 1
        counts[dst] += 1
        if page >= self.limit_pages:
            self._tail_mapped += (dst in _MAPPED) - (src in _MAPPED)
        if dst is FREE:
            heapq.heappush(self._free_heap, page)
        elif src is FREE:
            # the id leaves the free heap at once when it is on top (it usually is: the lowest
            # goes first), else lazily in _peek_free; so a page freed and taken again, over
            # and over, adds no duplicate entry each time
            heap = self._free_heap
            if heap and heap[0] == page:
                heapq.heappop(heap)
        ev = event_from_tuple((self.clock(), self.pool, page, _NAME[src], _NAME[dst], cause))
        log = self.events  # EventLog.emit, inlined for the log without subscribers
        if type(log) is EventLog and log.keep and not log._subscribers and not log._routes:
            log.events.append(ev)
        else:
            log.emit(ev)

    def _note(self, page: int, cause: str) -> None:
        """An event with no state change (a failed attempt)."""
        s = self.state[page].value if page >= 0 else "pool"
        self.events.emit(Event(self.clock(), self.pool, page, s, s, cause))

    def fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            self.events.emit(Event(self.clock(), self.pool, -1, "ok", "failed", why))

    def check_ok(self) -> None:
        if self.failed is not None:
            raise PoolFailedError(f"pool {self.pool!r} has failed and refuses work: {self.failed}")

    # -- queries -----------------------------------------------------------------------------
    @property
    def mapped_pages(self) -> int:
        c = self.counts
        return c[IN_USE] + c[RESERVED] + c[RETIRED]

    @property
    def shrinking(self) -> bool:
        """True while mapped pages remain at or above the limit (no new pages until they go)."""
        return self._tail_mapped > 0

    def in_use(self, page: int) -> bool:
        """Holding blocks now (backed, and not taken from the reserve by holding another)."""
        return self.state[page] is IN_USE

    def headroom_pages(self) -> int:
        """New pages the device can back now, keeping ``(1 - gpu_utilization)`` of it free."""
        free, total = self.space.device.mem_info()
        spare = free - int(total * (1.0 - self.gpu_utilization))
        return max(0, spare // self._page_id_bytes)

    def _peek_free(self) -> int | None:
        heap, state, limit = self._free_heap, self.state, self.limit_pages
        while heap and (state[heap[0]] is not FREE or heap[0] >= limit):
            page = heapq.heappop(heap)
            if state[page] is FREE:  # a free id past the limit leaves the pool
                self._move(page, RECLAIMED, "shrink")
        return heap[0] if heap else None

    def new_pages_possible(self) -> int:
        """Pages that could still be mapped now (0 while shrinking)."""
        return self.new_pages_and_headroom()[0]

    def new_pages_and_headroom(self) -> tuple[int, int | None]:
        """``new_pages_possible()``, and the :meth:`headroom_pages` reading it was based on (None
        when it read none). The ledger hands that reading to :meth:`alloc_page` so one alloc does
        not ask the device for its free memory twice in a row with nothing mapped in between."""
        if self.failed or self._tail_mapped > 0:  # failed, or shrinking
            return 0, None
        headroom = self.headroom_pages()
        return self.new_pages_within(headroom), headroom

    def new_pages_within(self, headroom: int | None) -> int:
        """Pages that could be mapped with ``headroom`` pages of device room (None: no
        reading, as while shrinking: none)."""
        if headroom is None:
            return 0
        room = self.limit_pages - self.mapped_pages
        return max(0, min(room, self.counts[FREE], headroom))

    # -- alloc / free ------------------------------------------------------------------------
    def alloc_page(self, *, headroom: int | None = None) -> int | None:
        """A page for new blocks: a reserved one (no map) or a newly mapped one; None on a miss.

        ``headroom``: a :meth:`headroom_pages` reading taken since this pool's last device call
        (see :meth:`new_pages_and_headroom`); None reads the device."""
        if self.failed is not None:
            self.check_ok()
        reserved, limit = self.reserved, self.limit_pages
        for i in range(len(reserved) - 1, -1, -1) if reserved else ():
            if reserved[i] < limit:  # (one past a limit waits for a trim)
                page = reserved.pop(i)
                self._move(page, IN_USE, "reuse")
                self._maybe_refill()
                return page
        c = self.counts
        if self._tail_mapped > 0 or c[IN_USE] + c[RESERVED] + c[RETIRED] >= limit:
            return None  # shrinking, or at the limit
        if headroom is None:  # headroom_pages() == 0, written out
            free, total = self._mem_info()
            if free - int(total * (1.0 - self.gpu_utilization)) < self._page_id_bytes:
                return None
        elif not headroom:
            return None
        heap = self._free_heap
        page = heap[0] if heap else None
        if page is None or self.state[page] is not FREE or page >= limit:
            page = self._peek_free()
            if page is None:
                return None
        try:  # _map(page, IN_USE, "map"), written out
            self.space.map_page(page)
        except (MapQuarantinedError, DeviceError, StateConsistencyError) as err:
            self._map_failed(page, err)
            return None
        self._move(page, IN_USE, "map")
        if len(reserved) < self.min_reserved:
            (self.refill_hook or self.refill)()
        return page

    def free_page(self, page: int) -> None:
        """The last block of ``page`` was freed."""
        if self.failed is not None:
            self.check_ok()
        if self.defer_release:
            self.retired[page] = self.epoch
            self._move(page, RETIRED, f"retire@{self.epoch}")
            return
        if page < self.limit_pages and not (len(self.reserved) < self.max_reserved
                                            and self._tail_mapped <= 0):
            self._unmap(page, FREE, "unmap")  # _park_or_unmap's common case, written out
        else:
            self._park_or_unmap(page)

    def _park_or_unmap(self, page: int) -> None:
        if page >= self.limit_pages:
            self._unmap(page, RECLAIMED, "shrink")
        elif len(self.reserved) < self.max_reserved and not self.shrinking:
            self.reserved.append(page)
            self._move(page, RESERVED, "park")
        else:
            self._unmap(page, FREE, "unmap")

    def _map(self, page: int, dst: PageState, cause: str) -> bool:
        try:
            self.space.map_page(page)
        except (MapQuarantinedError, DeviceError, StateConsistencyError) as err:
            self._map_failed(page, err)
            return False
        self._move(page, dst, cause)
        return True

    def _map_failed(self, page: int, err: Exception) -> None:
        """A failed ``map_page``: quarantine (undo failed), a note (undone), or quarantine and
        fail the pool, re-raising (outcome unknown, e.g. a lost reply: never reissue it)."""
        if isinstance(err, MapQuarantinedError):
            self._move(page, QUARANTINED, f"quarantine: {err}")
        elif isinstance(err, DeviceError):
            self._note(page, f"map_failed: {err}")
        else:
            self._move(page, QUARANTINED, f"quarantine: {err}")
            self.fail(f"page {page}: {err}")
            raise err

    def _unmap(self, page: int, dst: PageState, cause: str) -> None:
        try:
            if self._release_next:
                self.space.prepare_unmap(page, release_next=True)
            else:
                self.space.prepare_unmap(page)
        except DeviceError as err:  # undone: the page is whole and still mapped
            self._note(page, f"unmap_failed: {err}")
            if self.state[page] is not RESERVED:
                self._move(page, RESERVED, "unmap_failed")
            if page not in self.reserved:  # a later trim or free retries it
                self.reserved.append(page)
            return
        except StateConsistencyError as err:  # the undo failed too: backing unknown
            self._move(page, QUARANTINED, f"quarantine: {err}")
            self.fail(f"page {page}: {err}")
            raise
        try:
            self.space.commit_unmap(page)
        except StateConsistencyError as err:
            # Unmapped, but its physical memory could not be released: keep the handle for
            # retry_releases() and never issue the id again.
            self._move(page, QUARANTINED, f"quarantine: {err}")
            return
        self._move(page, dst, cause)

    def retry_releases(self) -> int:
        """Retry releasing the physical memory of quarantined, already-unmapped pages."""
        done = 0
        for page in [p for p in self.space.retained if self.state[p] is QUARANTINED]:
            try:
                self.space.commit_unmap(page)
            except StateConsistencyError:
                continue
            done += 1
            self._note(page, "released")
        return done

    # -- reserve pool (preallocation) --------------------------------------------------------
    def _maybe_refill(self) -> None:
        if len(self.reserved) < self.min_reserved:
            (self.refill_hook or self.refill)()

    def refill(self) -> int:
        """Map free pages into the reserve up to ``min_reserved``; returns how many were mapped."""
        if self.failed:
            return 0
        n = 0
        while len(self.reserved) < self.min_reserved and self.new_pages_possible() > 0:
            page = self._peek_free()
            if page is None or not self._map(page, RESERVED, "prealloc"):
                break
            self.reserved.append(page)
            n += 1
        return n

    def trim(self) -> int:
        """Unmap every reserved page; returns how many."""
        self.check_ok()
        n = 0
        while self.reserved:
            page = self.reserved.pop()
            self._unmap(page, FREE if page < self.limit_pages else RECLAIMED, "trim")
            n += 1
        return n

    # -- async release (epochs) --------------------------------------------------------------
    def capture_marker(self) -> int:
        """Close the current epoch: pages retired so far may be released after a barrier."""
        marker = self.epoch
        self.epoch += 1
        return marker

    def release_retired_through(self, marker: int) -> int:
        """Every worker has passed its barrier for ``marker``: release those retired pages."""
        self.check_ok()
        due = sorted(p for p, e in self.retired.items() if e <= marker)
        for page in due:
            del self.retired[page]
            self._park_or_unmap(page)
        return len(due)

    # -- limits ------------------------------------------------------------------------------
    def set_limit_pages(self, target: int) -> bool:
        """Move the limit to ``target`` page ids; True once the pool fits (converged)."""
        self.check_ok()
        old, self.limit_pages = self.limit_pages, target
        self._tail_mapped = sum(1 for p in range(target, self.num_pages)
                                if self.state[p] in _MAPPED)
        if target > old:
            for page in range(old, target):
                if self.state[page] is RECLAIMED:
                    self._move(page, FREE, "grow")
        for page in range(target, old):
            if self.state[page] is FREE:
                self._move(page, RECLAIMED, "shrink")
        return self.enforce_limit()

    def enforce_limit(self) -> bool:
        """Unmap reserved pages past the limit; True once no mapped page is left there."""
        for page in [q for q in self.reserved if q >= self.limit_pages]:
            self.reserved.remove(page)
            self._unmap(page, RECLAIMED, "shrink")
        return not self.shrinking

    def close(self) -> None:
        """Unmap every mapped page (in-use ones too: the owner is going away)."""
        for page in range(self.num_pages):
            if self.state[page] in (IN_USE, RESERVED, RETIRED):
                self._unmap(page, FREE, "close")
        self.reserved.clear()
        self.retired.clear()
