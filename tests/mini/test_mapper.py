"""The background mapper, with real threads on a CPU: the engine thread takes mapped pages only,
and the pool stays consistent while both threads work."""

from __future__ import annotations

import random
import threading
import time

import pytest

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.errors import ConfigError
from workbench.host.device import HostDevice
from workbench.mini.kv import KVSpec, KVStore
from workbench.mini.mapper import BackgroundMapper, LockedKVCacheManager
from workbench.mini.model import get_config
from workbench.sim.device import SimDevice


class RecordingSim(SimDevice):
    """A simulated device that notes which thread made each allocation, and can be slow."""

    def __init__(self, delay_s: float = 0.0, **kw):
        super().__init__(**kw)
        self.delay_s = delay_s
        self.creators: list[int] = []

    def create(self, size: int) -> int:
        self.creators.append(threading.get_ident())
        if self.delay_s:
            time.sleep(self.delay_s)  # a driver call: the GIL is released meanwhile
        return super().create(size)


def _pool(dev, layout=Layout.CONTIGUOUS, min_reserved=3, pages=40) -> LockedKVCacheManager:
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16,
                     num_blocks=64 * pages, layout=layout)
    cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS,
                     min_reserved_pages=min_reserved, max_reserved_pages=min_reserved + 2)
    return LockedKVCacheManager(geo, dev, name="p", config=cfg)


@pytest.mark.parametrize("layout", list(Layout))
def test_the_engine_thread_only_takes_mapped_pages(layout):
    dev = RecordingSim(capacity=1 << 30)
    kv = _pool(dev, layout)
    mapper = BackgroundMapper(kv)
    try:
        assert mapper.wait_filled() and len(kv.pages.reserved) == 3
        engine = threading.get_ident()
        # construction mapped the null block's page and filled the reserve inline (no mapper yet)
        before = dev.creators.count(engine)
        bpp = kv.geometry.page_size // kv.geometry.block_bytes
        held = []
        for _ in range(12):
            ids = kv.alloc(bpp)
            assert ids is not None
            held.append(ids)
            assert mapper.wait_filled()  # the engine's next request finds the reserve full
        assert dev.creators.count(engine) == before  # no map on the engine thread
        assert mapper.maps_on_thread == 12  # one page per page taken
        for ids in held:
            kv.free(ids)
        kv.check_invariants()
    finally:
        mapper.stop()
        kv.close()
    assert not mapper.running and mapper.error is None
    assert not dev.mappings and not dev.allocations


def test_both_threads_at_once_keep_the_pool_consistent():
    """The engine thread allocates and frees at random while the (slow) mapper refills."""
    dev = RecordingSim(delay_s=0.0002, capacity=1 << 30)
    kv = _pool(dev, min_reserved=4, pages=64)
    mapper = BackgroundMapper(kv)
    rng = random.Random(7)
    held: list[list[int]] = []
    try:
        for _ in range(600):
            if held and (rng.random() < 0.45 or len(held) > 40):
                kv.free(held.pop(rng.randrange(len(held))))
            else:
                ids = kv.alloc(rng.randint(1, 150))
                if ids is not None:  # a miss is allowed: the pool has 64 pages
                    held.append(ids)
            if rng.random() < 0.05:
                kv.check_invariants()
        kv.check_invariants()
        assert mapper.maps_on_thread > 0 and mapper.error is None
        all_ids = [b for ids in held for b in ids]
        assert len(all_ids) == len(set(all_ids)) == kv.used_blocks
    finally:
        mapper.stop()
        for ids in held:
            kv.free(ids)
        kv.check_invariants()
        kv.close()
    assert not dev.mappings and not dev.allocations


def test_stop_returns_refill_to_the_allocation():
    dev = RecordingSim(capacity=1 << 30)
    kv = _pool(dev)
    mapper = BackgroundMapper(kv)
    assert mapper.wait_filled()
    mapper.stop()
    assert kv.pages.refill_hook is None and not mapper.running
    bpp = kv.geometry.page_size // kv.geometry.block_bytes
    n = dev.creators.count(threading.get_ident())
    kv.alloc(bpp)  # the reserve drops below 3: refilled inline again
    assert dev.creators.count(threading.get_ident()) == n + 1
    kv.close()


def test_kvstore_runs_a_mapper_on_the_host_device():
    cfg = get_config("tiny")
    spec = KVSpec(backend="vmm", kv_bytes=64 << 20, min_reserved_pages=2, background_mapper=True)
    store = KVStore(cfg, spec, "cpu", pool_device=HostDevice(capacity=1 << 30))
    try:
        assert isinstance(store.manager, LockedKVCacheManager)
        assert store.mapper is not None and store.mapper.wait_filled()
        assert len(store.manager.pages.reserved) == 2
        ids = store.manager.alloc(3)
        store.k[0][ids[0]].fill_(1.0)  # a mapped page, readable and writable
        assert float(store.k[0][ids[0]].sum()) == store.k[0][ids[0]].numel()
        store.manager.free(ids)
    finally:
        store.close()
    assert not store.mapper.running


def test_a_mapper_needs_a_reserve():
    with pytest.raises(ConfigError, match="min_reserved_pages"):
        KVSpec(backend="vmm", background_mapper=True, min_reserved_pages=0)
