"""One test per fault point of the map/unmap/alloc paths, on the simulated device."""

from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.core.device import FaultyDevice
from workbench.core.events import PageState
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError, InjectedFault, PoolFailedError, StateConsistencyError
from workbench.sim.device import MiB, SimDevice

S = PageState


def make(layout=Layout.CONTIGUOUS, min_r=0, max_r=0, capacity=None, **plan):
    dev = FaultyDevice(SimDevice("h200", capacity=capacity), {k: v for k, v in plan.items()})
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=640,
                     layout=layout)  # 64 blocks per page, 10 pages
    cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, min_reserved_pages=min_r,
                     max_reserved_pages=max_r, gpu_utilization=1.0)
    return KVCacheManager(geo, dev, name="p", config=cfg), dev


def ledger_state(kv):
    return (sorted(kv.allocated), {p: sorted(s) for p, s in kv.free_blocks.items()},
            list(kv.reserved_blocks), kv.num_free)


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("call", ["create", "map", "set_access"])
def test_failed_backing_mid_alloc_restores_ledger_exactly(layout, call):
    kv, dev = make(layout)
    first = kv.alloc(30)  # page 0 has 33 free blocks left
    before = ledger_state(kv)
    mapped_before = set(kv.space.handles)
    handles_before = dict(dev.inner.allocations)
    dev.fail_next(call, 2 if layout is Layout.CONTIGUOUS else 5)  # on the second new page
    assert kv.alloc(200) is None
    assert ledger_state(kv) == before
    kv.check_invariants()
    # no partial mapping and nothing leaked: the device holds exactly what it held before
    assert set(kv.space.handles) - mapped_before <= {p for p in kv.pages.reserved}
    assert set(dev.inner.allocations) == set(handles_before) | {
        h for p in kv.space.handles if p not in mapped_before for h in kv.space.handles[p]}
    assert any(e.cause.startswith("map_failed") for e in kv.events)
    kv.free(first)
    assert kv.alloc(200) is not None  # the fault was one call: the pool works again


def test_failed_map_with_failed_rollback_quarantines_the_page():
    kv, dev = make(Layout.PER_LAYER)
    dev.fail_next("map", 2)  # second of 4 targets fails...
    dev.fail_next("unmap", 1)  # ...and undoing the first fails too
    assert kv.alloc(100) is None
    quarantined = [p for p, s in enumerate(kv.pages.state) if s is S.QUARANTINED]
    assert quarantined == [1]
    assert any(e.dst == "quarantined" for e in kv.events)
    kv.check_invariants()
    ids = kv.alloc(100)  # the pool goes on with other pages and never issues page 1 again
    assert ids is not None
    assert all(kv.geometry.block_page(b) != 1 for b in ids)


def test_failed_unmap_is_undone_and_retried():
    kv, dev = make(Layout.PER_LAYER)
    ids = kv.alloc(100)
    dev.fail_next("unmap", 3)  # midway through the 4 targets of the emptied page
    kv.free(ids)
    assert kv.pages.state[1] is S.RESERVED  # still whole, parked for a retry
    assert any(e.cause.startswith("unmap_failed") for e in kv.events)
    kv.check_invariants()
    assert kv.trim() >= 1
    assert kv.pages.state[1] is S.FREE
    kv.check_invariants()


def test_failed_unmap_and_failed_remap_fail_the_pool():
    kv, dev = make(Layout.PER_LAYER)
    ids = kv.alloc(100)
    dev.fail_next("unmap", 2)
    dev.fail_next("map", 1)  # the undo of the first unmap
    with pytest.raises(StateConsistencyError):
        kv.free(ids)
    assert kv.pages.failed
    assert any(e.dst == "failed" for e in kv.events)
    with pytest.raises(PoolFailedError):
        kv.alloc(1)
    assert kv.available_size() == 0


def test_failed_release_quarantines_and_retry_releases():
    kv, dev = make()
    ids = kv.alloc(100)
    dev.fail_next("release", 1)
    kv.free(ids)
    assert kv.pages.state[1] is S.QUARANTINED
    assert kv.pages.failed is None
    assert 1 in kv.space.retained
    assert kv.pages.retry_releases() == 1
    assert not kv.space.retained
    assert not dev.inner.allocations.keys() - {h for hs in kv.space.handles.values() for h in hs}


def test_prealloc_map_failure_leaves_page_free():
    kv, dev = make(min_r=2, max_r=4)
    dev.fail_next("map", 1)
    kv.trim()
    assert kv.pages.refill() == 0  # the first map failed: refill stops, nothing half-mapped
    assert kv.pages.refill() == 2
    kv.check_invariants()


def test_device_out_of_memory_is_a_miss_not_an_error():
    kv, dev = make(capacity=16 * MiB)  # 2 page ids of 8 MiB
    assert kv.alloc(64) is not None
    assert kv.alloc(64) is None
    assert kv.misses >= 1
    kv.check_invariants()


def test_reserved_blocks_are_taken_first_and_restored_on_rollback():
    kv, dev = make()
    assert kv.try_to_reserve(10)
    held = list(kv.reserved_blocks)
    dev.fail_next("create", 1)
    assert kv.alloc(120) is None
    assert kv.reserved_blocks == held
    got = kv.alloc(5)
    assert got == held[:5]
    kv.free_reserved()
    kv.check_invariants()


def test_bad_free_loses_nothing():
    kv, _ = make()
    ids = kv.alloc(5)
    before = ledger_state(kv)
    for bad in ([ids[0], ids[0]], [0], [10_000], [ids[0], 999], ["x"]):
        with pytest.raises(ConfigError):
            kv.free(bad)
        assert ledger_state(kv) == before
    with pytest.raises(ConfigError):
        kv.alloc(-1)
    assert kv.alloc(0) == []


def test_injected_fault_names_the_call():
    dev = FaultyDevice(SimDevice(), {"map": [1]})
    with pytest.raises(InjectedFault, match="map failed"):
        dev.map(0, 0, 0)
    with pytest.raises(ConfigError):
        dev.fail("mmap", 1)


@pytest.mark.parametrize("layout", list(Layout))
def test_close_after_quarantine_gives_everything_back(layout):
    kv, dev = make(layout)
    ids = kv.alloc(100)
    dev.fail_next("map", 2 if layout is Layout.PER_LAYER else 1)
    dev.fail_next("unmap", 1 if layout is Layout.PER_LAYER else 1)
    dev.fail_next("release", 1)  # the contiguous undo fails at release instead
    assert kv.alloc(100) is None
    assert kv.pages.counts[S.QUARANTINED] == 1
    kv.free(ids)
    kv.close()
    inner = dev.inner
    assert not inner.mappings and not inner.allocations and not inner.reservations


def test_available_size_counts_a_short_last_page_exactly():
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=100)
    kv = KVCacheManager(geo, SimDevice(), config=PoolConfig(gpu_utilization=1.0))
    assert kv.available_size() == 99  # 64 + 36 blocks, less the null block
    assert kv.alloc(99) is not None and kv.available_size() == 0
