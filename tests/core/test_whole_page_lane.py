"""The ledger's whole-page lanes (an alloc that one new page covers, a free of exactly the list
a whole-page alloc returned) end in the same state, events and refusals as the general path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError
from workbench.sim.device import SimDevice


def make(pages: int = 8, min_r: int = 0, max_r: int = 0, blocks: int | None = None):
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16,
                     num_blocks=blocks or 64 * pages)
    cfg = PoolConfig(min_reserved_pages=min_r, max_reserved_pages=max_r, gpu_utilization=1.0,
                     prealloc=min_r > 0)
    return KVCacheManager(geo, SimDevice(), name="p", config=cfg)


def _state(kv: KVCacheManager) -> tuple:
    return (kv.events.keys(), sorted(kv.allocated), kv.pages.mapped_pages, kv.num_free,
            dict(kv.free_blocks), kv.misses)


def test_a_whole_page_alloc_is_its_page_ascending_and_its_free_unmaps_it():
    kv = make()
    filler = kv.alloc(63)  # the rest of the null block's page
    ids = kv.alloc(64)
    assert ids == list(range(64, 128)) and kv.pages.mapped_pages == 2
    kv.free(ids)
    assert kv.pages.mapped_pages == 1 and 64 not in kv.allocated
    assert [e.key()[2:] for e in kv.events][-2:] == [("free", "in_use", "map"),
                                                      ("in_use", "free", "unmap")]
    kv.free(filler)
    kv.check_invariants()


@pytest.mark.parametrize("bad", [lambda ids: [float(b) for b in ids],
                                 lambda ids: ids[:-1] + [ids[0]],
                                 lambda ids: ids + [ids[0] + 64]])
def test_a_bad_whole_page_free_is_refused_with_nothing_touched(bad):
    kv = make()
    kv.alloc(63)
    ids = kv.alloc(64)
    before = _state(kv)
    with pytest.raises(ConfigError):
        kv.free(bad(ids))
    assert _state(kv) == before
    kv.check_invariants()


def test_a_double_whole_page_free_is_refused():
    kv = make()
    kv.alloc(63)
    ids = kv.alloc(64)
    kv.free(list(ids))
    with pytest.raises(ConfigError, match="not allocated"):
        kv.free(ids)
    kv.check_invariants()


def test_a_short_last_page_is_topped_up_or_rolled_back_like_the_general_path():
    kv = make(blocks=64 * 2 + 10)  # page 2 holds 10 blocks
    kv.alloc(63)
    kv.alloc(64)
    assert kv.alloc(64) is None and kv.misses == 1  # only 10 blocks are left: the pre-check
    got = kv.alloc(10)
    assert got == list(range(128, 138))
    kv.check_invariants()


ops = st.lists(st.one_of(st.tuples(st.just("alloc"), st.sampled_from([1, 5, 63, 64, 64, 70])),
                         st.tuples(st.just("free"), st.integers(0, 9)),
                         st.tuples(st.just("limit"), st.integers(1, 8))), max_size=30)


@settings(max_examples=60, deadline=None)
@given(ops, st.integers(0, 2))
def test_freeing_a_list_or_a_tuple_ends_the_same(script, reserve):
    """Pool A frees each list as alloc returned it (the lane when it is a whole page); pool B
    frees the same ids as a tuple (always the general path): the same events, blocks, free
    stacks (their order decides which block is reused next) and pages."""
    a, b = make(min_r=reserve, max_r=reserve), make(min_r=reserve, max_r=reserve)
    live: list[list[int]] = []
    for op in script:
        if op[0] == "alloc":
            got = a.alloc(op[1])
            assert got == b.alloc(op[1])
            if got is not None:
                live.append(got)
        elif op[0] == "free" and live:
            ids = live.pop(op[1] % len(live))
            a.free(ids)
            b.free(tuple(ids))
        elif op[0] == "limit":
            size = op[1] * a.geometry.page_id_bytes
            assert a.set_limit(size).outcome == b.set_limit(size).outcome
        sa, sb = _state(a), _state(b)
        assert sa == sb
    a.check_invariants()
    b.check_invariants()
