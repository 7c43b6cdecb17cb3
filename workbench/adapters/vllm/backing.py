"""Physical backing of vLLM block ids: a page of the KV range is mapped while any block on it is
*held* (in use, or cached for prefix hits) and unmapped when the last one lets go.

vLLM's BlockPool keeps choosing which block id comes next (its free queue order is part of its
prefix-caching behaviour and of its own tests); this class only follows, so the logical pool is
vLLM's and the physical memory is the workbench's. Emptied pages park (stay mapped) up to
``max_reserved_pages`` so LIFO reuse of a just-freed block costs no map, and a memory limit
(``WORKBENCH_KV_MEMORY_LIMIT``) or the device's headroom caps mapped pages.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from workbench.config import PoolConfig
from workbench.core.events import Event, EventLog
from workbench.core.vspace import KVSpace
from workbench.errors import DeviceError, WorkbenchError


class PoolExhausted(WorkbenchError, ValueError):
    """No physical page for a block vLLM chose; the scheduler treats it as 'cannot schedule'."""


class BlockBacking:
    def __init__(self, space: KVSpace, config: PoolConfig, *, name: str = "vllm",
                 events: EventLog | None = None):
        self.space = space
        self.geometry = space.geometry
        self.config = config
        self.name = name
        self.events = events if events is not None else EventLog()
        self.held: set[int] = set()
        self.page_refs: dict[int, int] = {}  # mapped page -> held blocks on it
        self.parked: OrderedDict[int, None] = OrderedDict()  # mapped pages holding nothing
        self.maps = self.unmaps = 0

    # -- capacity ----------------------------------------------------------------------------
    @property
    def mapped_pages(self) -> int:
        return len(self.page_refs) + len(self.parked)

    @property
    def mapped_bytes(self) -> int:
        return self.mapped_pages * self.geometry.page_id_bytes

    def page_budget(self) -> int:
        """Pages that may be mapped in all (limit and device headroom)."""
        g, cfg = self.geometry, self.config
        cap = g.num_pages
        if cfg.memory_limit is not None:
            cap = min(cap, cfg.memory_limit // g.page_id_bytes)
        free, total = self.space.device.mem_info()
        spare = free - int(total * (1.0 - cfg.gpu_utilization))
        return min(cap, self.mapped_pages + max(0, spare // g.page_id_bytes))

    def room_pages(self) -> int:
        """New pages that could be mapped now (a parked page can be reused without a map)."""
        return max(0, self.page_budget() - len(self.page_refs))

    def unlimited(self) -> bool:
        """True if every page could be mapped now: no free block is short of backing (the
        cheap common case; otherwise the pool counts in vLLM's order)."""
        return self.room_pages() >= self.geometry.num_pages - len(self.page_refs)

    # -- hold / release ----------------------------------------------------------------------
    def _emit(self, page: int, src: str, dst: str, cause: str) -> None:
        self.events.emit(Event(self.space.device.now(), self.name, page, src, dst, cause))

    def hold(self, block_ids: Iterable[int]) -> None:
        """Back every block or none (raises PoolExhausted, nothing changed)."""
        ids = [b for b in dict.fromkeys(block_ids) if b not in self.held]
        g = self.geometry
        need = sorted({g.block_page(b) for b in ids} - set(self.page_refs))
        fresh = [p for p in need if p not in self.parked]
        if len(self.page_refs) + len(need) > self.page_budget():
            raise PoolExhausted(f"{len(need)} more pages needed, the budget is "
                                f"{self.page_budget()} pages of {g.page_id_bytes} bytes")
        done: list[int] = []
        try:
            for p in fresh:
                self._make_room(keep=set(need))
                self.space.map_page(p)
                self.maps += 1
                done.append(p)
                self._emit(p, "free", "in_use", "map")
        except DeviceError as err:
            for p in reversed(done):
                self.space.unmap_page(p)
                self._emit(p, "in_use", "free", "rollback")
            raise PoolExhausted(f"map failed: {err}") from err
        for p in need:
            if p in self.parked:
                del self.parked[p]
                self._emit(p, "reserved", "in_use", "reuse")
            self.page_refs[p] = 0
        for b in ids:
            self.held.add(b)
            self.page_refs[g.block_page(b)] += 1

    def release(self, block_ids: Iterable[int]) -> None:
        g = self.geometry
        for b in block_ids:
            if b not in self.held:
                continue
            self.held.discard(b)
            p = g.block_page(b)
            self.page_refs[p] -= 1
            if self.page_refs[p] == 0:
                del self.page_refs[p]
                self.parked[p] = None
                self._emit(p, "in_use", "reserved", "park")
        while len(self.parked) > self.config.max_reserved_pages:
            self._unmap_oldest_parked()

    def _make_room(self, keep: set[int]) -> None:
        """Over the budget only because of parked pages: give the oldest back first."""
        while self.mapped_pages >= self.page_budget() and set(self.parked) - keep:
            self._unmap_oldest_parked(keep)

    def _unmap_oldest_parked(self, keep: set[int] = frozenset()) -> None:
        p = next(q for q in self.parked if q not in keep)
        del self.parked[p]
        self.space.unmap_page(p)
        self.unmaps += 1
        self._emit(p, "reserved", "free", "unmap")

    def trim(self) -> int:
        n = 0
        while self.parked:
            self._unmap_oldest_parked()
            n += 1
        return n
