"""BudgetedDevice over a batching device (CudaDevice on the fake driver): one charge per page
id, a miss answered None, a create the driver refuses mid-page credited back in full; the charge
taken at admission over any order of calls."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.budget_device import BudgetedBatchDevice, budgeted, device_identity
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.gpu import driver as drv
from workbench.gpu.device import CudaDevice
from workbench.gpu.fakedriver import FakeDriver

MiB = 1 << 20
CFG = PoolConfig(gpu_utilization=1.0, prealloc=False, min_reserved_pages=0, max_reserved_pages=0)


def _pool(tmp_path, layout: Layout, budget_pages: int, capacity: int = 1 << 40):
    fake = FakeDriver(capacity=capacity)
    with drv.use_driver(fake):
        inner = CudaDevice(0, zero_page=False, mem_info_ttl_s=0.0, fast_path=False)
    geo = KVGeometry(num_layers=4, kv_heads=8, head_dim=128, block_size=16, num_blocks=64 * 16,
                     layout=layout)
    dev = budgeted(inner, budget_pages * geo.page_id_bytes, shm_dir=tmp_path)
    cfg = replace(CFG, contiguous_layout=layout is Layout.CONTIGUOUS)
    return fake, dev, KVCacheManager(geo, dev, name="p", config=cfg, reserve_null_block=False)


def _fill(kv) -> list[list[int]]:
    bpp = kv.geometry.blocks_per_page(0)
    got = []
    while (ids := kv.alloc(bpp)) is not None:
        got.append(ids)
    return got


@pytest.mark.parametrize("layout", list(Layout))
def test_a_batching_device_is_charged_once_per_page_id_and_misses_clean(tmp_path, layout):
    fake, dev, kv = _pool(tmp_path, layout, budget_pages=5)
    assert isinstance(dev, BudgetedBatchDevice) and device_identity(dev) == "cuda-0"
    got = _fill(kv)
    page_id = kv.geometry.page_id_bytes
    assert kv.pages.mapped_pages == 5 and dev.budget.state().held == 5 * page_id == fake.used
    for ids in got:
        kv.free(ids)
    assert dev.budget.state().holders == {} and fake.used == 0
    kv.close()


def test_a_driver_refusal_mid_page_credits_the_whole_page_back(tmp_path):
    geo_pages = 3
    fake, dev, kv = _pool(tmp_path, Layout.PER_LAYER, budget_pages=10,
                          capacity=geo_pages * 8 * 2 * MiB + 3 * 2 * MiB)  # 3 page ids + a bit
    assert kv.geometry.maps_per_page == 8 and kv.geometry.page_id_bytes == 8 * 2 * MiB
    got = _fill(kv)
    assert fake.calls > 0 and not fake.allocs.keys() - dev.sizes.keys()
    assert kv.pages.mapped_pages == geo_pages  # the fourth failed in the driver, undone
    assert dev.budget.state().held == fake.used == geo_pages * kv.geometry.page_id_bytes
    for ids in got:
        kv.free(ids)
    assert dev.budget.state().holders == {}
    kv.close()


def test_a_gpu_is_named_by_its_uuid_when_the_driver_tells(tmp_path):
    """Two processes that see one GPU under different indices share one budget."""
    from types import SimpleNamespace

    class UuidDriver(FakeDriver):
        def cuDeviceGetUuid_v2(self, dev):
            return 0, SimpleNamespace(bytes=bytes(range(16)))

    with drv.use_driver(UuidDriver()):
        inner = CudaDevice(0, zero_page=False, fast_path=False)
    assert device_identity(inner) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    dev = budgeted(inner, 64 * MiB, shm_dir=tmp_path)
    assert dev.budget.path.name == "wbkvbudget_GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


def test_a_dead_holders_bytes_do_not_hide_the_headroom_a_charge_reclaims(tmp_path):
    """A process that died holding pages: its bytes are not counted in the device's free
    memory, so the pool still tries the charge, and that charge reclaims the dead slot."""
    import os

    from workbench.core import budget_segment as bs

    fake, dev, kv = _pool(tmp_path, Layout.CONTIGUOUS, budget_pages=4)
    with drv.use_driver(fake):
        page = kv.geometry.page_id_bytes
        dead = bs.SharedBudget.open(dev.budget.path.name.removeprefix("wbkvbudget_"), None,
                                    shm_dir=tmp_path)
        dead.me = (os.getpid(), dead.me[1] + 1)  # this pid, another start: a holder now gone
        assert dead.charge(4 * page)
        assert dev.budget.state().held == 4 * page  # the file still counts it ...
        assert dev.mem_info().free >= 4 * page  # ... the headroom check does not
        got = _fill(kv)
        assert len(got) == 4, "the pool mapped the dead holder's pages"
        assert dev.budget.reclaimed == 4 * page
        assert dev.budget.state().held == 4 * page  # now all this process's
    dead.close()


# -- the charge taken at admission: prepay, pages created and released, refund --------------------
PAGE = 2 * MiB
TOTAL_PAGES = 6


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["prepay", "create", "release", "refund"]),
                              st.integers(0, TOTAL_PAGES + 1)), max_size=30))
def test_admission_charges_never_pass_the_total_and_all_come_back(tmp_path_factory, ops):
    """Whatever the order: the budget holds exactly the live pages plus what is prepaid, never
    more than its total; a prepay is all or nothing and sets the hold; a page created draws
    from the hold first; a page released while a hold is open keeps its charge for it; a
    refund gives every unbacked byte back and closes the hold."""
    dev = budgeted(make_device("host"), TOTAL_PAGES * PAGE, shm_dir=tmp_path_factory.mktemp("b"))
    live: list[int] = []
    for op, n in ops:
        held_before, prepaid_before = dev.budget.totals()[1], dev.prepaid
        if op == "prepay":
            ok = dev.prepay(n * PAGE)
            room = TOTAL_PAGES * PAGE - held_before + prepaid_before
            assert ok == (n * PAGE <= room)
            assert dev.prepaid == (n * PAGE if ok else prepaid_before)
            assert dev.admitting or not ok
        elif op == "create":
            try:
                live.append(dev.create(PAGE))
            except Exception:  # noqa: BLE001 - a miss past the total: nothing taken
                assert dev.budget.totals()[1] == held_before and dev.prepaid == prepaid_before
        elif op == "release" and live:
            holding = dev.admitting
            dev.release(live.pop(n % len(live)))
            assert dev.prepaid == prepaid_before + (PAGE if holding else 0)
        elif op == "refund":
            dev.refund()
            assert dev.prepaid == 0 and not dev.admitting
        held = dev.budget.totals()[1]
        assert held == len(live) * PAGE + dev.prepaid <= TOTAL_PAGES * PAGE
    for h in live:
        dev.release(h)
    dev.refund()
    assert dev.budget.totals()[1] == 0
