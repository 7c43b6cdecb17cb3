"""The vLLM adapter's ledger (core ledger, engine-chosen block ids) without vLLM: hold/release
keep the core's invariants, map exactly the pages of held blocks (plus the reserve), honour a
limit (deferred while live blocks sit on the tail) and publish to the control segment."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from workbench.adapters.vllm.ledger import BlockLedger, PoolExhausted
from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.events import PageState
from workbench.core.geometry import KVGeometry, Layout
from workbench.units import MiB

# 2 layers x 256 KiB blocks: 8 blocks per 2 MiB page, 8 pages
GEO = dict(num_layers=2, kv_heads=1, head_dim=256 * 1024, block_size=1, num_blocks=64,
           num_buffers=1, dtype_bytes=1, page_size=2 * MiB)


def ledger(contiguous: bool = True, **cfg) -> BlockLedger:
    layout = Layout.CONTIGUOUS if contiguous else Layout.PER_LAYER
    config = PoolConfig(contiguous_layout=contiguous, **cfg)
    return BlockLedger(KVGeometry(**GEO, layout=layout), make_device("sim"), name="t",
                       config=config)


def test_hold_maps_the_pages_of_chosen_blocks_and_release_parks_then_unmaps():
    kv = ledger(min_reserved_pages=0, max_reserved_pages=1)
    assert kv.pages.mapped_pages == 1 and kv.allocated == {0}  # the null block's page
    kv.hold([9, 10, 40])  # pages 1 and 5
    assert [kv.space.is_mapped(p) for p in range(8)] == [1, 1, 0, 0, 0, 1, 0, 0]
    kv.release([9, 10])
    assert kv.pages.state[1] is PageState.RESERVED  # parked: max_reserved_pages=1
    kv.release([40])
    assert kv.pages.state[5] is PageState.FREE and not kv.space.is_mapped(5)
    assert kv.count_events("map") == 3 and kv.count_events("unmap") == 1  # page 0 too
    kv.hold([15])  # page 1 again: reused from the reserve, no map
    assert kv.count_events("map") == 3 and kv.count_events("reuse") == 1
    kv.check_invariants()


def test_hold_is_all_or_nothing_under_a_limit():
    kv = ledger(min_reserved_pages=0, max_reserved_pages=0, memory_limit=2 * 4 * MiB)
    assert kv.pages.limit_pages == 2
    kv.hold([1, 8])
    before = (set(kv.allocated), kv.pages.mapped_pages)
    with pytest.raises(PoolExhausted):
        kv.hold([2, 16])  # page 2 is past the limit
    assert (set(kv.allocated), kv.pages.mapped_pages) == before
    kv.check_invariants()


def test_a_shrink_waits_for_live_blocks_on_the_tail_then_applies():
    kv = ledger(min_reserved_pages=0, max_reserved_pages=0)
    kv.hold([1, 30, 60])  # pages 0, 3, 7
    result = kv.set_limit(2 * 4 * MiB)  # two page ids
    assert result.outcome.value == "deferred" and kv.pages.shrinking
    with pytest.raises(PoolExhausted):
        kv.hold([9])  # no new page while shrinking
    kv.release([30, 60])
    assert kv.limit_state.outcome.value == "applied" and kv.pages.mapped_pages == 1
    kv.hold([9])
    kv.check_invariants()


def test_double_hold_and_foreign_release_are_no_ops():
    kv = ledger(min_reserved_pages=0, max_reserved_pages=0)
    kv.hold([3])
    kv.hold([3])
    kv.release([4, 0])  # not held; the null block is never released
    assert kv.allocated == {0, 3}
    kv.check_invariants()


class HoldRelease(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = ledger(contiguous=False, min_reserved_pages=1, max_reserved_pages=2)
        self.held: set[int] = {0}

    @rule(ids=st.lists(st.integers(1, 63), max_size=6))
    def hold(self, ids):
        try:
            self.kv.hold(ids)
        except PoolExhausted:
            return
        self.held |= set(ids)

    @rule(ids=st.lists(st.integers(1, 63), max_size=6))
    def release(self, ids):
        self.kv.release(ids)
        self.held -= set(ids)

    @rule(pages=st.integers(1, 8))
    def limit(self, pages):
        self.kv.set_limit(pages * self.kv.geometry.page_id_bytes)

    @invariant()
    def consistent(self):
        kv, g = self.kv, self.kv.geometry
        kv.check_invariants()
        assert kv.allocated == self.held
        in_use = {p for p in range(g.num_pages) if kv.pages.state[p] is PageState.IN_USE}
        assert in_use == {g.block_page(b) for b in self.held}


TestHoldRelease = HoldRelease.TestCase
TestHoldRelease.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


class Fence:
    """A stand-in for a CUDA event: passes when the test says the kernels finished."""

    def __init__(self):
        self.done = False
        self.waited = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = self.done = True


def test_a_page_emptied_while_kernels_may_run_is_released_only_after_its_fence():
    kv = BlockLedger(KVGeometry(**GEO, layout=Layout.CONTIGUOUS), make_device("sim"), name="t",
                     config=PoolConfig(min_reserved_pages=0, max_reserved_pages=0),
                     defer_release=True)
    fences: list[Fence] = []
    kv.fence = lambda: fences.append(Fence()) or fences[-1]
    kv.hold([9, 17])  # pages 1 and 2
    kv.release([9])
    assert kv.pages.state[1] is PageState.RETIRED and kv.space.is_mapped(1) and len(fences) == 1
    assert kv.room_pages() >= 1 and kv.pages.state[1] is PageState.RETIRED  # not passed yet
    fences[0].done = True
    kv.room_pages()  # any scheduler call reaps passed fences
    assert kv.pages.state[1] is PageState.FREE and not kv.space.is_mapped(1)
    kv.release([17])
    kv.hold([18])  # page 2 is retired, not released: revived without a map
    assert kv.pages.state[2] is PageState.IN_USE and kv.count_events("revive") == 1
    kv.check_invariants()


def test_with_no_room_but_retired_pages_hold_waits_for_the_fence():
    kv = BlockLedger(KVGeometry(**GEO, layout=Layout.CONTIGUOUS), make_device("sim"), name="t",
                     config=PoolConfig(min_reserved_pages=0, max_reserved_pages=1,
                                       memory_limit=2 * 4 * MiB), defer_release=True)
    fences: list[Fence] = []
    kv.fence = lambda: fences.append(Fence()) or fences[-1]
    kv.hold([9])
    kv.release([9])  # page 1 retires: the limit's two pages are both mapped
    kv.hold([10])  # the same page: revived, no wait
    assert not fences[0].waited and kv.count_events("revive") == 1
    kv.release([10])
    kv.set_limit(3 * 4 * MiB)
    kv.hold([17])  # page 2: the limit has room, no wait
    assert not fences[-1].waited
    kv.set_limit(3 * 4 * MiB, revision=kv.revision)
    kv.release([17])
    kv.hold([1])  # page 0
    with pytest.raises(PoolExhausted):
        kv.hold([30])  # page 3 is past the limit: refused at once
    kv.set_limit(4 * 4 * MiB)
    kv.hold([9])  # page 1 (retired, revived); page 2 retired too
    kv.hold([30])  # page 3: room after the limit grew
    kv.release([9, 30])
    kv.set_limit(2 * 4 * MiB)  # pages 2 and 3 retired past the new limit: deferred
    assert kv.pages.shrinking
    kv.reap(wait=True)
    assert not kv.pages.shrinking and kv.limit_state.outcome.value == "applied"
    assert all(f.waited or f.done for f in fences)
    kv.check_invariants()

