"""The page allocator's free heap stays one entry per free id when one page flaps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.core.pages import FREE
from workbench.sim.device import SimDevice


def _pool() -> KVCacheManager:
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=640,
                     layout=Layout.CONTIGUOUS)
    return KVCacheManager(geo, SimDevice(), name="p", config=PoolConfig(
        prealloc=False, min_reserved_pages=0, max_reserved_pages=0))


def test_a_page_freed_and_taken_again_adds_no_heap_entry():
    kv = _pool()
    pa = kv.pages
    before = len(pa._free_heap)
    for _ in range(500):
        pa.free_page(pa.alloc_page())
    assert len(pa._free_heap) == before  # it grew by one per cycle before
    assert sorted(pa._free_heap) == [p for p in range(pa.num_pages) if pa.state[p] is FREE]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3, 3), max_size=60))
def test_every_free_id_is_on_the_heap_and_the_lowest_goes_first(ops):
    kv = _pool()
    pa = kv.pages
    held: list[int] = []
    for op in ops:
        if op >= 0:
            free = [p for p in range(pa.num_pages) if pa.state[p] is FREE]
            page = pa.alloc_page()
            assert page == (free[0] if free else None)
            if page is not None:
                held.append(page)
        elif held:
            pa.free_page(held.pop(op % len(held)))
        free = {p for p in range(pa.num_pages) if pa.state[p] is FREE}
        assert free <= set(pa._free_heap)
        assert len(pa._free_heap) <= pa.num_pages + len(ops)
