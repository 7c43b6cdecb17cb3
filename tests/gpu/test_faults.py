"""Faults on the real device: the Nth driver call fails (FaultyDevice over CudaDevice).

A failed map mid-allocation leaves no partial mapping and the ledger as it was; a failed rollback
quarantines the page and says so in an event; device memory is the same before and after.
"""

from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.core.device import FaultyDevice
from workbench.core.events import PageState
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import WorkbenchError

pytestmark = pytest.mark.gpu
# PER_LAYER: one page id is 4 layers x K,V = 8 maps, so a failure can land mid-page
GEO = KVGeometry(num_layers=4, kv_heads=8, head_dim=128, block_size=16, num_blocks=64 * 16,
                 layout=Layout.PER_LAYER)
CFG = PoolConfig(contiguous_layout=False, prealloc=False, min_reserved_pages=0,
                 max_reserved_pages=0)


def _driver_free(dev) -> int:
    from workbench.gpu.driver import call, driver

    return int(call("cuMemGetInfo", driver().cuMemGetInfo)[0])


def test_failed_map_mid_allocation_leaves_nothing(cuda_dev):
    free0 = _driver_free(cuda_dev)
    dev = FaultyDevice(cuda_dev)
    kv = KVCacheManager(GEO, dev, name="f", config=CFG)
    held = kv.alloc(64 * 2)  # pages 0..2 in use
    kv.check_invariants()
    mapped0, snap0 = cuda_dev.mapped_bytes, kv.snapshot()
    allocated0 = set(kv.allocated)
    dev.fail_next("map", 3 + 8)  # page 3 maps fine, page 4 fails at its third target
    assert kv.alloc(64 * 2) is None  # a miss, never a partial result
    kv.check_invariants()
    assert cuda_dev.mapped_bytes == mapped0 and kv.allocated == allocated0
    assert kv.snapshot().counts == snap0.counts and kv.used_blocks == snap0.used_blocks
    assert any(e.cause.startswith("map_failed") for e in kv.events)
    assert dev.injected and dev.injected[-1][0] == "map"
    more = kv.alloc(64)  # the pool still works
    assert more is not None
    kv.free(held + more)
    kv.close()
    assert _driver_free(cuda_dev) == free0 - cuda_dev.zero.held_bytes  # all but the zero page
    cuda_dev.close()
    assert _driver_free(cuda_dev) == free0


def test_failed_rollback_quarantines_and_is_reported(cuda_dev):
    free0 = _driver_free(cuda_dev)
    dev = FaultyDevice(cuda_dev)
    kv = KVCacheManager(GEO, dev, name="q", config=CFG)
    dev.fail_next("map", 3)  # page 1's third map fails ...
    dev.fail_next("unmap", 1)  # ... and undoing its second map fails too
    assert kv.alloc(64 * 2) is None
    q = [e for e in kv.events if e.dst == PageState.QUARANTINED.value]
    assert len(q) == 1 and q[0].page == 1 and "rollback failed" in q[0].cause
    kv.check_invariants()
    assert kv.pages.state[1] is PageState.QUARANTINED
    ids = kv.alloc(64 * 2)  # quarantined ids are never issued again
    assert ids is not None and all(GEO.block_page(b) != 1 for b in ids)
    kv.free(ids)
    try:
        kv.close()  # the quarantined page's targets are unknown to the core ...
    except Exception:  # noqa: BLE001 - ... so its reservation may refuse to go
        pass
    cuda_dev.close()  # the device knows every mapping and handle: nothing leaks
    assert _driver_free(cuda_dev) == free0


def test_fault_free_memory_identical(cuda_dev):
    """A whole faulty session (maps, unmaps and releases failing) gives every byte back."""
    free0 = _driver_free(cuda_dev)
    dev = FaultyDevice(cuda_dev, {"create": [13], "map": [12, 30], "set_access": [21],
                                  "unmap": [4], "release": [9]})
    kv = KVCacheManager(GEO, dev, name="s", config=CFG)
    live = []
    try:
        for i in range(30):
            ids = kv.alloc(64 + i * 7)
            if ids is not None:
                live.append(ids)
            if len(live) > 3:
                kv.free(live.pop(0))
    except WorkbenchError:  # a failed release fails the pool (by design)
        pass
    assert len(dev.injected) >= 3
    cuda_dev.close()
    assert _driver_free(cuda_dev) == free0
