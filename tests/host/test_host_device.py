"""HostDevice: the Device contract on Linux virtual memory, residency, and the core on top of it."""

from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.core.device import Device, FaultyDevice
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import DeviceError
from workbench.host.device import HostDevice, meminfo, rss_shmem
from workbench.sim.device import SimDevice
from workbench.units import MiB


@pytest.fixture
def host():
    dev = HostDevice(capacity=256 * MiB)
    yield dev
    dev.close()


def test_is_a_device(host):
    assert isinstance(host, Device)
    assert host.mem_info() == (256 * MiB, 256 * MiB)


def test_reserve_is_aligned_and_reads_zero(host):
    va = host.reserve(8 * MiB)
    assert va % (2 * MiB) == 0
    arr = host.ndarray(va, 8 * MiB)
    assert not arr.any()  # the zero page shows through an unmapped range


def test_map_write_unmap_zero_again_and_rss(host):
    va = host.reserve(8 * MiB)
    before = rss_shmem()
    h = host.create(4 * MiB)
    assert host.mem_info().free == 252 * MiB
    host.map(va, 4 * MiB, h)
    host.set_access(va, 4 * MiB)
    mapped = rss_shmem()
    assert mapped - before >= 4 * MiB - 64 * 1024  # populated on map: resident now
    arr = host.ndarray(va, 4 * MiB)
    arr[:] = 7
    host.unmap(va, 4 * MiB)
    assert rss_shmem() - before < 64 * 1024  # residency falls with the unmap
    assert not host.ndarray(va, 4 * MiB).any()  # zero page back
    # remap the same handle: data survives (memfd holds it) until release
    host.map(va, 4 * MiB, h)
    assert (host.ndarray(va, 4 * MiB) == 7).all()
    host.unmap(va, 4 * MiB)
    host.release(h)
    assert host.mem_info().free == 256 * MiB


def test_release_returns_shmem_to_the_system():
    dev = HostDevice()  # uncapped: mem_info is the machine's
    shmem0 = meminfo()["Shmem"]
    hs = [dev.create(16 * MiB) for _ in range(4)]  # fallocate commits 64 MiB now
    grown = meminfo()["Shmem"] - shmem0
    for h in hs:
        dev.release(h)
    shrunk = meminfo()["Shmem"] - shmem0
    dev.close()
    # other processes may move Shmem a little; our 64 MiB must dominate both readings
    assert grown >= 60 * MiB
    assert shrunk < 8 * MiB


@pytest.mark.parametrize("bad", [
    lambda d, va, h: d.map(va, 2 * MiB, 999),  # unknown handle
    lambda d, va, h: d.map(va + 64 * MiB, 2 * MiB, h),  # outside the reservation
    lambda d, va, h: d.unmap(va, 2 * MiB),  # nothing mapped
    lambda d, va, h: d.set_access(va, 2 * MiB),  # nothing mapped
    lambda d, va, h: d.release(12345),  # unknown handle
    lambda d, va, h: d.create(3 * MiB),  # not a multiple of the granularity
    lambda d, va, h: d.create(512 * MiB),  # over capacity
    lambda d, va, h: d.unreserve(va, 2 * MiB),  # wrong size
])
def test_refuses_what_a_driver_refuses(host, bad):
    va = host.reserve(4 * MiB)
    h = host.create(2 * MiB)
    with pytest.raises(DeviceError):
        bad(host, va, h)


def test_double_map_and_release_while_mapped(host):
    va = host.reserve(4 * MiB)
    h = host.create(2 * MiB)
    host.map(va, 2 * MiB, h)
    with pytest.raises(DeviceError):
        host.map(va, 2 * MiB, h)
    with pytest.raises(DeviceError):
        host.release(h)
    with pytest.raises(DeviceError):
        host.unreserve(va, 4 * MiB)
    host.unmap(va, 2 * MiB)
    host.release(h)
    host.unreserve(va, 4 * MiB)
    assert not host.reservations


# -- the core on both backends -------------------------------------------------------------------
def _geo(layout=Layout.CONTIGUOUS, num_blocks=4096):
    return KVGeometry(num_layers=2, kv_heads=2, head_dim=32, block_size=16,
                      num_blocks=num_blocks, layout=layout)


def _cfg(layout=Layout.CONTIGUOUS, **kw):
    kw.setdefault("min_reserved_pages", 0)
    kw.setdefault("max_reserved_pages", 0)
    return PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, **kw)


@pytest.fixture(params=["sim", "host"])
def device(request):
    dev = SimDevice("h200", capacity=256 * MiB) if request.param == "sim" \
        else HostDevice(capacity=256 * MiB)
    yield dev
    if request.param == "host":
        dev.close()


@pytest.mark.parametrize("layout", list(Layout))
def test_ledger_alloc_free_maps_and_unmaps(device, layout):
    kv = KVCacheManager(_geo(layout), device, config=_cfg(layout))
    geo = kv.geometry
    bpp = geo.page_size // geo.block_bytes  # 1024 blocks per page
    assert kv.mapped_bytes == geo.page_id_bytes  # the null block's page
    ids = kv.alloc(bpp + 10)  # spills onto a second page
    assert ids is not None and len(set(ids)) == bpp + 10 and 0 not in ids
    assert kv.mapped_bytes == 2 * geo.page_id_bytes
    assert len(device.mappings) == 2 * geo.maps_per_page
    kv.check_invariants()
    kv.free(ids)
    assert kv.mapped_bytes == geo.page_id_bytes
    assert kv.alloc(geo.num_blocks) is None  # never partial
    kv.check_invariants()
    kv.close()


@pytest.mark.parametrize("op", ["create", "map", "set_access"])
def test_ledger_fault_rollback(device, op):
    layout = Layout.PER_LAYER  # 4 maps per page: the fault lands mid-page
    faulty = FaultyDevice(device)
    kv = KVCacheManager(_geo(layout), faulty, config=_cfg(layout))
    mapped0 = dict(device.mappings)
    faulty.fail_next(op, 3)
    assert kv.alloc(2000) is None  # the second page fails mid-way: whole alloc rolls back
    assert device.mappings == mapped0
    assert kv.used_blocks == 0
    kv.check_invariants()
    ids = kv.alloc(2000)
    assert ids is not None and len(ids) == 2000
    kv.free(ids)
    kv.close()


def test_host_residency_follows_the_ledger():
    dev = HostDevice(capacity=256 * MiB)
    layout = Layout.CONTIGUOUS
    kv = KVCacheManager(_geo(layout), dev, config=_cfg(layout))
    page_id_bytes = kv.geometry.page_id_bytes  # 8 MiB
    base = rss_shmem()
    ids = kv.alloc(3 * 1024)
    assert rss_shmem() - base >= 3 * page_id_bytes - MiB
    kv.free(ids)
    assert rss_shmem() - base < MiB
    kv.close()
    dev.close()
