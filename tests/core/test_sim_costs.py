"""The simulator charges VMM calls per call, not per byte: layouts cost what the H200 measured."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.hardware import GPU_PRESETS, H200_PAGE_ID_GROW, VMM_CALLS
from workbench.sim.device import MiB, SimDevice


def _llama8b(layout: Layout, pages: int = 8) -> KVGeometry:
    """The bench's 32-layer Llama-8B-like KV: 128 MiB page ids, 64 targets per layer-wise page."""
    return KVGeometry(num_layers=32, kv_heads=8, head_dim=128, block_size=16,
                      num_blocks=64 * pages, layout=layout)


def _grow_shrink_s(layout: Layout, preset: str = "h200") -> tuple[float, float]:
    """Simulated seconds to grow one page id and to shrink it, through the ledger (no reserve)."""
    dev = SimDevice(preset)
    geo = _llama8b(layout)
    cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, prealloc=False,
                     min_reserved_pages=0, max_reserved_pages=0)
    kv = KVCacheManager(geo, dev, name="p", config=cfg)
    bpp = geo.page_size // geo.block_bytes
    filler = kv.alloc(bpp - 1)  # the rest of the null block's page: the next alloc maps one page
    assert filler is not None
    t0 = dev.busy_s
    ids = kv.alloc(bpp)
    assert ids is not None
    t1 = dev.busy_s
    kv.free(ids)
    return t1 - t0, dev.busy_s - t1


def test_a_call_costs_the_same_whatever_its_size():
    lat = GPU_PRESETS["h200"].vmm
    for size in (2 * MiB, 128 * MiB, 1024 * MiB):
        d = SimDevice("h200")
        va = d.reserve(size)
        h = d.create(size)
        d.map(va, size, h)
        d.set_access(va, size)
        d.unmap(va, size)
        d.release(h)
        assert d.busy_s == pytest.approx(sum(getattr(lat, c) for c in VMM_CALLS), rel=1e-12)


def test_one_page_id_costs_one_call_of_each_kind_per_target():
    lat = GPU_PRESETS["h200"].vmm
    for layout, targets in ((Layout.CONTIGUOUS, 1), (Layout.PER_LAYER, 64)):
        grow, shrink = _grow_shrink_s(layout)
        assert grow == pytest.approx(targets * (lat.create + lat.map + lat.set_access), rel=1e-12)
        assert shrink == pytest.approx(targets * (lat.unmap + lat.release), rel=1e-12)


def test_per_layer_over_contiguous_grow_is_in_the_h200_measured_range():
    contiguous, per_layer = H200_PAGE_ID_GROW
    assert (contiguous.layout, per_layer.layout, per_layer.targets) == (
        "contiguous", "per_layer", 64)
    lo = per_layer.low_s / contiguous.high_s  # 2.5 ms / 57 us = 44
    hi = per_layer.high_s / contiguous.low_s  # 2.9 ms / 40 us = 72.5
    ratio = _grow_shrink_s(Layout.PER_LAYER)[0] / _grow_shrink_s(Layout.CONTIGUOUS)[0]
    assert lo <= ratio <= hi
    assert ratio == pytest.approx(64.0, rel=1e-12)  # one call per target, nothing per byte


def test_a100_pays_its_slow_create_per_call():
    h200, a100 = _grow_shrink_s(Layout.CONTIGUOUS, "h200"), _grow_shrink_s(
        Layout.CONTIGUOUS, "a100")
    lat = GPU_PRESETS["a100"].vmm
    assert a100[0] == pytest.approx(lat.create + lat.map + lat.set_access, rel=1e-12)  # 193+1.5+36
    assert a100[0] > 2 * h200[0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["create", "map", "unmap"]),
                          st.integers(1, 64)), max_size=30))
def test_busy_time_is_the_sum_of_per_call_costs(ops):
    """Any sequence of create / map+set-access / unmap+release of any sizes costs the sum of its
    calls' preset latencies."""
    lat = GPU_PRESETS["h200"].vmm
    d = SimDevice("h200")
    va = d.reserve(64 * 64 * MiB)
    expect = lat.reserve
    free_handles: list[tuple[int, int]] = []
    mapped: list[tuple[int, int, int]] = []  # (va, size, handle)
    cursor = va
    for op, chunks in ops:
        size = chunks * 2 * MiB
        if op == "create":
            free_handles.append((d.create(size), size))
            expect += lat.create
        elif op == "map" and free_handles:
            h, hs = free_handles.pop()
            d.map(cursor, hs, h)
            d.set_access(cursor, hs)
            mapped.append((cursor, hs, h))
            cursor += hs
            expect += lat.map + lat.set_access
        elif op == "unmap" and mapped:
            v, s, h = mapped.pop()
            d.unmap(v, s)
            d.release(h)
            cursor = v
            expect += lat.unmap + lat.release
    assert abs(d.busy_s - expect) < 1e-12
