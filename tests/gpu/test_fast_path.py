"""CudaDevice's batched fast path, on a CPU: the instant fake driver stands in for cuda.bindings.

The batch (one Python call per page id) must leave exactly the state, events and errors the
separate calls leave, including when the driver fails part-way through a page id.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.bench.difftrace import random_trace, run_both
from workbench.config import PoolConfig
from workbench.core.device import FaultyDevice
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import DeviceError
from workbench.gpu import driver as drv
from workbench.gpu.device import CudaDevice
from workbench.gpu.fakedriver import OUT_OF_MEMORY, FakeDriver
from workbench.sim.device import SimDevice

from .scenario import run_sizes

CALLS = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease")


class FailingDriver(FakeDriver):
    """Fails the listed calls (``{"cuMemMap": {3}}``: the third cuMemMap counted from ``arm()``)
    with an error code."""

    def __init__(self, plan: dict[str, set[int]]):
        super().__init__()
        self.plan, self.seen = plan, dict.fromkeys(CALLS, 0)
        self.armed = False
        for name in CALLS:
            setattr(self, name, self._wrap(name, getattr(FakeDriver, name).__get__(self)))

    def _wrap(self, name, fn):
        def call(*args):
            self.seen[name] += 1
            if self.armed and self.seen[name] in self.plan.get(name, ()):
                return (OUT_OF_MEMORY, None) if name == "cuMemCreate" else (OUT_OF_MEMORY,)
            return fn(*args)
        return call

    def arm(self) -> None:
        self.seen, self.armed = dict.fromkeys(CALLS, 0), True


def _pool(dev, layout: Layout) -> KVCacheManager:
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=640,
                     layout=layout)
    cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, min_reserved_pages=1,
                     max_reserved_pages=2)
    return KVCacheManager(geo, dev, name="p", config=cfg)


def _run(dev, layout: Layout, sizes: list[int]) -> tuple[list, list, int, int]:
    """Alloc and free blocks in ``sizes`` order (negative: free the oldest); the outcome."""
    kv = _pool(dev, layout)
    cu = getattr(getattr(dev, "inner", dev), "_cu", None)
    if isinstance(cu, FailingDriver):  # the pool's null block is backed: now fail
        cu.arm()
    outcome, _ = run_sizes(kv, sizes)
    return outcome, kv.events.keys(), len(dev.mappings), len(dev._alloc) if hasattr(
        dev, "_alloc") else len(dev.allocations)


def _cuda(fake: FakeDriver, zero: bool, faulty: bool = False):
    with drv.use_driver(fake):
        dev = CudaDevice(0, zero_page=zero, mem_info_ttl_s=0.0)
    return FaultyDevice(dev) if faulty else dev


def test_the_batch_is_used_only_where_the_class_has_it():
    dev = _cuda(FakeDriver(), zero=True)
    assert _pool(dev, Layout.PER_LAYER).space._batch is dev
    assert _pool(FaultyDevice(dev), Layout.PER_LAYER).space._batch is None  # faults see calls
    assert _pool(SimDevice(), Layout.PER_LAYER).space._batch is None


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(list(Layout)), st.booleans(),
       st.lists(st.integers(-2, 200), min_size=1, max_size=25))
def test_batch_and_separate_calls_agree(layout, zero, sizes):
    a = _run(_cuda(FakeDriver(), zero), layout, sizes)
    b = _run(_cuda(FakeDriver(), zero, faulty=True), layout, sizes)  # per-call path
    c = _run(SimDevice(capacity=1 << 30), layout, sizes)
    assert a == b
    assert a[:2] == c[:2]  # the simulator's events too


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_a_driver_failure_mid_page_leaves_what_the_separate_calls_leave(layout, zero, call, nth):
    sizes = [64, 64, -1, 128, -1, -1, 100, 30, -1, -1]
    fakes = FailingDriver({call: {nth}}), FailingDriver({call: {nth}})
    got = _run(_cuda(fakes[0], zero), layout, sizes)
    want = _run(_cuda(fakes[1], zero, faulty=True), layout, sizes)
    assert got == want
    assert fakes[0].seen == fakes[1].seen and fakes[0].seen[call] >= nth  # the failure happened
    if not zero:  # (the zero page retries a refused multi-piece unmap piece by piece)
        assert got[1] != _run(_cuda(FakeDriver(), zero), layout, sizes)[1]  # it shows


def test_partial_progress_is_on_the_error():
    fake = FailingDriver({"cuMemSetAccess": {2}})
    dev = _cuda(fake, zero=False)
    g = dev.granularity
    va = dev.reserve(4 * g)
    fake.arm()
    with pytest.raises(DeviceError, match="set_access") as err:
        dev.map_targets([(va, g), (va + g, g), (va + 2 * g, g)])
    created, mapped = err.value.partial
    assert len(created) == 2 and mapped == 2  # the second target was mapped, its access failed
    assert sorted(dev.mappings) == [va, va + g]
    with pytest.raises(DeviceError, match="not mapped") as err:
        dev.unmap_targets([(va, g), (va + 3 * g, g)])
    assert err.value.partial == 1 and sorted(dev.mappings) == [va + g]
    dev.unmap_targets([(va + g, g)])
    with pytest.raises(DeviceError, match="unknown handle") as err:
        dev.release_handles([created[0], 999_999])
    assert err.value.partial == 1 and list(dev._alloc) == [created[1]]


@pytest.mark.parametrize("seed", range(12))
def test_differential_traces_agree_on_the_fake_driver(seed):
    fake = FakeDriver()

    def make_cuda(**kw):
        with drv.use_driver(fake):
            return CudaDevice(0, **{k: v for k, v in kw.items()
                                    if k not in ("preset", "capacity", "env")})

    r = run_both(random_trace(seed), lambda **kw: SimDevice(**kw), make_cuda, seed=seed,
                 cleanup=lambda d: d.close() if isinstance(d, CudaDevice) else None)
    assert r.equal, r.explain()
    assert fake.used == 0 and not fake.maps  # every trace gave its memory back


def test_use_driver_restores_the_previous_driver():
    before = drv._driver
    with drv.use_driver(FakeDriver()) as fake:
        assert drv.driver() is fake
    assert drv._driver is before
