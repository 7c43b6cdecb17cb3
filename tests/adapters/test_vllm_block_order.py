"""Which blocks the elastic BlockPool hands out without a limit. vLLM's free queue rotates:
unhashed blocks return to its head, hashed ones to its tail, so after churn its head may point at
a page nothing backs while backed pages have free blocks. On an H100 that order cost elastic a
page map per few blocks of a short prefill; the pool picks free blocks on backed pages first,
with or without a limit, and vLLM's own bookkeeping (ref counts, hashes, the queue) stays whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.adapters import vllm_fake
from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.units import MiB

BLOCKS, BPP = 256, 16  # 16 pages of 16 blocks


def _pool(monkeypatch, name, own_order=False):
    vllm_fake.install(monkeypatch)
    monkeypatch.setenv("WORKBENCH_KV_VLLM_OWN_ORDER", "1" if own_order else "0")
    from workbench.adapters.vllm import registry
    from workbench.adapters.vllm.ledger import BlockLedger
    from workbench.adapters.vllm.pool import ElasticBlockPool
    from workbench.backends import make_device

    geo = KVGeometry(num_layers=1, kv_heads=1, head_dim=128 * 1024, block_size=1,
                     num_blocks=BLOCKS, num_buffers=1, dtype_bytes=1, page_size=2 * MiB,
                     layout=Layout.CONTIGUOUS)
    assert geo.blocks_per_page(0) == BPP
    dev = make_device("sim", name=name, capacity=geo.num_pages * 2 * MiB + 64 * MiB)
    kv = BlockLedger(geo, dev, name=name,
                     config=PoolConfig(min_reserved_pages=0, max_reserved_pages=0))
    registry.register(BLOCKS, kv)
    try:
        pool = ElasticBlockPool(BLOCKS, True, 16)
    finally:
        registry.ledgers.remove((BLOCKS, kv))
    return pool, kv


def test_a_free_block_on_a_backed_page_goes_before_vllms_head_on_an_unbacked_one(monkeypatch):
    pool, kv = _pool(monkeypatch, "order-head")
    x, y, z = (pool.get_new_blocks(n) for n in (15, 16, 16))  # pages 0 (with null), 1, 2
    assert kv.pages.mapped_pages == 3
    pool.free_blocks([z[-1]])  # block 47: page 2 stays backed by z's other blocks
    pool.free_blocks(y)  # page 1 has no held block left: unmapped
    assert kv.pages.mapped_pages == 2
    head = pool.free_block_queue.ids()[0]
    assert kv.geometry.block_page(head) == 1  # vLLM would pop a block on the unbacked page
    (got,) = pool.get_new_blocks(1)
    assert got.block_id == z[-1].block_id and got.ref_cnt == 1
    assert kv.pages.mapped_pages == 2  # no map on the request path
    kv.check_invariants()
    kv.close()


def test_with_vllms_own_order_the_head_is_popped_and_its_page_mapped(monkeypatch):
    pool, kv = _pool(monkeypatch, "order-own", own_order=True)
    x, y, z = (pool.get_new_blocks(n) for n in (15, 16, 16))
    pool.free_blocks([z[-1]])
    pool.free_blocks(y)
    head = pool.free_block_queue.ids()[0]
    (got,) = pool.get_new_blocks(1)
    assert got.block_id == head and kv.pages.mapped_pages == 3  # vLLM's pick, mapped
    kv.check_invariants()
    kv.close()


def test_vllms_order_stands_where_it_maps_nothing(monkeypatch):
    pool, kv = _pool(monkeypatch, "order-stands")
    first = pool.get_new_blocks(4)
    pool.free_blocks(reversed(first))  # unhashed: back at vLLM's head, page 0 still in use
    head = pool.free_block_queue.ids()[:4]
    assert [b.block_id for b in pool.get_new_blocks(4)] == head
    kv.check_invariants()
    kv.close()


@st.composite
def _churn(draw):
    return draw(st.lists(st.tuples(st.sampled_from(["alloc", "free", "reset"]),
                                   st.integers(1, 24), st.booleans(), st.integers(0, 99)),
                         min_size=1, max_size=40))


@settings(max_examples=60, deadline=None)
@given(ops=_churn())
def test_no_allocation_maps_a_page_while_backed_pages_have_room(ops):
    with pytest.MonkeyPatch.context() as mp:  # a fresh stand-in vLLM for every example
        _churn_through(*_pool(mp, "order-churn"), ops)


def _churn_through(pool, kv, ops):
    live: list[list] = []
    serial = 0
    try:
        for op, n, hashed, pick in ops:
            if op == "alloc" and n <= pool.get_num_free_blocks():
                backed_free, mapped = kv.num_free, kv.pages.mapped_pages
                blocks = pool.get_new_blocks(n)
                ids = [b.block_id for b in blocks]
                assert len(set(ids)) == n and 0 not in ids
                assert all(b.ref_cnt == 1 and kv.is_held(b.block_id) for b in blocks)
                if n <= backed_free:
                    assert kv.pages.mapped_pages == mapped
                if hashed:
                    for b in blocks[:-1]:  # vLLM hashes the full blocks, not the last
                        serial += 1
                        pool.cache_block(b, ("h", serial))
                live.append(blocks)
            elif op == "free" and live:
                pool.free_blocks(reversed(live.pop(pick % len(live))))
            elif op == "reset" and not live:
                assert pool.reset_prefix_cache()
            queued = pool.free_block_queue.ids()
            assert len(queued) == pool.get_num_free_blocks() == BLOCKS - 1 - sum(map(len, live))
            kv.check_invariants()
    finally:
        kv.close()
